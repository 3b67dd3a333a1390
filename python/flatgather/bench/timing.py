"""Timing on the bench's device, and what the sections share.

On the CPU a sample is wall time around ``k`` calls. On a CUDA device the
main figure is device time between two CUDA events around ``k`` calls; the
host time per call (the time the Python thread is busy issuing them, the
queue drained outside the timed region) and the GPU operations per call
(kernels and copies, counted with ``torch.profiler``) come with it. Aten ops
per call (those that are not views) and host syncs per call (the calls after
which, on a GPU, the host waits for the device: ``Tensor.tolist``,
``Tensor.item``, ``torch.tensor`` of host data given a device, blocking
copies between host and device; see :mod:`flatgather.bench.counts`) are
counted on every device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flatgather.bench.counts import aten_ops, host_syncs
from flatgather.bench.sections import Timing
from flatgather.bench.stats import host_clock, measure_side_by_side
from flatgather.sglang.compare import first_difference


def cuda_clock(fn: Callable[[], object], k: int) -> float:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(k):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / k


def cuda_host_clock(fn: Callable[[], object], k: int) -> float:
    """Host seconds per call; the device catches up outside the timing."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(k):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / k


def gpu_ops(fn: Callable[[], object]) -> int | None:
    """Kernels and memory copies/sets one call puts on the GPU (None when
    the profiler cannot say: a torch built without Kineto)."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # warm: no one-off allocation or autotuning in the count
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        events = prof.events()
    except (RuntimeError, AssertionError):
        return None
    return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)


@dataclass
class Timer:
    device: torch.device
    timing: Timing
    seed: int = 0
    calls: list[int] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def measure(self, fns: dict[str, Callable[[], object]], counted: tuple[str, ...]) -> dict:
        """``time`` (and on CUDA ``host_time`` and ``launches``) for every
        variant, and ``aten_ops`` for the ``counted`` ones: the row's
        measured part."""
        t = self.timing
        self.seed += 1
        stats = measure_side_by_side(
            fns,
            samples=t.samples,
            warmup_s=t.warmup_s,
            sample_s=t.sample_s,
            clock=cuda_clock if self.cuda else host_clock,
            seed=self.seed,
        )
        out = {"time": {k: v.to_dict() for k, v in stats.items()}}
        if self.cuda:
            host = measure_side_by_side(
                fns,
                samples=t.samples,
                warmup_s=t.warmup_s,
                sample_s=t.sample_s,
                clock=cuda_host_clock,
                seed=self.seed,
            )
            out["host_time"] = {k: v.to_dict() for k, v in host.items()}
            out["launches"] = {k: gpu_ops(fns[k]) for k in counted if k in fns}
        out["aten_ops"] = {k: aten_ops(fns[k]) for k in counted if k in fns}
        out["syncs"] = {k: host_syncs(fns[k]) for k in counted if k in fns}
        return out

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def same(a, b) -> bool:
    """The same value, by the comparison flatgather's own checks make."""
    return first_difference(a, b) is None


class Mismatch(AssertionError):
    """A variant does not compute what SGLang's own code computes: a bug,
    and nothing is timed."""


@dataclass
class Context:
    """What every section gets."""

    device: torch.device
    size: str
    timer: Timer
    sglang: object
    """:class:`flatgather.bench.run.SGLang`: the release's modules, its
    own functions, and flatgather's installed ones."""
