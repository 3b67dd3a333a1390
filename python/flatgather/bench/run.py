"""``flatgather bench``: the prefill step of the SGLang release under test,
its own code against flatgather's, side by side in one run.

Sections (``--section``, repeatable; all by default) are listed in
:mod:`flatgather.bench.sections`. torch is pinned to ``--threads`` threads
(default 1), the load of the machine is watched while each section runs,
and the report warns when a figure may not be trusted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

from flatgather import _sglang_dirs
from flatgather.bench import machine, sections

SCHEMA = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from flatgather.cli import prog

    parser = argparse.ArgumentParser(
        prog=f"{prog()} bench",
        description=(
            "Time the prefill step of the SGLang release under test: its own code against "
            "flatgather installed, side by side on the same tensors, samples interleaved. "
            f"Sections: {', '.join(sections.SECTIONS)}."
        ),
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a few shapes per section (seconds)")
    size.add_argument("--full", action="store_true", help="the whole grid (many minutes)")
    parser.add_argument(
        "--section",
        action="append",
        choices=list(sections.SECTIONS),
        metavar="NAME",
        help=f"run this section only (repeatable): {', '.join(sections.SECTIONS)}",
    )
    parser.add_argument(
        "--sglang",
        metavar="VERSION|DIR",
        help="measure this release, installed side by side by .ci/setup (e.g. 0.5.23), "
        f"or the SGLang in DIR; default: the SGLang installed in the environment. "
        f"${_sglang_dirs.DIR_ENV} names another directory of releases",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch threads (default 1: a bench that keeps to one core cannot be "
        "oversubscribed by its own threads)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument(
        "--samples", type=int, metavar="N", help="rounds per measurement (grid default)"
    )
    parser.add_argument(
        "--json", type=Path, metavar="FILE", help="write every figure here (for `report`)"
    )
    parser.add_argument("--markdown", type=Path, metavar="FILE", help="write a Markdown report")
    parser.add_argument(
        "--plot", type=Path, metavar="FILE", help="write a PNG: speed-up against batch size"
    )
    parser.add_argument(
        "--max-other-load",
        type=float,
        default=machine.DEFAULT_MAX_OTHER_LOAD,
        metavar="CORES",
        help="warn when other processes keep more than this many cores busy on average "
        f"while a section runs (default {machine.DEFAULT_MAX_OTHER_LOAD})",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    return parser.parse_args(argv)


class Progress:
    """One line per step on stderr, redrawn in place on a terminal, with the
    time spent and an estimate of the time left."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.done, self.started = total, 0, time.perf_counter()
        self.quiet = quiet or total == 0
        self.tty = sys.stderr.isatty()

    def step(self, section: str, label: str) -> None:
        self.done += 1
        if self.quiet:
            return
        elapsed = time.perf_counter() - self.started
        left = elapsed / self.done * (self.total - self.done)
        line = f"[{self.done}/{self.total}] {elapsed:5.0f}s, ~{left:.0f}s left  {section}: {label}"
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(150))
            if self.done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def say(self, text: str) -> None:
        if not self.quiet:
            lead = "\n" if self.tty and 0 < self.done < self.total else ""
            sys.stderr.write(lead + text + "\n")
            sys.stderr.flush()


def versions(release: str | None) -> dict:
    import numpy as np
    import torch

    import flatgather

    return {
        "flatgather": flatgather.__version__,
        "sglang": release,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def machine_record(device) -> dict:
    import torch

    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": machine.cpus(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def add_ratios(section: sections.Section, row: dict) -> None:
    from flatgather.bench.stats import ratio

    if "time" not in row:
        return
    row["ratios"] = {
        r.key: ratio(row["time"][r.num], row["time"][r.den])
        for r in section.ratios
        if r.num in row["time"] and r.den in row["time"]
    }
    if "host_time" in row:
        row["host_ratios"] = {
            r.key: ratio(row["host_time"][r.num], row["host_time"][r.den])
            for r in section.ratios
            if r.num in row["host_time"] and r.den in row["host_time"]
        }


def measure(chosen: list[sections.Section], ctx, load: dict, quiet: bool) -> list[dict]:
    """Plan every section, then run their cases with progress shown and the
    machine's load counted per section: the sections' records."""
    planned: dict[str, sections.Planned] = {}
    records: list[dict] = []
    for section in chosen:
        record = {**section.meta(), "size": ctx.size, "status": "measured", "rows": []}
        try:
            planned[section.name] = importlib.import_module(section.module).plan(ctx, ctx.size)
        except sections.Unavailable as exc:
            record.update(status="not measured", reason=str(exc))
        records.append(record)
    progress = Progress(sum(len(p.cases) for p in planned.values()), quiet)
    for record in records:
        plan = planned.get(record["name"])
        if plan is None:
            continue
        section = sections.SECTIONS[record["name"]]
        before = machine.snapshot()
        t0 = time.perf_counter()
        for case in plan.cases:
            row = case.run()
            add_ratios(section, row)
            record["rows"].append(row)
            progress.step(section.name, case.label)
        extra = plan.finish(record["rows"])
        record["notes"] = plan.notes + extra.get("notes", [])
        record["targets"] = extra.get("targets", [])
        record["seconds"] = round(time.perf_counter() - t0, 1)
        load["sections"][section.name] = machine.usage(before, machine.snapshot()).to_dict()
    return records


def error(text: str, code: int = 2) -> int:
    from flatgather.cli import prog

    print(f"{prog()} bench: error: {text}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.list:
        for s in sections.SECTIONS.values():
            print(f"{s.name:14} {s.title.replace('`', '')}")
        return 0
    chosen = sections.resolve(args.section)
    size = "quick" if args.quick else "full" if args.full else "default"
    if args.threads < 1:
        return error("--threads must be at least 1")
    try:
        release = _sglang_dirs.select(args.sglang)
    except _sglang_dirs.SGLangNotFound as exc:
        return error(str(exc))

    import torch

    # Pinned for the run and put back after it: main() also runs in-process
    # (the tests), where a changed thread count would outlive it.
    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args, argv, chosen, size, release, torch)
    finally:
        torch.set_num_threads(threads_before)


def _run(args, argv, chosen, size, release, torch) -> int:
    from flatgather.bench import report
    from flatgather.bench.release import SGLang
    from flatgather.bench.timing import Context, Mismatch, Timer
    from flatgather.cli import prog
    from flatgather.sglang import UnsupportedRelease

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return error(f"--device {args.device}: no CUDA device is available")
    if device.type not in ("cpu", "cuda"):
        return error(f"--device {args.device}: cpu or cuda only")
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # the clocks synchronise the current device

    timing = sections.TIMINGS[size]
    if args.samples:
        timing = sections.Timing(args.samples, timing.warmup_s, timing.sample_s)
    load = {
        "cpus": machine.cpus(),
        "threads": torch.get_num_threads(),
        "max_other_load": args.max_other_load,
        "before": machine.load_average(),
        "sections": {},
    }
    started = time.perf_counter()
    progress = Progress(0, args.quiet)
    progress.say(f"bench: probing and installing flatgather over SGLang {release}...")
    notes: list[str] = []
    try:
        sg = SGLang(notes, draft=any(s.name == "rotation" for s in chosen))
    except UnsupportedRelease as exc:
        return error(f"flatgather refuses this release, so there is nothing to measure: {exc}")
    ctx = Context(device=device, size=size, timer=Timer(device, timing), sglang=sg)
    try:
        records = measure(chosen, ctx, load, args.quiet)
    except Mismatch as exc:
        return error(str(exc), code=1)
    finally:
        sg.close()
    load["after"] = machine.load_average()

    results = {
        "schema": SCHEMA,
        "command": f"{prog()} bench {shlex.join(argv)}".rstrip(),
        "size": size,
        "timing": {
            "samples": timing.samples,
            "warmup_s": timing.warmup_s,
            "sample_s": timing.sample_s,
        },
        "seconds": round(time.perf_counter() - started, 1),
        "versions": versions(release),
        "machine": machine_record(device),
        "threads": torch.get_num_threads(),
        "install": sg.install_record(),
        "load": load,
        "notes": notes,
        "sections": records,
    }
    results["warnings"] = report.collect_warnings(results)
    print(report.table(results))
    for path, write in (
        (args.json, lambda p: p.write_text(json.dumps(results, indent=1) + "\n")),
        (
            args.markdown,
            lambda p: p.write_text(report.markdown(results, report.image_link(p, args.plot))),
        ),
        (args.plot, lambda p: report.plot(results, p)),
    ):
        if path is not None:
            path = Path(os.path.abspath(path))
            path.parent.mkdir(parents=True, exist_ok=True)
            write(path)
            print(f"wrote {path}")
    return 0
