"""Run the mutation suite against the SGLang release on ``sys.path``.

    cd tests && PYTHONPATH=../.sglang/0.5.23 ../.venv/bin/python -m mutation --sample 40

Prints one line per mutant that was silently different, invalid, or not
told apart from the release by any input with nothing to say why
(equivalent by construction, or argued in ``argued.py``), a progress line
every 25 mutants, and a summary per target; exits 1 when any mutant was
silently different (or patched without being compared).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from . import targets
from .suite import run, summary


def _with_oracle(named: list[str] | None) -> list[str]:
    """The names of the gated targets with an oracle (of ``named``, if given)."""
    found = [t for t in targets.targets() if t.gated and not t.whole_function]
    return [t.name for t in found if not named or t.name in named or t.function in named]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutation")
    parser.add_argument("--sample", type=int, help="mutants per target (all if unset)")
    parser.add_argument("--cases", type=int, default=30, help="random inputs per patched mutant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", action="append", help="only these targets (by name)")
    parser.add_argument(
        "--with-oracle",
        action="store_true",
        help="only the functions replaced whole behind their known code that the suite has "
        "an oracle for (what a run with --no-shape-gate can compare)",
    )
    parser.add_argument("--json", type=Path, help="write every verdict here")
    parser.add_argument(
        "--grow",
        type=int,
        default=targets.GROW,
        help="inputs, as a multiple of --cases, for a mutant not yet told from the release",
    )
    parser.add_argument(
        "--no-shape-gate",
        action="store_true",
        help="answer yes to every fingerprint: what the probe and checks alone let through",
    )
    args = parser.parse_args(argv)
    targets.SHAPE_GATE = not args.no_shape_gate
    targets.GROW = args.grow

    started = time.monotonic()

    def progress(done: int, total: int, record) -> None:
        what = f"{record.target} {record.operator} {record.description}"
        if record.verdict in ("silently different", "invalid"):
            print(f"  {record.verdict}: {what}: {record.detail}")
        elif record.unexplained:
            print(f"  not distinguished: {what}", flush=True)
        if done % 25 == 0 or done == total:
            print(f"[{time.monotonic() - started:6.1f}s] {done}/{total} mutants", flush=True)

    with tempfile.TemporaryDirectory(prefix="flatgather-mutants-") as tmp:
        records, release = run(
            Path(tmp),
            sample=args.sample,
            cases=args.cases,
            seed=args.seed,
            only=_with_oracle(args.target) if args.with_oracle else args.target,
            progress=progress,
        )
    table = summary(records)
    print(f"SGLang {release}: {len(records)} mutants in {time.monotonic() - started:.0f} s")
    for row in table:
        told = row["distinguished"]
        valid = row["mutants"] - row["invalid"]
        nd = row["not distinguished"]
        print(
            f"  {row['target']} ({row['proves']}): {row['mutants']} mutants, "
            f"{row['patched and exact']} patched and exact, "
            f"{row['patched, not distinguished']} patched and not distinguished, "
            f"{row['refused']} refused, {row['silently different']} silently different, "
            f"{row['equivalent refused']}/{row['equivalent']} equivalent refused, "
            f"{row['invalid']} invalid; distinguished "
            + ("- (no inputs)" if told is None else f"{told}/{valid}")
            + f"; not: {nd['equivalent']} equivalent, {nd['argued']} argued, "
            f"{nd['unexplained']} unexplained"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "release": release,
                    "sample": args.sample,
                    "cases": args.cases,
                    "seed": args.seed,
                    "shape_gate": targets.SHAPE_GATE,
                    "summary": table,
                    "mutants": [r.__dict__ for r in records],
                },
                indent=1,
            )
        )
    bad = sum(row["silently different"] for row in table)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
