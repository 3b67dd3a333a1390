"""The release's code against another side (flatgather's, or a floor), timed
side by side in one process: what ``benches/front_end.py``,
``benches/openai_logprobs.py`` and ``benches/wire.py`` share. Each shape is
measured with the samples interleaved and the order rotating
(:func:`flatgather.bench.stats.measure_side_by_side`), the machine's load
recorded around it; the table gives the release's time over the other
side's, the median of the per-round ratios with its bootstrap 95% interval,
and the run warns when other processes kept the machine busy."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def arguments(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The scripts' shared command line (``--samples``, ``--sample-s``),
    parsed; torch is pinned to one thread before anything is timed."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--sample-s", type=float, default=0.05)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    return args


class SideBySide:
    def __init__(self, samples: int, sample_s: float) -> None:
        from flatgather.bench import machine

        self.samples, self.sample_s = samples, sample_s
        self.rows: list[tuple[str, float, float, dict]] = []
        self.load = {"cpus": machine.cpus(), "threads": 1, "sections": {}}

    def measure(self, name: str, release: Callable, flatgather: Callable) -> None:
        """Time one shape: ``release()`` against ``flatgather()``."""
        from flatgather.bench import machine, stats

        before = machine.snapshot()
        measured = stats.measure_side_by_side(
            {"release": release, "flatgather": flatgather},
            samples=self.samples,
            warmup_s=0.2,
            sample_s=self.sample_s,
        )
        self.load["sections"][name] = machine.usage(before, machine.snapshot()).to_dict()
        ratio = stats.ratio(vars(measured["release"]), vars(measured["flatgather"]))
        self.rows.append((name, measured["release"].median, measured["flatgather"].median, ratio))

    def report(
        self, what: str, per: int = 1, names: tuple[str, str] = ("release", "flatgather")
    ) -> None:
        """The table, its first column headed ``what``, then the warnings;
        the times divided by ``per``, the two sides named ``names``."""
        from flatgather.bench import machine

        one, two = names
        print(f"\n| {what} | {one} | {two} | {one} / {two} (95%) |")
        print("|---|---|---|---|")
        for name, a, b, r in self.rows:
            print(
                f"| {name} | {a * 1e3 / per:.3f} ms | {b * 1e3 / per:.3f} ms | "
                f"{r['median']:.2f}x ({r['low']:.2f}-{r['high']:.2f}) |"
            )
        for warning in machine.judge(self.load, machine.DEFAULT_MAX_OTHER_LOAD):
            print(f"\nWarning: {warning}")
