"""Index data on its way to the device: one buffer, one copy.

On a CUDA device the plan is written into a pinned host buffer and copied
with ``non_blocking=True``. The host buffers are reused, so each one carries
a CUDA event recorded right after its copy was queued; a buffer is written
again only once that event has completed, i.e. once the device has read it.
With several buffers in rotation that wait is almost never felt. Buffers are
per thread, so concurrent callers never share one.

On the CPU there is no copy: the plan is written into a fresh array whose
tensors are handed to the caller, so nothing is ever rewritten under them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

Fill = Callable[[np.ndarray], None]

_SLOTS = 4
_MIN_CAPACITY = 4096


class _PinnedSlot:
    __slots__ = ("array", "event", "host")

    def __init__(self) -> None:
        self.host: torch.Tensor | None = None
        self.array: np.ndarray | None = None
        self.event: torch.cuda.Event | None = None

    def acquire(self, n: int) -> np.ndarray:
        if self.event is not None:
            # The device may still be reading this buffer from an earlier copy.
            self.event.synchronize()
        if self.array is None or self.array.shape[0] < n:
            capacity = max(_MIN_CAPACITY, 1 << (n - 1).bit_length())
            self.host = torch.empty(capacity, dtype=torch.int64, pin_memory=True)
            self.array = self.host.numpy()
        return self.array[:n]


class _DeviceStager:
    """The pinned buffers of one thread for one CUDA device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.slots = [_PinnedSlot() for _ in range(_SLOTS)]
        self.next = 0

    def upload(self, n: int, fill: Fill) -> torch.Tensor:
        slot = self.slots[self.next]
        self.next = (self.next + 1) % _SLOTS
        host = slot.acquire(n)
        fill(host)
        # from_numpy keeps the copy to one aten op; the memory is still the
        # pinned block, so the copy is truly asynchronous.
        dev = torch.from_numpy(host).to(self.device, non_blocking=True)
        if slot.event is None:
            slot.event = torch.cuda.Event()
        slot.event.record(torch.cuda.current_stream(self.device))
        return dev


_local = threading.local()


def stage(n: int, fill: Fill, device: torch.device) -> torch.Tensor:
    """``n`` int64 values, written on the host by ``fill(array)``, as one
    tensor on ``device``: written once, copied at most once."""
    if device.type != "cuda":
        host = np.empty(n, dtype=np.int64)
        fill(host)
        out = torch.from_numpy(host)
        return out if device.type == "cpu" else out.to(device)
    stagers = getattr(_local, "stagers", None)
    if stagers is None:
        stagers = _local.stagers = {}
    index = device.index if device.index is not None else torch.cuda.current_device()
    stager = stagers.get(index)
    if stager is None:
        stager = stagers[index] = _DeviceStager(torch.device("cuda", index))
    return stager.upload(n, fill)
