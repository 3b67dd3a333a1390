"""Criterion-style timing: warm-up, calibrated samples taken in interleaved
rounds, outliers dropped, medians with bootstrap 95% intervals, and ratios
computed round by round so that a drift of the machine cancels out.

Standard library and NumPy only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field

import numpy as np

Clock = Callable[[Callable[[], object], int], float]
"""Runs a function ``k`` times and returns the seconds per call."""

BOOTSTRAP = 2000


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
    raw: list[float] = field(default_factory=list)
    """Seconds per call of every sample, in round order (outliers included)."""

    def to_dict(self) -> dict:
        return asdict(self)


def _bootstrap_median(data: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    if data.size == 1:
        return float(data[0]), float(data[0])
    boot = np.median(rng.choice(data, size=(BOOTSTRAP, data.size), replace=True), axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(low), float(high)


def summarize(per_call: list[float], iterations: int, rng: np.random.Generator) -> Stats:
    data = np.asarray(per_call, dtype=np.float64)
    q1, q3 = np.percentile(data, [25, 75])
    fence = 1.5 * (q3 - q1)
    kept = data[(data >= q1 - fence) & (data <= q3 + fence)]
    if kept.size == 0:
        kept = data
    low, high = _bootstrap_median(kept, rng)
    return Stats(
        median=float(np.median(kept)),
        low=low,
        high=high,
        mean=float(kept.mean()),
        samples=int(kept.size),
        outliers=int(data.size - kept.size),
        iterations=iterations,
        raw=[float(x) for x in data],
    )


def ratio(num: dict, den: dict, seed: int = 0) -> dict:
    """``num / den`` from two :class:`Stats` dicts measured in the same
    rounds: the median of the per-round ratios, with a bootstrap 95%
    interval. Rounds pair samples taken moments apart, so load that comes
    and goes hits both sides of each ratio."""
    a, b = np.asarray(num["raw"], dtype=np.float64), np.asarray(den["raw"], dtype=np.float64)
    if a.size == 0 or a.size != b.size:
        # Not measured in the same rounds: the ratio of medians, with the
        # widest interval the two intervals allow.
        return {
            "median": num["median"] / den["median"],
            "low": num["low"] / den["high"],
            "high": num["high"] / den["low"],
        }
    per_round = a / b
    low, high = _bootstrap_median(per_round, np.random.default_rng(seed))
    return {"median": float(np.median(per_round)), "low": low, "high": high}


def spans_one(r: dict) -> bool:
    """The interval holds 1.0: this run cannot tell which side is faster."""
    return r["low"] <= 1.0 <= r["high"]


@dataclass(frozen=True)
class Scoped:
    """``fn``, to run inside ``scope()`` (a context manager factory): a call
    enters the scope around ``fn``; a timed sample enters it once around all
    of its calls, so that what the scope costs is not timed."""

    fn: Callable[[], object]
    scope: Callable[[], AbstractContextManager]

    def __call__(self) -> object:
        with self.scope():
            return self.fn()


def _sample(clock: Clock, fn: Callable[[], object], k: int) -> float:
    """``clock(fn, k)``, a :class:`Scoped` function inside its scope."""
    if isinstance(fn, Scoped):
        with fn.scope():
            return clock(fn.fn, k)
    return clock(fn, k)


def calibrate(fn: Callable[[], object], clock: Clock, warmup_s: float, sample_s: float) -> int:
    """Warm ``fn`` up for ``warmup_s`` and return the calls per sample that
    make one sample last about ``sample_s``."""
    deadline = time.perf_counter() + warmup_s
    per_call = _sample(clock, fn, 1)
    while time.perf_counter() < deadline:
        per_call = min(per_call, _sample(clock, fn, 1))
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
    """Time every function on the same inputs in ``samples`` rounds, one
    sample of each per round, the order rotating from round to round so that
    no function always runs first (after a cold cache) or last."""
    iterations = {name: calibrate(fn, clock, warmup_s, sample_s) for name, fn in fns.items()}
    names = list(fns)
    per_call: dict[str, list[float]] = {name: [] for name in names}
    for r in range(samples):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            per_call[name].append(_sample(clock, fns[name], iterations[name]))
    rng = np.random.default_rng(seed)
    return {name: summarize(per_call[name], iterations[name], rng) for name in names}
