"""Criterion-style timing: warm-up, calibrated samples, outliers dropped,
median with a bootstrap 95% interval."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

Clock = Callable[[Callable[[], object], int], float]
"""Runs a function ``k`` times and returns the seconds per call."""


def host_clock(fn: Callable[[], object], k: int) -> float:
    start = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - start) / k


@dataclass(frozen=True)
class Stats:
    median: float
    """Seconds per call."""
    low: float
    high: float
    """Bounds of the 95% bootstrap interval of the median."""
    mean: float
    samples: int
    """Samples kept, after outliers were dropped."""
    outliers: int
    iterations: int
    """Calls per sample."""

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(per_call: list[float], iterations: int, rng: np.random.Generator) -> Stats:
    data = np.asarray(per_call)
    q1, q3 = np.percentile(data, [25, 75])
    fence = 1.5 * (q3 - q1)
    kept = data[(data >= q1 - fence) & (data <= q3 + fence)]
    if kept.size == 0:
        kept = data
    boot = np.median(rng.choice(kept, size=(1000, kept.size), replace=True), axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    return Stats(
        median=float(np.median(kept)),
        low=float(low),
        high=float(high),
        mean=float(kept.mean()),
        samples=int(kept.size),
        outliers=int(data.size - kept.size),
        iterations=iterations,
    )


def calibrate(fn: Callable[[], object], clock: Clock, warmup_s: float, sample_s: float) -> int:
    """Warm ``fn`` up for ``warmup_s`` and return the calls per sample that
    make one sample last about ``sample_s``."""
    deadline = time.perf_counter() + warmup_s
    per_call = clock(fn, 1)
    while time.perf_counter() < deadline:
        per_call = min(per_call, clock(fn, 1))
    return max(1, int(sample_s / max(per_call, 1e-9)))


def measure_side_by_side(
    fns: dict[str, Callable[[], object]],
    *,
    samples: int,
    warmup_s: float,
    sample_s: float,
    clock: Clock = host_clock,
    seed: int = 0,
) -> dict[str, Stats]:
    """Time every function on the same inputs, interleaving their samples
    (one sample of each in turn) so that drift of the machine hits all alike."""
    iterations = {name: calibrate(fn, clock, warmup_s, sample_s) for name, fn in fns.items()}
    per_call: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(samples):
        for name, fn in fns.items():
            per_call[name].append(clock(fn, iterations[name]))
    rng = np.random.default_rng(seed)
    return {name: summarize(per_call[name], iterations[name], rng) for name in fns}
