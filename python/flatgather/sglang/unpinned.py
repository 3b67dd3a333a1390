"""The release's own code on a host without CUDA: with pinning off where it
pins whatever the host.

0.5.12 pins its index tensors unconditionally, so its own
``_get_pruned_states`` cannot run on a machine without CUDA. The probe, the
tests and the bench run it under :class:`Unpinned`, which turns every
``pin_memory=True`` off: pinning changes no value.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["Unpinned", "first_run", "unpinned_without_cuda", "within"]

T = TypeVar("T")


class Unpinned(TorchFunctionMode):
    """Every torch call made inside it with ``pin_memory=True`` runs with
    ``pin_memory=False``; ``hits`` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}
            self.hits += 1
        return func(*args, **kwargs)


def within(mode: Unpinned | None) -> AbstractContextManager:
    """``mode`` as a context, or nothing."""
    return nullcontext() if mode is None else mode


def first_run(run: Callable[[Unpinned | None], T]) -> tuple[T, Unpinned | None]:
    """``run(None)``, the release's code as is; or, where that raises a
    RuntimeError on a host without CUDA (perhaps pinned memory, which the
    host cannot give), ``run(Unpinned())`` once more. Returns the result and
    the mode the release's code needs on this host from then on."""
    try:
        return run(None), None
    except RuntimeError:
        if torch.cuda.is_available():
            raise
    mode = Unpinned()
    return run(mode), mode


def unpinned_without_cuda() -> AbstractContextManager:
    """:class:`Unpinned` on a host without CUDA, nothing where pinning works."""
    return nullcontext() if torch.cuda.is_available() else Unpinned()
