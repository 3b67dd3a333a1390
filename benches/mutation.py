"""The mutation figure: every one-edit mutant of every function flatgather
patches, on each full-suite release, handed to flatgather as a fork's code
would be (``tests/mutation``), and the same with the known-code gate off
(what the probe and the side-by-side checks alone let through).

    .venv/bin/python benches/mutation.py [--releases 0.5.10 0.5.15 0.5.23]
        [--cases 10] [--grow 2] [--json bench-out/mutation.json] [--markdown docs/reliability.md]

With ``--markdown`` the figure replaces the block between the
``<!-- mutation figure -->`` markers of that file. Each release runs in a
process of its own, its progress shown as it goes; the run fails (exit 1)
when any mutant was silently different with the gate on.

The figure says what each number proves. A function flatgather replaces
only where its code is known refuses every edit by construction (any edit
changes the fingerprint): those rows test the gate, and the rows with the
gate off test the probe and checks, where the suite has an oracle (the
input-logprob token-id functions, replaced whole behind their side-by-side
checks, have none here: their own tests compare them).
The rewrites take mutants, and what they put in place is compared with each.
Every mutant is also run against the unmodified release on the same inputs:
"distinguished" counts those some input tells apart; one that none tells
apart is "not distinguished", equivalent by construction, argued equivalent
or unreachable on a CPU (``tests/mutation/argued.py``), or unexplained.
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
COLUMNS = (
    "mutants",
    "refused",
    "patched and exact",
    "patched, not distinguished",
    "silently different",
    "invalid",
)
SHORT = {
    "refused by the gate by construction": "gate",
    "refused by the gate by construction, no oracle": "gate, no oracle",
    "compared against the mutant": "compared",
}


def full_suite() -> list[str]:
    table = ROOT / "python/flatgather/sglang/releases.py"
    out = subprocess.run(
        [sys.executable, str(table), "versions", "--full-suite"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.split()


def run_release(release: str, cases: int, grow: int, gate: bool, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / ".sglang" / release), PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "mutation", "--cases", str(cases), "--json", str(out)]
    cmd += ["--grow", str(grow)]
    if not gate:
        # Only where the suite has an oracle: some functions replaced whole
        # behind their checks have none here (their own tests compare them).
        cmd += ["--no-shape-gate", "--with-oracle"]
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd, cwd=ROOT / "tests", env=env, stdout=subprocess.PIPE, stderr=err, text=True
        )
        for line in proc.stdout:
            # Progress every 100 mutants; every mutant worth a look.
            if line.startswith(("  ", "SGLang")) or _hundred(line):
                print(line.rstrip(), flush=True)
        proc.wait()
        err.seek(0)
        stderr = err.read()
    if proc.returncode not in (0, 1) or not out.exists():
        sys.exit(f"the suite did not finish on {release}:\n{stderr[-3000:]}")
    result = json.loads(out.read_text())
    result["seconds"] = time.monotonic() - started
    return result


def _hundred(line: str) -> bool:
    """A progress line at a multiple of 100 mutants, or the last one."""
    if not line.startswith("["):
        return False
    done, total = line.split("]", 1)[1].split()[0].split("/")
    return int(done) % 100 == 0 or done == total


def _told(row: dict) -> str:
    if row["distinguished"] is None:
        return "no inputs"
    valid = row["mutants"] - row["invalid"]
    return f"{row['distinguished']} / {valid} ({100 * row['distinguished'] / max(valid, 1):.0f}%)"


def _untold(row: dict) -> str:
    if row["distinguished"] is None:
        return "-"
    nd = row["not distinguished"]
    cells = [f"{nd['equivalent']} equiv.", f"{nd['argued']} argued"]
    cells.append(f"**{nd['unexplained']} unexplained**" if nd["unexplained"] else "0 unexplained")
    return ", ".join(cells)


def markdown(runs: list[dict], cases: int, grow: int, command: str) -> str:
    lines = [
        BEGIN,
        "",
        f"Last run ({time.strftime('%Y-%m-%d')}, `{command}`; {cases} random inputs per "
        f"mutant, up to {cases * grow} for one no input has yet told apart from the release). "
        "Proves: *gate*, a function replaced only where its code is known, so that every "
        "edit is refused by construction (the rows with the gate off compare what the probe "
        "and checks let through); *gate, no oracle*, the same, and the suite has no oracle "
        "for it (its 0 silently different tests the gate alone); *compared*, a rewrite, "
        "whatever it puts in place compared with each mutant. Distinguished: mutants some "
        "input tells apart from the unmodified release (the kill rate); the others are "
        "equivalent by construction, argued (equivalent, or unreachable on a CPU: see below), "
        "or unexplained.",
        "",
        "| SGLang | gate | function | proves | "
        + " | ".join(COLUMNS)
        + " | equivalent refused | distinguished | not distinguished |",
        "|---|---|---|---|" + "---|" * (len(COLUMNS) + 3),
    ]
    for run in runs:
        gate = "on" if run["shape_gate"] else "off"
        for row in run["summary"]:
            cells = [str(row[c]) for c in COLUMNS]
            if row["silently different"]:
                cells[4] = f"**{cells[4]}**"
            lines.append(
                f"| {run['release']} | {gate} | `{row['target']}` | {SHORT[row['proves']]} | "
                + " | ".join(cells)
                + f" | {row['equivalent refused']} of {row['equivalent']} | {_told(row)} | "
                + f"{_untold(row)} |"
            )
    on = [r for run in runs if run["shape_gate"] for r in run["summary"]]

    def total(rows, key):
        return sum(r[key] for r in rows)

    gated = [r for r in on if r["proves"] != "compared against the mutant"]
    blind = [r for r in gated if r["distinguished"] is None]
    compared = [r for r in on if r["proves"] == "compared against the mutant"]
    told = [r for r in on if r["distinguished"] is not None]
    valid = sum(r["mutants"] - r["invalid"] for r in told)
    nd = {k: sum(r["not distinguished"][k] for r in told) for k in ("equivalent", "argued")}
    unexplained = sum(r["not distinguished"]["unexplained"] for r in told)
    seconds = sum(run["seconds"] for run in runs)
    lines += [
        "",
        f"Gate on: {total(on, 'mutants')} mutants, {total(on, 'silently different')} silently "
        f"different. Of them, {total(gated, 'mutants')} are of functions the known-code gate "
        f"refuses by construction ({total(gated, 'refused')} refused), "
        f"{total(blind, 'mutants')} of these with no oracle in the suite; "
        f"{total(compared, 'mutants')} were compared against an oracle: "
        f"{total(compared, 'patched and exact')} patched and exact, "
        f"{total(compared, 'patched, not distinguished')} patched and not distinguished, "
        f"{total(compared, 'refused')} refused. Kill rate, over the "
        f"{valid} mutants of the functions the suite runs inputs on: "
        f"{sum(r['distinguished'] for r in told)} distinguished from the release; of the rest, "
        f"{nd['equivalent']} equivalent by construction, {nd['argued']} argued, "
        f"{unexplained} unexplained. The whole run took {seconds / 60:.0f} min on this machine.",
        "",
        END,
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--releases", nargs="*")
    parser.add_argument("--cases", type=int, default=10)
    parser.add_argument("--grow", type=int, default=2)
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
                runs.append(run_release(release, args.cases, args.grow, gate, out))
    command = f".venv/bin/python benches/mutation.py --releases {' '.join(releases)}"
    command += f" --cases {args.cases} --grow {args.grow}"
    command += " --no-gate-off" if args.no_gate_off else ""
    command += f" --markdown {args.markdown}" if args.markdown else ""
    figure = markdown(runs, args.cases, args.grow, command)
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
