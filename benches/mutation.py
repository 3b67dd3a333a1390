"""The mutation figure: every one-edit mutant of every function flatgather
patches, on each full-suite release, handed to flatgather as a fork's code
would be (``tests/mutation``), and the same with the known-code gate off
(what the probe and the side-by-side checks alone let through).

    .venv/bin/python benches/mutation.py [--releases 0.5.10 0.5.15 0.5.23]
        [--cases 30] [--json bench-out/mutation.json] [--markdown docs/reliability.md]

With ``--markdown`` the figure replaces the block between the
``<!-- mutation figure -->`` markers of that file. Each release runs in a
process of its own; the run fails (exit 1) when any mutant was silently
different with the gate on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- mutation figure -->", "<!-- /mutation figure -->"
COLUMNS = ("mutants", "patched and exact", "refused", "silently different", "invalid")


def full_suite() -> list[str]:
    table = ROOT / "python/flatgather/sglang/releases.py"
    out = subprocess.run(
        [sys.executable, str(table), "versions", "--full-suite"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.split()


def run_release(release: str, cases: int, gate: bool, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / ".sglang" / release), PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "mutation", "--cases", str(cases), "--json", str(out)]
    if not gate:
        # Only where the suite has an oracle: the functions replaced whole
        # behind their checks have none here (their own tests compare them).
        cmd += ["--no-shape-gate", "--target", "_get_pruned_states"]
        cmd += ["--target", "_get_hidden_states_to_store"]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT / "tests", env=env, capture_output=True, text=True)
    shown = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith(("  silently", "  invalid", "SGLang"))
    ]
    print("\n".join(shown), flush=True)
    if not out.exists():
        sys.exit(f"the suite did not finish on {release}:\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    result["seconds"] = time.monotonic() - started
    return result


def markdown(runs: list[dict], cases: int, command: str) -> str:
    lines = [
        BEGIN,
        "",
        f"Last run ({time.strftime('%Y-%m-%d')}, `{command}`; {cases} random inputs per "
        "mutant that a patch took):",
        "",
        "| SGLang | known-code gate | function | "
        + " | ".join(COLUMNS)
        + " | equivalent refused |",
        "|---|---|---|" + "---|" * (len(COLUMNS) + 1),
    ]
    for run in runs:
        gate = "on" if run["shape_gate"] else "off"
        for row in run["summary"]:
            cells = [str(row[c]) for c in COLUMNS]
            if row["silently different"]:
                cells[3] = f"**{cells[3]}**"
            lines.append(
                f"| {run['release']} | {gate} | `{row['target']}` | "
                + " | ".join(cells)
                + f" | {row['equivalent refused']} of {row['equivalent']} |"
            )
    total = sum(r["mutants"] for run in runs if run["shape_gate"] for r in run["summary"])
    bad = sum(r["silently different"] for run in runs if run["shape_gate"] for r in run["summary"])
    seconds = sum(run["seconds"] for run in runs)
    lines += [
        "",
        f"Gate on: {total} mutants, {bad} silently different. The whole run took "
        f"{seconds / 60:.0f} min on this machine.",
        "",
        END,
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--releases", nargs="*")
    parser.add_argument("--cases", type=int, default=30)
    parser.add_argument(
        "--no-gate-off", action="store_true", help="skip the runs with the gate off"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    releases = args.releases or full_suite()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for release in releases:
            for gate in (True,) if args.no_gate_off else (True, False):
                print(f"== SGLang {release}, known-code gate {'on' if gate else 'off'}", flush=True)
                out = Path(tmp) / f"{release}-{gate}.json"
                runs.append(run_release(release, args.cases, gate, out))
    command = f".venv/bin/python benches/mutation.py --releases {' '.join(releases)}"
    command += f" --cases {args.cases}" + (" --no-gate-off" if args.no_gate_off else "")
    command += f" --markdown {args.markdown}" if args.markdown else ""
    figure = markdown(runs, args.cases, command)
    print(figure)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(runs, indent=1))
    if args.markdown:
        text = args.markdown.read_text()
        if BEGIN not in text or END not in text:
            sys.exit(f"{args.markdown} has no {BEGIN} ... {END} block")
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        args.markdown.write_text(head + figure + tail)
    bad = sum(r["silently different"] for run in runs if run["shape_gate"] for r in run["summary"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
