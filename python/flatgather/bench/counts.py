"""What one call costs that a clock does not show: the aten ops it
dispatches and the host syncs it makes. The bench's rows and the tests'
"does not grow with the batch" checks count with these.

A **host sync** is a call after which, on a GPU, the host waits for the
device (:class:`HostSyncs` counts each kind by name):

* ``tolist`` and ``item``: ``Tensor.tolist()`` and ``Tensor.item()``, which
  read a tensor's values on the host;
* ``tensor`` and ``as_tensor``: ``torch.tensor(data, device=d)`` and
  ``torch.as_tensor(data, device=d)`` of host data (anything but a tensor)
  with a device given: on a GPU a blocking host-to-device copy, which waits
  for the stream. They count on a CPU run too, where ``d`` (the code's
  ``x.device``) is the CPU, as ``tolist`` does: the call is the one a server
  makes with ``d`` its GPU. A device given as the string ``"cpu"`` is the
  host by intent and does not count;
* ``to``, ``cuda``, ``cpu`` and ``copy_``: a copy of a tensor between the
  host and a device without ``non_blocking=True``. These count only where
  the run has a device: on a CPU run nothing crosses.

Not counted: a non-blocking copy (from pinned memory it does not wait;
from pageable memory it waits only for the host's staging), an explicit
``synchronize()`` of a stream or event, and a tensor read as a Python
scalar by ``bool()``, ``int()`` or ``float()``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCS = ("tolist", "item")
"""The tensor methods that read a tensor's values on the host."""
COPIES = ("to", "cuda", "cpu", "copy_")
"""The tensor methods that copy between the host and a device."""
CONSTRUCTORS = ("tensor", "as_tensor")
"""The ``torch`` functions that make a tensor of host data on a device."""


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


def _is_host(device) -> bool:
    return torch.device(device).type == "cpu"


def _copy(name: str, tensor: torch.Tensor, args, kwargs) -> tuple[object, object, bool] | None:
    """``(from, to, non_blocking)`` of the copy a call of the tensor method
    ``name`` makes, or None where it copies nothing anywhere."""
    if name == "cpu":
        return tensor.device, "cpu", False
    if name == "cuda":
        device = args[0] if args else kwargs.get("device")
        if device is None:
            device = "cuda"
        elif isinstance(device, int):
            device = torch.device("cuda", device)
        return tensor.device, device, bool(kwargs.get("non_blocking", args[1:2] and args[1]))
    if name == "copy_":
        src = args[0] if args else kwargs.get("src")
        if not isinstance(src, torch.Tensor):
            return None
        return src.device, tensor.device, bool(kwargs.get("non_blocking", args[1:2] and args[1]))
    try:
        device, _, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
    except Exception:  # the call itself raises, as it does uncounted
        return None
    return (tensor.device, device, bool(non_blocking)) if device is not None else None


def _host_data_on_a_device(args, kwargs) -> bool:
    """Whether ``torch.tensor`` or ``torch.as_tensor`` (whose device is a
    keyword) is given host data and a device other than the string "cpu"."""
    data = args[0] if args else kwargs.get("data")
    device = kwargs.get("device")
    if isinstance(data, torch.Tensor) or device is None:
        return False
    return not (isinstance(device, str) and device.split(":")[0] == "cpu")


class HostSyncs:
    """The host syncs made inside it (see the module's docstring), by kind
    (``calls``: ``tolist``, ``item``, ``tensor``, ``as_tensor``, ``to``,
    ``cuda``, ``cpu``, ``copy_``); ``total`` is their sum."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._saved: list[tuple[object, str, object]] = []

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def _patch(self, owner, name: str, replacement) -> None:
        # Put back exactly what was there: inherited methods are not set on
        # torch.Tensor itself.
        self._saved.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, replacement)

    def __enter__(self) -> HostSyncs:
        for name in SYNCS:
            self._patch(torch.Tensor, name, self._reads(name, getattr(torch.Tensor, name)))
        for name in COPIES:
            self._patch(torch.Tensor, name, self._copies(name, getattr(torch.Tensor, name)))
        for name in CONSTRUCTORS:
            self._patch(torch, name, self._constructs(name, getattr(torch, name)))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, saved in reversed(self._saved):
            if saved is None:
                delattr(owner, name)
            else:
                setattr(owner, name, saved)
        self._saved.clear()

    def _reads(self, name: str, original):
        def counted(tensor, *args, **kwargs):
            self.calls[name] += 1
            return original(tensor, *args, **kwargs)

        return counted

    def _copies(self, name: str, original):
        def counted(tensor, *args, **kwargs):
            copy = _copy(name, tensor, args, kwargs)
            if copy is not None:
                source, target, non_blocking = copy
                if _is_host(source) != _is_host(target) and not non_blocking:
                    self.calls[name] += 1
            return original(tensor, *args, **kwargs)

        return counted

    def _constructs(self, name: str, original):
        def counted(*args, **kwargs):
            if _host_data_on_a_device(args, kwargs):
                self.calls[name] += 1
            return original(*args, **kwargs)

        return counted


def aten_ops(fn: Callable[[], object]) -> int:
    """Aten operations one call dispatches, views not counted."""
    with AtenOps() as ops:
        fn()
    return len(ops.names)


def host_syncs(fn: Callable[[], object]) -> int:
    """The host syncs one call makes (see the module's docstring)."""
    with HostSyncs() as syncs:
        fn()
    return syncs.total
