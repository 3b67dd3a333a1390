"""The end-to-end figure: a logprob-heavy workload on a real SGLang engine,
flatgather off and on, side by side in one run.

    .venv/bin/python benches/engine.py [--release 0.5.23] [--running 64 256]
        [--rounds 3] [--json bench-out/engine.json] [--markdown FILE]

For each number of running requests N, N requests are sent at once to a CPU
``sglang.Engine`` (no speculative decoding, SGLang's torch-native attention,
the tiny random Llama of ``tests/engine``), every one with input logprobs from
its first token, the top 5 logprobs and three token ids, 16 to 32 output
tokens. Each round starts one engine per side, in alternating order, each in
its own process with flatgather switched by ``FLATGATHER_SGLANG`` alone, and
times ``Engine.generate`` (start-up excluded; one warm-up call, then the
median of three). The scheduler's profile
(``tests/engine/site``) gives its step time and the time spent in the
functions whose loops flatgather replaces. Both sides' answers are compared
bit for bit before any figure is reported.

CPU figures on a shared 2-core machine: one torch thread per process, the
sides interleaved, ratios reported per round and as a median, and a warning
when the machine was busy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

REQUESTS_SHAPE = {
    "min_len": 16,
    "max_len": 64,
    "new_tokens": (16, 32),
    "ignore_eos": True,
    "all_logprobs": True,
}


REPEAT = 3
"""Timed calls per engine, after one warm-up call: the median is its time."""


def engine_settings(running: int) -> dict:
    """Room for every request at once: one prefill batch, then N decoding."""
    return {
        "max_running_requests": running,
        "max_total_tokens": running * 128 + 1024,
        "chunked_prefill_size": 8192,
    }


def run_side(workdir: Path, models: Path, running: int, flatgather: bool, round_: int) -> dict:
    from engine import harness

    side = "on" if flatgather else "off"
    profile = workdir / f"profile-{running}-{round_}-{side}.json"
    served = harness.serve(
        workdir,
        models,
        "plain",
        flatgather,
        env={"FLATGATHER_ENGINE_PROFILE": str(profile)},
        requests=running,
        shape=REQUESTS_SHAPE,
        engine=engine_settings(running),
        chunked_prefill_size=8192,
        tag=f"-bench{running}-{round_}",
        repeat=REPEAT,
    )
    result = json.loads((workdir / f"plain-bench{running}-{round_}-{side}.json").read_text())
    prof = json.loads(profile.read_text())
    step = sum(v["s"] for k, v in prof.items() if k.startswith("step."))
    replaced = sum(v["s"] for k, v in prof.items() if not k.startswith(("step.", "loop.")))
    tokens = sum(a["completion_tokens"] for a in served.answers)
    return {
        "serve_s": result["serve_s"],
        "requests_per_s": running / result["serve_s"],
        "tokens_per_s": tokens / result["serve_s"],
        "step_s": step,
        "replaced_s": replaced,
        "replaced_share": replaced / step if step else 0.0,
        "profile": prof,
        "answers": served.answers,
    }


def summarize(rows: list[dict]) -> dict:
    ratios = [r["on"]["requests_per_s"] / r["off"]["requests_per_s"] for r in rows]
    return {
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
        **{
            f"{side}_{key}": statistics.median(r[side][key] for r in rows)
            for side in ("off", "on")
            for key in ("requests_per_s", "tokens_per_s", "replaced_share", "replaced_s", "step_s")
        },
    }


def markdown(release: str, results: dict, rounds: int, command: str, busy: str) -> str:
    lines = [
        f"SGLang {release}, CPU engine, no speculative decoding (torch-native attention), "
        f"{rounds} rounds per size, sides interleaved; every request: input logprobs from "
        "token 0, top 5, 3 token ids, 16-32 output tokens. Command: `" + command + "`.",
        "",
        "| running requests | req/s stock | req/s flatgather "
        "| flatgather / stock (median, min-max) | tokens/s stock | tokens/s flatgather "
        "| replaced functions' share of step time, stock | same, flatgather |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for running, s in results.items():
        lines.append(
            f"| {running} | {s['off_requests_per_s']:.1f} | {s['on_requests_per_s']:.1f} "
            f"| {s['ratio_median']:.2f}x ({s['ratio_min']:.2f}-{s['ratio_max']:.2f}) "
            f"| {s['off_tokens_per_s']:.0f} | {s['on_tokens_per_s']:.0f} "
            f"| {100 * s['off_replaced_share']:.1f}% ({1e3 * s['off_replaced_s']:.0f} ms "
            f"of {1e3 * s['off_step_s']:.0f}) "
            f"| {100 * s['on_replaced_share']:.1f}% ({1e3 * s['on_replaced_s']:.0f} ms "
            f"of {1e3 * s['on_step_s']:.0f}) |"
        )
    if busy:
        lines += ["", f"**Warning:** {busy}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", default="0.5.23")
    parser.add_argument("--running", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)

    release_dir = ROOT / ".sglang" / args.release
    if os.environ.get("FLATGATHER_BENCH_CHILD") != "1":
        # The engine's code must come from the release: re-run with it first
        # on the path (the harness starts each side with the same path).
        env = dict(os.environ, PYTHONPATH=str(release_dir), FLATGATHER_BENCH_CHILD="1")
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], env)

    from engine import harness

    command = "python benches/engine.py " + " ".join(sys.argv[1:])
    load_before = os.getloadavg()[0]
    results, raw = {}, {}
    with tempfile.TemporaryDirectory(prefix="fg-engine-bench-") as tmp:
        work, models = Path(tmp), Path(tmp) / "models"
        harness.make_models(models)
        for running in args.running:
            rows = []
            for round_ in range(args.rounds):
                row = {}
                order = (False, True) if round_ % 2 == 0 else (True, False)
                for flatgather in order:
                    started = time.perf_counter()
                    row["on" if flatgather else "off"] = run_side(
                        work, models, running, flatgather, round_
                    )
                    print(
                        f"[{running} running, round {round_ + 1}/{args.rounds}] "
                        f"flatgather {'on ' if flatgather else 'off'}: "
                        f"{row['on' if flatgather else 'off']['requests_per_s']:.1f} req/s "
                        f"({time.perf_counter() - started:.0f} s with start-up)",
                        flush=True,
                    )
                difference = harness.first_difference(row["off"]["answers"], row["on"]["answers"])
                if difference:
                    print(f"the two sides answered differently: {difference}", file=sys.stderr)
                    return 1
                for side in row.values():
                    del side["answers"]
                rows.append(row)
            results[running] = summarize(rows)
            raw[running] = rows
    load_after = os.getloadavg()[0]
    busy = ""
    if max(load_before, load_after) > 1.5:
        busy = (
            f"the machine was busy (load {load_before:.1f} before, {load_after:.1f} after): "
            "treat the ratios as rough"
        )
        print(f"warning: {busy}", file=sys.stderr)
    table = markdown(args.release, results, args.rounds, command, busy)
    print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": results, "rounds": raw}, indent=1))
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
