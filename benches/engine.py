"""The end-to-end figure: a logprob-heavy workload on a real SGLang engine,
flatgather off and on, side by side in one run.

    .venv/bin/python benches/engine.py [--release 0.5.23] [--running 64 256]
        [--rounds 8] [--calls 5] [--profile-rounds 1] [--json FILE] [--markdown FILE]
        [--max-minutes M] [--workdir DIR]

For each number of running requests N, N requests are sent at once to a CPU
``sglang.Engine`` (no speculative decoding, SGLang's torch-native attention,
the tiny random Llama of ``tests/engine``), every one with input logprobs from
its first token, the top 5 logprobs and three token ids, 16 to 32 output
tokens. Each side runs in its own process with flatgather switched by
``FLATGATHER_SGLANG`` alone; each of its engines serves one warm-up call and
then ``--calls`` timed ``Engine.generate`` calls (start-up excluded), and its
time is the median of those.

Three things keep the figure from passing by accident:

- **Timing rounds run bare.** No profiler, no trace: each round starts one
  engine per side, the order alternating, and the ratio of the round is the
  stock engine's time over flatgather's. The figure is the geometric mean of
  the rounds' ratios with a 95% t-interval over rounds, and the doc says
  whether that interval excludes 1.0.
- **The profile runs apart.** After the timing rounds, ``--profile-rounds``
  more rounds run with the scheduler's profile (``tests/engine/site``): its
  step time and the time spent in the functions whose loops flatgather
  replaces. Their throughput against the bare rounds' is the profiler's
  overhead, reported per side.
- **Every call's answers are compared bit for bit**, warm-up and timed, of
  every engine, both sides, against the first engine's answers to the same
  call: one difference stops the run with exit status 1. The off side must
  log nothing from flatgather and every on-side engine must log that it is
  active.

CPU figures on a shared 2-core machine: one torch thread per process, the
sides interleaved, and the CPU time other processes used during each round
(``/proc/stat`` less this bench's own processes) with the load average before
and after: a busy machine is warned of on stderr and in the doc.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
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

BUSY_CORES = 0.5
"""Cores other processes may keep busy, in a round or in the minute before
the run (the load average), before the figure is marked as rough: the bench
itself keeps one of the two cores busy."""

T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""Student's t, 97.5th percentile, for 1 to 30 degrees of freedom."""


class Failed(Exception):
    """The run cannot give a figure: the sides differ, or a side is not what
    it claims to be."""


def t_975(df: int) -> float:
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)  # Cornish-Fisher, within 0.001 past 30


def engine_settings(running: int) -> dict:
    """Room for every request at once: one prefill batch, then N decoding."""
    return {
        "max_running_requests": running,
        "max_total_tokens": running * 128 + 1024,
        "chunked_prefill_size": 8192,
    }


# -- the engine process -------------------------------------------------------


def serve(spec_path: Path) -> int:
    """One engine: start it, a warm-up call and the timed calls, every call's
    answers and time written out. Runs in its own process, never imports
    flatgather (the environment decides whether the engine has it)."""
    from engine import serve as engine_serve  # tests/engine/serve.py: args, answers

    workload = engine_serve.workload
    spec = json.loads(spec_path.read_text())
    reqs = workload.requests(spec["requests"], seed=0, **spec["shape"])
    calls = [r.as_kwargs() for r in reqs]
    batch = {key: [c[key] for c in calls] for key in calls[0]}

    import sglang

    started = time.perf_counter()
    engine = sglang.Engine(**engine_serve.engine_args(spec))
    startup_s = time.perf_counter() - started
    results = []
    try:
        for _ in range(spec["calls"]):
            sent = time.perf_counter()
            outs = engine.generate(**batch)
            seconds = time.perf_counter() - sent
            results.append({"s": seconds, "answers": [engine_serve.answer(o) for o in outs]})
    finally:
        engine.shutdown()
    Path(spec["out"]).write_text(json.dumps({"startup_s": startup_s, "calls": results}))
    return 0


# -- the machine --------------------------------------------------------------


class Usage:
    """The CPU time of this bench's processes and of the whole machine, from
    ``/proc``, polled in a thread: an engine's scheduler is killed, not
    waited for, so its time never reaches this process's ``getrusage``.
    A process is the bench's when it is this one or its parent was the
    bench's when it was first seen; what one of them spends after the last
    poll before it dies (under ``POLL_S``) counts as another process's, so
    the figure errs on the busy side."""

    POLL_S = 0.5

    def __init__(self) -> None:
        import threading

        self.ticks_per_s = os.sysconf("SC_CLK_TCK")
        self.ours: dict[tuple[int, int], int] = {}
        """(pid, start time) -> CPU ticks at the last poll, every process of
        the bench ever seen."""
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Usage:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def _loop(self) -> None:
        while not self.stop.wait(self.POLL_S):
            self.snapshot()

    def snapshot(self) -> tuple[float, float, float] | None:
        """(wall, CPU seconds of every core, CPU seconds of the bench's
        processes), or None without ``/proc``."""
        try:
            first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
            entries = os.listdir("/proc")
        except OSError:
            return None
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in first[1:8])
        machine = user + nice + system + irq + softirq
        processes = {}
        for entry in entries:
            if entry.isdigit():
                try:
                    raw = Path("/proc", entry, "stat").read_text()
                except OSError:
                    continue  # gone meanwhile
                # The command name sits in parentheses and may hold spaces.
                fields = raw[raw.rfind(")") + 2 :].split()
                processes[int(entry)] = (
                    int(fields[1]),  # parent
                    int(fields[19]),  # start time: a reused pid is another process
                    int(fields[11]) + int(fields[12]),  # user + system ticks
                )
        with self.lock:
            alive = {os.getpid()}
            # Parents first: a new grandchild is the bench's once its parent is.
            for pid in sorted(processes, key=lambda p: processes[p][1]):
                ppid, start, ticks = processes[pid]
                if pid in alive or ppid in alive or (pid, start) in self.ours:
                    alive.add(pid)
                    self.ours[(pid, start)] = ticks
            own = sum(self.ours.values())
        return time.perf_counter(), machine / self.ticks_per_s, own / self.ticks_per_s


def own_cores(before, after) -> float | None:
    """Cores the bench's own processes kept busy between two snapshots."""
    if before is None or after is None:
        return None
    return (after[2] - before[2]) / max(after[0] - before[0], 1e-9)


def others_cores(before, after) -> float | None:
    """Cores other processes kept busy between two ``Usage.snapshot()``s,
    on average."""
    if before is None or after is None:
        return None
    wall = max(after[0] - before[0], 1e-9)
    return max(0.0, (after[1] - before[1]) - (after[2] - before[2])) / wall


# -- the bench ----------------------------------------------------------------


def _digest(answers: list) -> str:
    return hashlib.sha256(json.dumps(answers, sort_keys=True).encode()).hexdigest()[:16]


def _first_difference(expected, got, where: str) -> tuple[str, str, str] | None:
    """Where two answers first differ, down to the value, and the two values."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(set(expected) | set(got)):
            found = _first_difference(expected.get(key), got.get(key), f"{where} {key}")
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        for i, (a, b) in enumerate(zip(expected, got, strict=True)):
            found = _first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    if expected != got:
        return where, json.dumps(expected)[:200], json.dumps(got)[:200]
    return None


def _flatgather_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("[flatgather]")]


class Bench:
    def __init__(self, work: Path, models: Path, calls: int) -> None:
        from engine import harness

        self.harness = harness
        self.work = work
        self.target, self.draft = harness.make_models(models)
        self.calls = calls
        self.reference: dict[int, tuple[str, list[list]]] = {}
        """Per size, the first engine's tag and its answers to each call."""
        self.compared = 0
        self.on_lines: Counter[str] | None = None

    def engine(self, running: int, flatgather: bool, round_: str, profile: bool) -> dict:
        side = "on" if flatgather else "off"
        tag = f"{running}-{round_}-{side}"
        out = self.work / f"{tag}.json"
        spec = {
            "scenario": "plain",
            "target": str(self.target),
            "draft": str(self.draft),
            "out": str(out),
            "requests": running,
            "shape": REQUESTS_SHAPE,
            "engine": engine_settings(running),
            "chunked_prefill_size": 8192,
            "calls": 1 + self.calls,
        }
        spec_path = self.work / f"{tag}.spec.json"
        spec_path.write_text(json.dumps(spec))
        env = self.harness.environment("plain", flatgather, self.work / f"{tag}.trace")
        # Bare timing: none of the harness's instruments (the trace wraps
        # flatgather's functions, on one side only); the profile alone, and
        # only where asked for.
        for name in [k for k in env if k.startswith("FLATGATHER_ENGINE_")]:
            del env[name]
        profile_path = self.work / f"{tag}.profile.json"
        if profile:
            env["FLATGATHER_ENGINE_PROFILE"] = str(profile_path)
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--serve", str(spec_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=self.harness.SERVE_TIMEOUT_S,
            cwd=self.work,
        )
        log = proc.stdout + proc.stderr
        (self.work / f"{tag}.log").write_text(log)
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join(log.splitlines()[-40:])
            raise Failed(f"the {side} engine ({tag}) failed ({proc.returncode}):\n{tail}")
        self._check_side(flatgather, tag, _flatgather_lines(log))
        result = json.loads(out.read_text())
        digests = self._compare(running, tag, [c["answers"] for c in result["calls"]])
        timed = [c["s"] for c in result["calls"][1:]]
        seconds = statistics.median(timed)
        tokens = sum(int(a["completion_tokens"]) for a in result["calls"][0]["answers"])
        row = {
            "s": seconds,
            "calls_s": [c["s"] for c in result["calls"]],
            "startup_s": result["startup_s"],
            "requests_per_s": running / seconds,
            "tokens_per_s": tokens / seconds,
            "answers_sha256": digests,
        }
        if profile:
            if not profile_path.exists():
                raise Failed(f"{tag}: the engine wrote no profile to {profile_path}")
            row |= _profile(json.loads(profile_path.read_text()))
        return row

    def _check_side(self, flatgather: bool, tag: str, lines: list[str]) -> None:
        """Off is off; on is on, every time the same way (its log lines, the
        numbers aside: pids, milliseconds)."""
        if not flatgather:
            if lines:
                raise Failed(f"{tag}: flatgather logged with FLATGATHER_SGLANG=0: {lines[:3]}")
            return
        if not any("active in pid" in line for line in lines):
            raise Failed(f"{tag}: flatgather never said it was active: {lines[:5]}")
        # Counted, not a set: each of the engine's processes logs its own.
        shape = Counter(re.sub(r"\d+(\.\d+)*", "#", line) for line in lines)
        if self.on_lines is None:
            self.on_lines = shape
        elif shape != self.on_lines:
            raise Failed(
                f"{tag}: flatgather logged otherwise than in the first on-side engine: "
                f"{sorted((shape - self.on_lines) + (self.on_lines - shape))[:5]}"
            )

    def _compare(self, running: int, tag: str, calls: list[list]) -> list[str]:
        """Every call's answers against the first engine's answers to the same
        call, bit for bit (floats travel as their repr)."""
        first, reference = self.reference.setdefault(running, (tag, calls))
        if len(calls) != len(reference):
            raise Failed(f"{tag}: {len(calls)} calls, {first} made {len(reference)}")
        for i, (answers, expected) in enumerate(zip(calls, reference, strict=True)):
            if len(answers) != running:
                raise Failed(f"{tag}, call {i}: {len(answers)} answers to {running} requests")
            if first == tag:
                continue
            for j, (a, b) in enumerate(zip(expected, answers, strict=True)):
                difference = _first_difference(a, b, f"request {j},")
                if difference:
                    where, was, now = difference
                    raise Failed(
                        f"{tag}, call {i} ({'warm-up' if i == 0 else 'timed'}), {where}: "
                        f"{first} answered {was}, {tag} {now}"
                    )
            self.compared += 1
        return [_digest(answers) for answers in calls]


def _profile(prof: dict) -> dict:
    step = sum(v["s"] for k, v in prof.items() if k.startswith("step."))
    replaced = sum(v["s"] for k, v in prof.items() if not k.startswith(("step.", "loop.", "gc.")))
    collections = prof.get("gc.pauses", {"calls": 0, "s": 0.0})
    return {
        "step_s": step,
        "replaced_s": replaced,
        "replaced_share": replaced / step if step else 0.0,
        "gc_s": collections["s"],
        "gc_collections": collections["calls"],
        "profile": prof,
    }


# -- the figures --------------------------------------------------------------


def interval(ratios: list[float]) -> dict:
    """The geometric mean of the rounds' ratios and its 95% t-interval (over
    the logs: a ratio and its inverse weigh the same)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return {"mean": math.exp(mean), "low": None, "high": None, "excludes_one": False}
    half = t_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    low, high = math.exp(mean - half), math.exp(mean + half)
    return {"mean": math.exp(mean), "low": low, "high": high, "excludes_one": low > 1 or high < 1}


def summarize(rows: list[dict], profiled: list[dict]) -> dict:
    ratios = [r["off"]["s"] / r["on"]["s"] for r in rows]
    others = [r["others_cores"] for r in rows if r["others_cores"] is not None]
    own = [r["own_cores"] for r in rows if r["own_cores"] is not None]
    out = {
        # Checked: each call's answers equal the first engine's to that call.
        # Recorded: whether calls agree with one another too (1: one set).
        "distinct_answers": len(
            {
                digest
                for r in rows + profiled
                for side in ("off", "on")
                for digest in r[side]["answers_sha256"]
            }
        ),
        "ratio": interval(ratios),
        "ratios": ratios,
        "rounds": len(rows),
        "on_faster": sum(r > 1 for r in ratios),
        "others_cores_median": statistics.median(others) if others else None,
        "others_cores_max": max(others) if others else None,
        "own_cores_median": statistics.median(own) if own else None,
    }
    for side in ("off", "on"):
        for key in ("requests_per_s", "tokens_per_s"):
            out[f"{side}_{key}"] = statistics.median(r[side][key] for r in rows)
        if profiled:
            for key in ("replaced_share", "replaced_s", "step_s", "gc_s", "requests_per_s"):
                out[f"{side}_profiled_{key}"] = statistics.median(r[side][key] for r in profiled)
            # The profiler's cost: the profiled engines' throughput against
            # the bare ones' (below 1: the profile slows its side down).
            out[f"{side}_profiled_speed"] = (
                out[f"{side}_profiled_requests_per_s"] / out[f"{side}_requests_per_s"]
            )
    return out


def _fmt_interval(r: dict) -> str:
    if r["low"] is None:
        return f"{r['mean']:.3f}x (one round: no interval)"
    return f"{r['mean']:.3f}x ({r['low']:.3f}-{r['high']:.3f})"


def _verdict(s: dict) -> str:
    r = s["ratio"]
    if r["low"] is None:
        return "one round: says nothing"
    if r["low"] > 1:
        return "excludes 1.0: flatgather faster"
    if r["high"] < 1:
        return "excludes 1.0: flatgather slower"
    return "holds 1.0: cannot tell the sides apart"


def _plainly(s: dict) -> str:
    r = s["ratio"]
    if r["low"] is None:
        return f"one round ({r['mean']:.3f}x) gives no interval"
    if r["excludes_one"]:
        faster = "faster" if r["low"] > 1 else "slower"
        return f"flatgather is {faster}: {_fmt_interval(r)}, an interval that excludes 1.0"
    return f"this run cannot tell the sides apart: {_fmt_interval(r)} holds 1.0"


def markdown(release: str, results: dict, args, command: str, machine: dict) -> str:
    import platform

    import torch

    lines = [
        "# A real engine: flatgather off and on",
        "",
        "Generated by the command below (`benches/engine.py`); every ratio compares the two "
        "sides measured in the same run.",
        "",
        "```sh",
        command,
        "```",
        "",
        f"- SGLang {release}, CPU `sglang.Engine`, no speculative decoding (torch-native "
        f"attention), the tiny random Llama of `tests/engine`; torch {torch.__version__}, "
        f"Python {platform.python_version()}, {os.cpu_count()} cores, 1 torch thread per process",
        "- every request: input logprobs from token 0, the top 5, 3 token ids, prompts of "
        "16-64 tokens, 16-32 output tokens (`ignore_eos`); all N sent in one call",
        f"- **timing:** {machine['rounds']} rounds per size"
        + (
            ""
            if machine["rounds"] == args.rounds
            else f" (of the {args.rounds} asked for: `--max-minutes` stopped it there)"
        )
        + ", each one engine per side (the order "
        f"alternating), no profiler and no trace attached; an engine serves one warm-up call, "
        f"then {args.calls} timed `Engine.generate` calls, and its time is their median. "
        "A round's ratio is the stock engine's time over flatgather's (above 1: flatgather "
        "faster); the figure is the geometric mean of the rounds' ratios with its 95% "
        "t-interval over rounds",
        f"- **profile:** {args.profile_rounds} more round(s) per size with the scheduler's "
        "profile attached, after the timing rounds; their throughput over the bare rounds' is "
        "the profiler's cost",
        "- **answers:** every call of every engine, warm-up and timed, timing and profiled "
        "rounds, both sides, was compared bit for bit with the first engine's answers to the "
        f"same call (the first engine of each size is the reference): {machine['compared']} "
        "calls, all identical (a difference stops the run); "
        + ", ".join(
            f"{s['distinct_answers']} distinct set(s) of answers at {n} running"
            for n, s in results.items()
        )
        + " over all calls. No stock engine logged anything "
        "from flatgather; every flatgather engine logged that it was active, the same lines "
        "each time",
        f"- **machine:** 1-minute load average {machine['load_before']:.2f} before, "
        f"{machine['load_after']:.2f} after (the bench's own engines included); in cores, "
        "median over timing rounds: "
        + "; ".join(
            f"{running} running: the bench {s['own_cores_median']:.2f}, other processes "
            f"{s['others_cores_median']:.2f} (max {s['others_cores_max']:.2f})"
            for running, s in results.items()
            if s["others_cores_median"] is not None
        ),
        f"- {machine['minutes']:.0f} minutes in all",
        "",
    ]
    for warning in machine["warnings"]:
        lines += [f"**Warning:** {warning}", ""]
    lines += [
        "**What it says:** "
        + "; ".join(f"at {n} running requests, {_plainly(s)}" for n, s in results.items())
        + ".",
        "",
        "| running requests | req/s stock | req/s flatgather "
        "| flatgather / stock, geometric mean (95% interval) | rounds flatgather faster "
        "| the interval | tokens/s stock | tokens/s flatgather |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for running, s in results.items():
        lines.append(
            f"| {running} | {s['off_requests_per_s']:.1f} | {s['on_requests_per_s']:.1f} "
            f"| {_fmt_interval(s['ratio'])} | {s['on_faster']} of {s['rounds']} "
            f"| {_verdict(s)} | {s['off_tokens_per_s']:.0f} | {s['on_tokens_per_s']:.0f} |"
        )
    lines += ["", "The rounds' ratios, in order:", ""]
    for running, s in results.items():
        lines.append(f"- {running}: " + ", ".join(f"{r:.3f}" for r in s["ratios"]))
    if args.profile_rounds:
        lines += [
            "",
            "**The share of step time** (profiled rounds only) is the time the scheduler spent "
            "inside the functions whose loops flatgather replaces (`_get_pruned_states`, the "
            "token-id and top-k logprob helpers, `copy_to_cpu`, `move_logprobs_to_cpu`, "
            "`_normalize_decode_outputs`), over its `run_batch` plus `process_batch_result` "
            "time, warm-up call included; on each side it is whatever object is in place, the "
            "release's or flatgather's. The garbage collector's pauses are counted on their "
            "own, not in the function they fall in. The last two columns compare the "
            "profiled rounds' throughput with the bare rounds' median: below 1, the profile "
            "slowed its side down (with few profiled rounds, a rough measure).",
            "",
            "| running requests | replaced functions' share of step time, stock "
            "| same, flatgather | GC pauses, stock | same, flatgather "
            "| profiled / bare req/s, stock (the profiler's cost) | same, flatgather |",
            "|---|---|---|---|---|---|---|",
        ]
        for running, s in results.items():
            lines.append(
                f"| {running} "
                f"| {100 * s['off_profiled_replaced_share']:.1f}% "
                f"({1e3 * s['off_profiled_replaced_s']:.0f} ms of "
                f"{1e3 * s['off_profiled_step_s']:.0f}) "
                f"| {100 * s['on_profiled_replaced_share']:.1f}% "
                f"({1e3 * s['on_profiled_replaced_s']:.0f} ms of "
                f"{1e3 * s['on_profiled_step_s']:.0f}) "
                f"| {1e3 * s['off_profiled_gc_s']:.0f} ms | {1e3 * s['on_profiled_gc_s']:.0f} ms "
                f"| {s['off_profiled_speed']:.3f} | {s['on_profiled_speed']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def busy_warnings(load_before: float, results: dict) -> list[str]:
    warnings = []
    if load_before > BUSY_CORES:
        warnings.append(
            f"the machine was busy before the run (load average {load_before:.2f}, above "
            f"{BUSY_CORES}): treat the ratios as rough"
        )
    busy = {
        running: s["others_cores_max"]
        for running, s in results.items()
        if s["others_cores_max"] is not None and s["others_cores_max"] > BUSY_CORES
    }
    if busy:
        warnings.append(
            "other processes kept the machine busy during rounds ("
            + ", ".join(f"up to {v:.2f} cores at {k} running" for k, v in busy.items())
            + f", above {BUSY_CORES}): treat the ratios as rough"
        )
    return warnings


def progress(running: int, label: str, row: dict) -> None:
    others = row["others_cores"]
    print(
        f"[{running} running] {label}: stock {row['off']['requests_per_s']:.1f} req/s, "
        f"flatgather {row['on']['requests_per_s']:.1f} req/s, "
        f"stock/flatgather time {row['off']['s'] / row['on']['s']:.3f}; "
        f"other processes {'?' if others is None else f'{others:.2f}'} cores; "
        f"{row['seconds']:.0f} s",
        file=sys.stderr,
        flush=True,
    )


def run_round(bench: Bench, usage: Usage, running: int, i: int, of: int, profile: bool) -> dict:
    """One engine per side, the order alternating from round to round."""
    started, before = time.perf_counter(), usage.snapshot()
    first_on = i % 2 == 1
    row: dict = {"order": "on, off" if first_on else "off, on"}
    round_ = f"{'profiled' if profile else 'timed'}{i + 1}"
    for flatgather in (True, False) if first_on else (False, True):
        row["on" if flatgather else "off"] = bench.engine(running, flatgather, round_, profile)
    after = usage.snapshot()
    row["others_cores"] = others_cores(before, after)
    row["own_cores"] = own_cores(before, after)
    row["seconds"] = time.perf_counter() - started
    progress(running, f"{'profiled round' if profile else 'round'} {i + 1}/{of}", row)
    return row


MIN_ROUNDS = 3
"""Timing rounds run whatever ``--max-minutes`` says: fewer and the interval
is not worth much."""


def measure(bench: Bench, usage: Usage, args) -> tuple[dict, dict, int]:
    """Rounds of every size in turn (a drift of the machine reaches every
    size alike), the timing rounds first, then the profiled ones; with
    ``--max-minutes``, no timing round starts that would leave too little
    time for the profiled rounds. Returns the results, the raw rows and the
    timing rounds run."""
    started = time.perf_counter()
    timing: dict[int, list] = {n: [] for n in args.running}
    profiled: dict[int, list] = {n: [] for n in args.running}
    done = 0
    for i in range(args.rounds):
        if args.max_minutes and i >= MIN_ROUNDS:
            spent = time.perf_counter() - started
            if spent + spent / i * (1 + args.profile_rounds) > 60 * args.max_minutes:
                print(
                    f"stopping after {i} of {args.rounds} timing rounds: "
                    f"--max-minutes {args.max_minutes:g}",
                    file=sys.stderr,
                    flush=True,
                )
                break
        for running in args.running:
            timing[running].append(run_round(bench, usage, running, i, args.rounds, False))
        done = i + 1
    for i in range(args.profile_rounds):
        for running in args.running:
            profiled[running].append(run_round(bench, usage, running, i, args.profile_rounds, True))
    results, raw = {}, {}
    for running in args.running:
        results[running] = summarize(timing[running], profiled[running])
        raw[running] = {"timing": timing[running], "profiled": profiled[running]}
        print(
            f"[{running} running] flatgather / stock {_fmt_interval(results[running]['ratio'])}: "
            f"{_verdict(results[running])}",
            file=sys.stderr,
            flush=True,
        )
    return results, raw, done


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve(Path(argv[1]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", default="0.5.23")
    parser.add_argument("--running", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, default=8, help="timing rounds per size")
    parser.add_argument("--calls", type=int, default=5, help="timed calls per engine")
    parser.add_argument(
        "--profile-rounds", type=int, default=1, help="profiled rounds per size, apart"
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        help=f"past the first {MIN_ROUNDS} timing rounds, start none that would likely end the "
        "run (profiled rounds included) later than this",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument(
        "--workdir", type=Path, help="keep every engine's spec, answers and log here"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1 or args.profile_rounds < 0:
        parser.error("--rounds and --calls must be 1 or more, --profile-rounds 0 or more")

    release_dir = ROOT / ".sglang" / args.release
    if os.environ.get("FLATGATHER_BENCH_CHILD") != "1":
        # The engine's code must come from the release: re-run with it first
        # on the path (the harness starts each side with the same path).
        env = dict(os.environ, PYTHONPATH=str(release_dir), FLATGATHER_BENCH_CHILD="1")
        os.execve(sys.executable, [sys.executable, __file__, *argv], env)

    command = ".venv/bin/python benches/engine.py " + " ".join(argv)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    print(f"load average before: {load_before:.2f}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="fg-engine-bench-") as tmp, Usage() as usage:
        work = Path(tmp) if args.workdir is None else args.workdir.resolve()
        work.mkdir(parents=True, exist_ok=True)
        bench = Bench(work, work / "models", args.calls)
        try:
            results, raw, rounds = measure(bench, usage, args)
        except Failed as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        compared, on_lines = bench.compared, sorted((bench.on_lines or Counter()).elements())
    load_after = os.getloadavg()[0]
    warnings = busy_warnings(load_before, results)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    machine = {
        "rounds": rounds,
        "load_before": load_before,
        "load_after": load_after,
        "compared": compared,
        "flatgather_log": on_lines,
        "warnings": warnings,
        "minutes": (time.perf_counter() - started) / 60,
    }
    table = markdown(args.release, results, args, command, machine)
    print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"summary": results, "rounds": raw, "machine": machine}, indent=1)
        )
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
