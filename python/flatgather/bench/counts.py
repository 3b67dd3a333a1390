"""What one call costs that a clock does not show: the aten ops it
dispatches and the host syncs it makes (``Tensor.tolist`` and
``Tensor.item``: on a GPU each waits for the device). The bench's rows and
the tests' "does not grow with the batch" checks count with these."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCS = ("tolist", "item")


class AtenOps(TorchDispatchMode):
    """The aten ops dispatched inside it, by name, in order (``names``).
    Views are left out unless ``views=True``: they launch nothing."""

    def __init__(self, views: bool = False) -> None:
        super().__init__()
        self.views = views
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.views or not func.is_view:
            self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class HostSyncs:
    """The ``Tensor.tolist`` and ``Tensor.item`` calls made inside it, by
    method name (``calls``); ``total`` is their sum."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._saved: dict[str, object] = {}

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def __enter__(self) -> HostSyncs:
        for name in SYNCS:
            self._saved[name] = vars(torch.Tensor).get(name)
            setattr(torch.Tensor, name, self._counting(name, getattr(torch.Tensor, name)))
        return self

    def __exit__(self, *exc) -> None:
        for name, saved in self._saved.items():
            # Put back exactly what was there: inherited methods are not set
            # on torch.Tensor itself.
            if saved is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, saved)
        self._saved.clear()

    def _counting(self, name: str, original):
        def counted(tensor, *args, **kwargs):
            self.calls[name] += 1
            return original(tensor, *args, **kwargs)

        return counted


def aten_ops(fn: Callable[[], object]) -> int:
    """Aten operations one call dispatches, views not counted."""
    with AtenOps() as ops:
        fn()
    return len(ops.names)


def host_syncs(fn: Callable[[], object]) -> int:
    """``Tensor.tolist`` and ``Tensor.item`` calls one call makes."""
    with HostSyncs() as syncs:
        fn()
    return syncs.total
