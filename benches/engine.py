"""The end-to-end figure: a logprob-heavy workload on a real SGLang engine,
stock, flatgather, and the floor (no logprobs at all), side by side in one run.

    .venv/bin/python benches/engine.py [--release 0.5.23] [--running 64 256]
        [--rounds 8] [--calls 5] [--profile-rounds 1] [--cprofile-rounds 1]
        [--client engine|http] [--shape logprobs|echo] [--json FILE]
        [--markdown FILE] [--max-minutes M] [--workdir DIR]

For each number of running requests N, N requests are sent at once to a CPU
SGLang server (no speculative decoding, SGLang's torch-native attention, the
tiny random Llama of ``tests/engine``): an ``sglang.Engine`` in the bench's
engine process, or, with ``--client http``, ``python -m
sglang.launch_server`` and one batch ``POST /generate`` a call. The
``logprobs`` shape asks, of every request, input logprobs from its first
token, the top 5 logprobs and three token ids, 16 to 32 output tokens; the
``echo`` shape is loglikelihood scoring (prompts of 100 to 300 tokens, one
output token, input logprobs from the first token with the top 5).

Each round runs three sides, each in its own process, the order rotating:
stock and flatgather, switched by ``FLATGATHER_SGLANG`` alone, and the
floor, stock serving the same prompts with the same output lengths
(``ignore_eos``) and no logprobs asked for. Each engine serves one warm-up
call and then ``--calls`` timed calls (start-up excluded); its time is the
median of those.

Three things keep the figure from passing by accident:

- **Timing rounds run bare.** No profiler, no trace: the ratios of a round
  are times over times of the same round (stock over flatgather; stock and
  flatgather over the floor). A figure is the geometric mean of the rounds'
  ratios with a 95% t-interval over rounds, and the doc says whether that
  interval excludes 1.0. The bench's own counters (``benches/engine_site``)
  run on every side alike: a wrapper per message a process sends, and a
  thread that wakes 20 times a second, and a CPU clock read around each of
  the scheduler's steps, model forwards and sampling calls; over the timed
  calls they give each process's bytes sent, garbage collections and CPU
  time per request, and how much of the scheduler's went to its steps, and
  in them to the model forward and to sampling.
- **The profiles run apart.** After the timing rounds, ``--profile-rounds``
  rounds run with the scheduler's profile (``tests/engine/site``): its step
  time and the time spent in the functions whose loops flatgather replaces;
  then ``--cprofile-rounds`` rounds with ``cProfile`` in every process of the
  server, timed by each main thread's CPU clock (``time.thread_time``): each
  process's top functions and its shares of logprob work,
  output streaming and pickling. Their throughput against the bare rounds'
  is the profilers' overhead, reported per side.
- **Every call's answers are compared bit for bit**, warm-up and timed, of
  every engine: stock's and flatgather's against the first such engine's
  answers to the same call, the floor's against the first floor engine's,
  and every engine's output ids against the first engine's: one difference
  stops the run with exit status 1. Stock and floor engines must log nothing
  from flatgather and every flatgather engine must log that it is active.

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
import shutil
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

ECHO_LEN = (100, 300)
"""The echo shape's prompt lengths, in tokens."""

TOKENS_PER_REQUEST = {"logprobs": 128, "echo": ECHO_LEN[1] + 16}
"""Room in the KV cache per request, prompt and output, per shape."""

SIDES = ("off", "on", "floor")
SIDE_NAMES = {"off": "stock", "on": "flatgather", "floor": "floor"}
"""The three sides of a round: stock, flatgather, and stock serving the same
prompts and output lengths with no logprobs asked for."""

ROLES = ("tokenizer manager", "scheduler", "detokenizer")
"""The server's processes, as ``engine_site`` tells them apart."""

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


def engine_settings(running: int, shape: str) -> dict:
    """Room for every request at once: one prefill batch, then N decoding.
    No prefix cache: every call sends the same prompts, and a request with
    input logprobs from its first token reuses no prefix, so the cache would
    serve the floor's prompts from the second call on, and only the
    floor's."""
    return {
        "disable_radix_cache": True,
        "max_running_requests": running,
        "max_total_tokens": running * TOKENS_PER_REQUEST[shape] + 1024,
        "chunked_prefill_size": 8192,
    }


# -- the engine process -------------------------------------------------------

SITE = Path(__file__).resolve().parent / "engine_site"
"""The bench's own engine-process additions (messages, collections, the
per-process profile), first on the engines' ``PYTHONPATH``; they run the
engine tests' additions too."""

MARK_TIMEOUT_S = 60


def echo_requests(n: int, seed: int = 0) -> list:
    """What evaluation harnesses send to score a continuation: prompts of
    100 to 300 tokens, one output token, input logprobs from the first token
    with the top 5."""
    import random

    from engine import serve as engine_serve  # puts tests/engine on the path

    VOCAB, Request = engine_serve.workload.VOCAB, engine_serve.workload.Request
    rng = random.Random(seed)
    return [
        Request(
            input_ids=[rng.randrange(3, VOCAB) for _ in range(rng.randint(*ECHO_LEN))],
            max_new_tokens=1,
            return_logprob=True,
            logprob_start_len=0,
            top_logprobs_num=5,
            token_ids_logprob=None,
            ignore_eos=True,
        )
        for _ in range(n)
    ]


def make_batch(spec: dict) -> dict:
    """One ``generate`` call's batch: the shape's requests, or, for the floor,
    the same prompts and output lengths with no logprobs asked for."""
    from engine import serve as engine_serve  # puts tests/engine on the path

    workload = engine_serve.workload
    if spec["shape"] == "echo":
        reqs = echo_requests(spec["requests"])
    else:
        reqs = workload.requests(spec["requests"], seed=0, **REQUESTS_SHAPE)
    calls = [r.as_kwargs() for r in reqs]
    batch = {key: [c[key] for c in calls] for key in calls[0]}
    # SGLang reads a batch's shape from its first entry: a key with no
    # value anywhere is left out, as a client leaves it out.
    batch = {k: v for k, v in batch.items() if any(x is not None for x in v)}
    if spec["client"] == "openai":
        # What an evaluation harness sends to score text: the prompts echoed
        # with their tokens' logprobs and the top 5 (the floor: echoed alone).
        body = {
            "model": "default",
            "prompt": batch["input_ids"],
            "max_tokens": 1,
            "temperature": 0.0,
            "ignore_eos": True,
            "echo": True,
        }
        return body if spec["floor"] else body | {"logprobs": 5}
    if spec["floor"]:
        batch = {"input_ids": batch["input_ids"], "sampling_params": batch["sampling_params"]}
        batch["return_logprob"] = False
    elif spec.get("texts"):
        batch["return_text_in_logprobs"] = True
    return batch


def openai_answers(response: dict) -> list[dict]:
    """A completion response's choices in order, each as the client reads
    it: its text (the prompt echoed and the output token, on every side, the
    floor's included: compared as the output) and its logprobs object, the
    floats as their repr."""
    from engine import serve as engine_serve

    choices = sorted(response["choices"], key=lambda c: c["index"])
    # The response counts its output tokens as a whole: with max_tokens 1
    # and ignore_eos every choice has one, which the count must say.
    each, rest = divmod(int(response["usage"]["completion_tokens"]), len(choices))
    if rest or each != 1:
        raise RuntimeError(f"{response['usage']} for {len(choices)} choices, not one token each")
    return [
        engine_serve.exact(
            {
                "output_ids": c["text"],
                "logprobs": c.get("logprobs"),
                "finish": c["finish_reason"],
                "completion_tokens": each,
            }
        )
        for c in choices
    ]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def mark(counts: Path, label: str) -> None:
    """Ask every live process of the engine (``engine_site``) for its
    counters, and wait until each has written them."""
    (counts / "mark.tmp").write_text(label)
    os.replace(counts / "mark.tmp", counts / "mark")
    deadline = time.perf_counter() + MARK_TIMEOUT_S
    while True:
        pending = [
            pid
            for pid in (int(p.stem) for p in counts.glob("*.alive"))
            if pid != os.getpid()  # it writes its own, at the edges of its calls
            and _alive(pid)
            and not (counts / f"{pid}-{label}.json").exists()
        ]
        if not pending:
            return
        if time.perf_counter() > deadline:
            raise RuntimeError(f"processes {pending} wrote no counters for {label!r}")
        time.sleep(0.05)


def _profile_window(before: dict, after: dict) -> dict:
    out = {}
    for label, (calls, cum, own, callees) in after.items():
        b = before.get(label, [0, 0.0, 0.0, {}])
        if calls - b[0] <= 0 and own - b[2] <= 1e-6:
            continue
        out[label] = [
            calls - b[0],
            cum - b[1],
            own - b[2],
            {k: v - b[3].get(k, 0.0) for k, v in callees.items() if v - b[3].get(k, 0.0) > 0},
        ]
    return out


def window(counts: Path, main_pid: int, client_pid: int | None) -> dict:
    """Per process of the server (by role), what it did between the marks
    ``before`` and ``after``: CPU seconds, collections per generation, frames
    and bytes sent, objects pickled by type, and its profile if it ran one."""
    out: dict[str, dict] = {}
    for path in sorted(counts.glob("*-before.json")):
        pid = int(path.name.split("-", 1)[0])
        after_path = counts / f"{pid}-after.json"
        if not after_path.exists():
            continue
        b, a = json.loads(path.read_text()), json.loads(after_path.read_text())
        role = a["role"]
        if role == "main":
            role = {main_pid: "tokenizer manager", client_pid: "client"}.get(pid, "other")
        row = out.setdefault(
            role,
            {
                "processes": 0,
                "cpu_s": 0.0,
                "gc_collections": [0, 0, 0],
                "gc_s": [0.0, 0.0, 0.0],
                "frames": 0,
                "bytes": 0,
            },
        )
        row["processes"] += 1
        row["cpu_s"] += a["cpu_s"] - b["cpu_s"]
        for key in ("gc_collections", "gc_s"):  # per generation
            for g, (x, y) in enumerate(zip(b[key], a[key], strict=True)):
                row[key][g] += y - x
        stages = row.setdefault("stages", {})
        for stage, (n, seconds) in a["stages"].items():
            n0, seconds0 = b["stages"][stage]
            was = stages.get(stage, [0, 0.0])
            stages[stage] = [was[0] + n - n0, was[1] + seconds - seconds0]
        row["frames"] += a["sent"]["frames"] - b["sent"]["frames"]
        row["bytes"] += a["sent"]["bytes"] - b["sent"]["bytes"]
        pickled = row.setdefault("pickled", {})
        for kind, (n, size, seconds) in a["pickled"].items():
            n0, size0, seconds0 = b["pickled"].get(kind, [0, 0, 0.0])
            if n > n0:
                was = pickled.get(kind, [0, 0, 0.0])
                pickled[kind] = [
                    was[0] + n - n0,
                    was[1] + size - size0,
                    was[2] + seconds - seconds0,
                ]
        if "profile" in a and role in ROLES:
            row["profile"] = _profile_window(b["profile"], a["profile"])
    return out


def _serve_http(spec: dict, batch: dict, on_warm, on_done) -> tuple[float, list]:
    """The same calls through ``python -m sglang.launch_server`` and a real
    HTTP client, one batch ``POST /generate`` (or, for the OpenAI client,
    ``POST /v1/completions``) a call."""
    from engine import serve as engine_serve

    openai = spec["client"] == "openai"
    path = "/v1/completions" if openai else "/generate"
    if "token_ids_logprob" in batch:
        # The HTTP schema takes no None in a batch's id lists; SGLang reads
        # an empty list as None.
        batch = batch | {"token_ids_logprob": [ids or [] for ids in batch["token_ids_logprob"]]}
    server, port, startup_s = engine_serve.start_server(engine_serve.engine_args(spec))
    results = []
    try:
        for i in range(spec["calls"]):
            if i == 1:
                on_warm()
            sent = time.perf_counter()
            outs = engine_serve.post_json(f"http://127.0.0.1:{port}{path}", batch, timeout=600)
            seconds = time.perf_counter() - sent
            results.append({"s": seconds, "answers": outs})
        on_done(server.pid, os.getpid())
        for call in results:
            if openai:
                call["answers"] = openai_answers(call["answers"])
            else:
                call["answers"] = [engine_serve.answer(o) for o in call["answers"]]
    finally:
        engine_serve.stop_server(server)
    return startup_s, results


def serve(spec_path: Path) -> int:
    """One engine: start it, a warm-up call and the timed calls, every call's
    answers and time written out, and what each of its processes did over
    the timed calls. Runs in its own process, never imports flatgather (the
    environment decides whether the engine has it)."""
    from engine import serve as engine_serve  # tests/engine/serve.py: args, answers

    spec = json.loads(spec_path.read_text())
    batch = make_batch(spec)
    counts = Path(os.environ["FLATGATHER_BENCH_COUNTS"])
    processes: dict = {}

    import sitecustomize  # engine_site's: this process writes its own snapshots

    sitecustomize.MANUAL = True

    def on_warm() -> None:
        # After the warm-up call, before the timed ones: the counters'
        # window is the timed calls alone, this process's exactly.
        mark(counts, "before")
        sitecustomize.snapshot("before")

    def on_done(main_pid: int, client_pid: int | None) -> None:
        sitecustomize.snapshot("after")
        mark(counts, "after")
        processes.update(window(counts, main_pid, client_pid))

    if spec["client"] in ("http", "openai"):
        startup_s, results = _serve_http(spec, batch, on_warm, on_done)
    else:
        import sglang

        started = time.perf_counter()
        engine = sglang.Engine(**engine_serve.engine_args(spec))
        startup_s = time.perf_counter() - started
        results = []
        try:
            for i in range(spec["calls"]):
                if i == 1:
                    if spec.get("freeze_gc"):
                        # What launch_server does after its warm-up: every
                        # process's objects so far out of the collector's
                        # reach (SGLang's own Engine.freeze_gc).
                        engine.freeze_gc()
                    on_warm()
                sent = time.perf_counter()
                outs = engine.generate(**batch)
                seconds = time.perf_counter() - sent
                results.append({"s": seconds, "answers": outs})
            on_done(os.getpid(), None)
        finally:
            engine.shutdown()
        # Outside the window: in this process, the tokenizer manager's.
        for call in results:
            call["answers"] = [engine_serve.answer(o) for o in call["answers"]]
    out = {"startup_s": startup_s, "calls": results, "processes": processes}
    Path(spec["out"]).write_text(json.dumps(out))
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
    def __init__(self, work: Path, models: Path, args) -> None:
        from engine import harness

        self.harness = harness
        self.work = work
        self.target, self.draft = harness.make_models(models)
        self.calls = args.calls
        self.client = args.client
        self.shape = args.shape
        # The OpenAI endpoints decode every token's text: a tokenizer.
        self.texts = args.texts or args.client == "openai"
        self.freeze_gc = args.freeze_gc
        self.reference: dict[tuple[int, str], tuple[str, list[list]]] = {}
        """Per size and kind of answer (with logprobs, or the floor's), the
        first engine's tag and its answers to each call."""
        self.output_ids: dict[int, tuple[str, list[list]]] = {}
        """Per size, the first engine's output ids to each call: every side's
        must equal them, the floor's included."""
        self.compared = 0
        self.on_lines: Counter[str] | None = None

    def engine(self, running: int, side: str, round_: str, profile: str | None) -> dict:
        """One engine of one side; ``profile`` is None (bare), ``"scheduler"``
        (the engine tests' scheduler profile) or ``"processes"`` (cProfile in
        every process)."""
        flatgather = side == "on"
        tag = f"{running}-{round_}-{side}"
        out = self.work / f"{tag}.json"
        spec = {
            "scenario": "plain",
            "target": str(self.target),
            "draft": str(self.draft),
            "out": str(out),
            "requests": running,
            "shape": self.shape,
            "floor": side == "floor",
            "client": self.client,
            "engine": engine_settings(running, self.shape)
            # With texts the server loads the tests' tokenizer, on every side.
            | ({"skip_tokenizer_init": False} if self.texts else {}),
            "texts": self.texts,
            "chunked_prefill_size": 8192,
            "calls": 1 + self.calls,
            "freeze_gc": self.freeze_gc,
        }
        spec_path = self.work / f"{tag}.spec.json"
        spec_path.write_text(json.dumps(spec))
        env = self.harness.environment("plain", flatgather, self.work / f"{tag}.trace")
        # Bare timing: none of the harness's instruments (the trace wraps
        # flatgather's functions, on one side only); the profile alone, and
        # only where asked for. The bench's own counters (engine_site) run
        # on every side of every round: a wrapper per message sent, and a
        # thread that wakes 20 times a second.
        for name in [k for k in env if k.startswith("FLATGATHER_ENGINE_")]:
            del env[name]
        counts = self.work / f"{tag}.counts"
        # A kept --workdir holds an earlier run's engines' snapshots, under
        # the same tag: they would count as this engine's processes.
        shutil.rmtree(counts, ignore_errors=True)
        counts.mkdir(parents=True)
        env["PYTHONPATH"] = os.pathsep.join([str(SITE), env["PYTHONPATH"]])
        env["FLATGATHER_BENCH_COUNTS"] = str(counts)
        profile_path = self.work / f"{tag}.profile.json"
        if profile == "scheduler":
            env["FLATGATHER_ENGINE_PROFILE"] = str(profile_path)
        elif profile == "processes":
            env["FLATGATHER_BENCH_CPROFILE"] = "1"
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
            raise Failed(
                f"the {SIDE_NAMES[side]} engine ({tag}) failed ({proc.returncode}):\n{tail}"
            )
        self._check_side(flatgather, tag, _flatgather_lines(log))
        result = json.loads(out.read_text())
        calls = [c["answers"] for c in result["calls"]]
        self._compare_ids(running, tag, calls)
        digests = self._compare(running, "floor" if side == "floor" else "logprobs", tag, calls)
        timed = [c["s"] for c in result["calls"][1:]]
        seconds = statistics.median(timed)
        tokens = sum(int(a["completion_tokens"]) for a in result["calls"][0]["answers"])
        served = running * self.calls
        processes = result["processes"]
        missing = [role for role in ROLES if role not in processes]
        if missing:
            raise Failed(f"{tag}: no counters from the {', '.join(missing)}")
        row = {
            "s": seconds,
            "calls_s": [c["s"] for c in result["calls"]],
            "startup_s": result["startup_s"],
            "requests_per_s": running / seconds,
            "tokens_per_s": tokens / seconds,
            "answers_sha256": digests,
            # Per request served over the timed calls, per process.
            "per_request": {
                role: {
                    "bytes": p["bytes"] / served,
                    "gc0": p["gc_collections"][0] / served,
                    "gc": [n / served for n in p["gc_collections"]],
                    "cpu_ms": 1e3 * p["cpu_s"] / served,
                    # The collector's share apart: full collections are few
                    # and dear, and fall in or out of a window by chance.
                    "gc_ms": 1e3 * sum(p["gc_s"]) / served,
                    "cpu_net_ms": 1e3 * (p["cpu_s"] - sum(p["gc_s"])) / served,
                    "full_collections": p["gc_collections"][2],
                    "full_gc_ms": 1e3 * p["gc_s"][2] / max(p["gc_collections"][2], 1),
                    "pickled": {k: v[1] / served for k, v in p.get("pickled", {}).items()},
                    "pickle_ms": 1e3 * sum(v[2] for v in p.get("pickled", {}).values()) / served,
                    # The timed stages (the scheduler's steps, the model runner's
                    # forward and sampling), where this process ran them: 0 elsewhere.
                    **{
                        f"{stage}_ms": 1e3 * seconds / served
                        for stage, (_, seconds) in p["stages"].items()
                    },
                    "stage_calls": {stage: n for stage, (n, _) in p["stages"].items()},
                }
                for role, p in processes.items()
            },
        }
        if profile == "scheduler":
            if not profile_path.exists():
                raise Failed(f"{tag}: the engine wrote no profile to {profile_path}")
            row |= _profile(json.loads(profile_path.read_text()))
        elif profile == "processes":
            row["processes"] = {}
            for role in ROLES:
                if "profile" not in processes[role]:
                    raise Failed(f"{tag}: the {role} wrote no profile")
                full = processes[role]["profile"]
                (self.work / f"{tag}.{role.replace(' ', '-')}.cprofile.json").write_text(
                    json.dumps(full)
                )
                row["processes"][role] = process_profile(full, processes[role]["cpu_s"], served)
        return row

    def _compare_ids(self, running: int, tag: str, calls: list[list]) -> None:
        """The output ids of every call against the first engine's, whatever
        the side: asking for logprobs must not change what is generated."""
        ids = [[a["output_ids"] for a in answers] for answers in calls]
        first, reference = self.output_ids.setdefault(running, (tag, ids))
        if first == tag:
            return
        for i, (got, expected) in enumerate(zip(ids, reference, strict=True)):
            for j, (a, b) in enumerate(zip(expected, got, strict=True)):
                if a != b:
                    raise Failed(
                        f"{tag}, call {i}, request {j}: output ids {b[:8]}..., "
                        f"{first} generated {a[:8]}..."
                    )

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

    def _compare(self, running: int, kind: str, tag: str, calls: list[list]) -> list[str]:
        """Every call's answers against the first engine's answers of the
        same kind to the same call, bit for bit (floats travel as their
        repr)."""
        first, reference = self.reference.setdefault((running, kind), (tag, calls))
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


LOGPROB_FUNCTIONS = {
    # tokenizer manager: the meta_info's logprob fields
    "convert_logprob_style",
    "add_logprob_to_meta_info",
    "detokenize_logprob_tokens",
    "detokenize_top_logprobs_tokens",
    "_build_flat_top_logprobs_fields",
    "_build_flat_top_logprobs_fields_from_arrays",
    # scheduler: the forward's logprob gathers and the results' processing
    "_get_pruned_states",
    "get_top_logprobs",
    "get_token_ids_logprobs",
    "get_token_ids_logprobs_chunk",
    "get_token_ids_logprobs_prefill",
    "copy_to_cpu",
    "move_logprobs_to_cpu",
    "_normalize_decode_outputs",
    "add_logprob_return_values",
    "add_input_logprob_return_values",
}
"""Functions, by name, of SGLang's (or flatgather's in their place) whose work
is the logprobs; their time is counted once where one calls another
directly."""
STREAM_FUNCTIONS = {"stream_output", "stream_output_generation", "_stream_output_generation"}
"""The scheduler's output streaming: building the messages to the
detokenizer (pickling apart)."""
PICKLE = ("<built-in method _pickle.dumps>", "<built-in method _pickle.loads>")
WAITS = re.compile(
    r"^<.*(poll|sleep|select|acquire|wait)"
    r"|entrypoints/engine\.py:\d+\(generate\)"
    r"|uvicorn/(main|server)\.py:\d+\((run|serve)\)"
)
"""Time that is waiting, not work, left out of the top lists: the blocking
built-ins, and the code that runs uvloop's loop (its waits are C code inside
no built-in the profiler sees, so they land in the caller's own time)."""
STEP_FUNCTIONS = {"run_batch", "process_batch_result"}
"""The scheduler's step: its shares are of this time, not of its CPU time,
which holds its idle loop (it spins between batches)."""
IDLE_FUNCTIONS = {"on_idle"}
LOOP_FUNCTIONS = {
    "ingest_requests",
    "recv_requests",
    "get_next_batch_to_run",
    "on_idle",
    "event_loop_normal",
    "event_loop_overlap",
}
"""The scheduler's event loop's own steps besides the batch's."""
NOT_LISTED = {"wrapper", "on_idle", "publish_load_snapshot", "get_loads", "is_fully_idle"}
"""Left out of the top lists: decorators (their time is the function they
wrap) and the scheduler's idle loop (given apart)."""
TOP = 6


def _name(label: str) -> str | None:
    """The function name of a profile label of the server's code."""
    if label.startswith("<") or ("sglang" not in label and "flatgather" not in label):
        return None
    return label[label.rfind("(") + 1 : -1]


def _short(label: str) -> str:
    if label.startswith("<"):
        return label.removeprefix("<built-in method ").removeprefix("<method ").rstrip(">")
    path, _, rest = label.partition(":")
    for root in ("flatgather/", "sglang/"):  # flatgather's own sglang/ package inside
        if root in path:
            path = root + path.rsplit(root, 1)[1]
            break
    else:
        path = Path(path).name
    return f"{rest[rest.rfind('(') + 1 : -1]} ({path}:{rest[: rest.find('(')]})"


def _union_s(profile: dict, names: set[str]) -> float:
    """The time inside any of the named functions, a call of one by another
    counted once (direct calls; deeper nesting would count twice)."""
    members = {label for label in profile if _name(label) in names}
    total = sum(profile[label][1] for label in members)
    nested = sum(
        s
        for label in members
        for callee, s in profile[label][3].items()
        if callee in members and callee != label
    )
    return total - nested


def process_profile(profile: dict, cpu_s: float, served: int) -> dict:
    """One process's profile over the timed calls: the shares of its CPU time
    in the logprob functions, the output streaming and pickling, and its top
    functions by own time and by time inside (the server's code)."""
    pickle_s = sum(profile[label][1] for label in PICKLE if label in profile)
    work = {k: v for k, v in profile.items() if not WAITS.search(k) and _name(k) not in NOT_LISTED}
    step_s = _union_s(profile, STEP_FUNCTIONS)
    if step_s > 0:
        # The scheduler's lists: its step's functions alone (what the step
        # calls, at any depth), not the idle loop's polling between batches;
        # a decorator shared by both is crossed, not the loop's own methods.
        reached = {label for label in profile if _name(label) in STEP_FUNCTIONS}
        frontier = list(reached)
        while frontier:
            for callee in profile.get(frontier.pop(), [0, 0, 0, {}])[3]:
                if callee not in reached and _name(callee) not in LOOP_FUNCTIONS | NOT_LISTED:
                    reached.add(callee)
                    frontier.append(callee)
        work = {k: v for k, v in work.items() if k in reached}
    whole = max(step_s if step_s > 0 else cpu_s, 1e-9)
    by_own = sorted(work, key=lambda k: -work[k][2])[:TOP]
    by_inside = sorted((k for k in work if _name(k)), key=lambda k: -work[k][1])[:TOP]
    return {
        "cpu_ms": 1e3 * cpu_s / served,
        "of": "step" if step_s > 0 else "cpu",
        "whole_ms": 1e3 * whole / served,
        "idle_ms": 1e3 * _union_s(profile, IDLE_FUNCTIONS) / served,
        "logprob_ms": 1e3 * _union_s(profile, LOGPROB_FUNCTIONS) / served,
        "logprob_share": _union_s(profile, LOGPROB_FUNCTIONS) / whole,
        "stream_share": _union_s(profile, STREAM_FUNCTIONS) / whole,
        "pickle_share": pickle_s / whole,
        "top_own": [[_short(k), 1e3 * work[k][2] / served] for k in by_own],
        "top_inside": [[_short(k), 1e3 * work[k][1] / served] for k in by_inside],
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


def summarize(rows: list[dict], profiled: list[dict], cprofiled: list[dict]) -> dict:
    ratios = [r["off"]["s"] / r["on"]["s"] for r in rows]
    others = [r["others_cores"] for r in rows if r["others_cores"] is not None]
    own = [r["own_cores"] for r in rows if r["own_cores"] is not None]
    everything = rows + profiled + cprofiled
    out = {
        # Checked: each call's answers equal the first engine's to that call.
        # Recorded: whether calls agree with one another too (1: one set).
        "distinct_answers": len(
            {d for r in everything for side in ("off", "on") for d in r[side]["answers_sha256"]}
        ),
        "floor_distinct_answers": len(
            {d for r in everything for d in r["floor"]["answers_sha256"]}
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
        # Time with logprobs over time without: 1.0, the logprobs are free.
        over = [r[side]["s"] / r["floor"]["s"] for r in rows]
        out[f"{side}_over_floor"] = interval(over)
        out[f"{side}_over_floor_ratios"] = over
    for side in SIDES:
        for key in ("requests_per_s", "tokens_per_s"):
            out[f"{side}_{key}"] = statistics.median(r[side][key] for r in rows)
        out[f"{side}_per_request"] = {
            role: {
                key: statistics.median(r[side]["per_request"][role][key] for r in rows)
                for key in (
                    *(  # timed from 7e4526d on
                        k
                        for k in ("streaming_ms",)
                        if all(k in r[side]["per_request"][role] for r in rows)
                    ),
                    "bytes",
                    "gc0",
                    "cpu_ms",
                    "pickle_ms",
                    "gc_ms",
                    "cpu_net_ms",
                    "full_collections",
                    "full_gc_ms",
                    "step_ms",
                    "forward_ms",
                    "sample_ms",
                )
            }
            for role in ROLES
        }
        if profiled:
            for key in ("replaced_share", "replaced_s", "step_s", "gc_s", "requests_per_s"):
                out[f"{side}_profiled_{key}"] = statistics.median(r[side][key] for r in profiled)
            # The profiler's cost: the profiled engines' throughput against
            # the bare ones' (below 1: the profile slows its side down).
            out[f"{side}_profiled_speed"] = (
                out[f"{side}_profiled_requests_per_s"] / out[f"{side}_requests_per_s"]
            )
        if cprofiled:
            # The first profiled round's: top lists do not take a median.
            out[f"{side}_processes"] = cprofiled[0][side]["processes"]
            out[f"{side}_cprofiled_speed"] = (
                statistics.median(r[side]["requests_per_s"] for r in cprofiled)
                / out[f"{side}_requests_per_s"]
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


def _served_by(args) -> str:
    if args.client == "http":
        return "`python -m sglang.launch_server`, one batch `POST /generate` a call (`urllib`)"
    if args.client == "openai":
        return (
            "`python -m sglang.launch_server`, one batch `POST /v1/completions` a call "
            "(`urllib`), every prompt as token ids with `echo`, `logprobs: 5`, `max_tokens: 1` "
            "(the floor: `echo` alone)"
        )
    frozen = (
        ", `Engine.freeze_gc()` after the warm-up call on every side (what `launch_server` "
        "does after its warm-up)"
        if getattr(args, "freeze_gc", False)
        else ""
    )
    return f"`sglang.Engine`, one `Engine.generate` call a batch{frozen}"


def _workload(args) -> str:
    texts = (
        "; every side loads the engine tests' byte-level tokenizer, and each request with "
        "logprobs asks for every token's text (`return_text_in_logprobs`)"
        if args.texts
        else ""
    )
    if args.client == "openai":
        texts = (
            "; every side loads the engine tests' byte-level tokenizer (the OpenAI endpoints "
            "decode every token's text, and the echoed prompts)"
        )
    return _shape_words(args) + texts


def _shape_words(args) -> str:
    if args.shape == "echo":
        return (
            f"- every request (`--shape echo`, loglikelihood scoring): prompts of "
            f"{ECHO_LEN[0]}-{ECHO_LEN[1]} tokens, 1 output token, input logprobs from token 0 "
            "with the top 5, no token ids; all N sent in one call"
        )
    return (
        "- every request: input logprobs from token 0, the top 5, 3 token ids, prompts of "
        "16-64 tokens, 16-32 output tokens (`ignore_eos`); all N sent in one call"
    )


def _each_process(results: dict):
    """``(running, side, role, figures)`` for every process of every side at
    every size, in the tables' order."""
    for running, s in results.items():
        for side in SIDES:
            for role in ROLES:
                yield running, side, role, s[f"{side}_processes"][role]


def _per_request_rows(results: dict, cells) -> list[str]:
    """A table row per size and side: ``cells`` of its per-request figures."""
    return [
        f"| {running} | {SIDE_NAMES[side]} " + cells(s[f"{side}_per_request"]) + "|"
        for running, s in results.items()
        for side in SIDES
    ]


def cost_parts(pr: dict) -> dict[str, float]:
    """Where a side's CPU per request goes, in ms, its collector apart: in
    the scheduler's steps, the model forward, the sampling and the rest (the
    result processing, the output streaming, the copies to the host); the
    scheduler outside its steps (receiving, scheduling, its idle loop); and
    the tokenizer manager."""
    sched = pr["scheduler"]
    streaming = sched.get("streaming_ms")  # timed by runs from 7e4526d on
    parts = {
        "the model forward": sched["forward_ms"],
        "sampling": sched["sample_ms"],
        **({} if streaming is None else {"the output streaming": streaming}),
        "the rest of the step": sched["step_ms"]
        - sched["forward_ms"]
        - sched["sample_ms"]
        - (streaming or 0.0),
        "the scheduler outside its steps": sched["cpu_net_ms"] - sched["step_ms"],
        "the tokenizer manager": pr["tokenizer manager"]["cpu_net_ms"],
    }
    return parts | {ALL[len(parts)]: sum(parts.values())}


ALL = {5: "all five", 6: "all six"}


LEAST_SHAPES = {("engine", "logprobs", False): "generate", ("openai", "echo", True): "echo"}
"""The bench's workloads whose least answer ``benches/answer_floor.py``
builds: ``Engine.generate`` with logprobs, and echo scoring over the OpenAI
endpoint (its ``--texts`` is implied)."""


def least(shape: str, running: int) -> dict:
    """``benches/answer_floor.py``'s least answer for the ``running``
    requests this bench sends (their prompt and output lengths), measured in
    this process after the engines' rounds (the engine tests' vocabulary;
    its objects checked against the release's own functions)."""
    import answer_floor  # beside this script, first on sys.path
    import torch
    from engine import models

    torch.set_num_threads(1)
    release = answer_floor.release_functions()
    batch = make_batch(
        {
            "shape": "echo" if shape == "echo" else "logprobs",
            "requests": running,
            "client": "engine",
            "floor": False,
        }
    )
    new = [p["max_new_tokens"] for p in batch["sampling_params"]]
    lens = [(len(ids), o) for ids, o in zip(batch["input_ids"], new, strict=True)]
    row = answer_floor.measure(shape, running, 9, models.VOCAB, release, lens)
    return row | {"oracle": None if release is None else release[0]}


def least_lines(results: dict) -> list[str]:
    """Each side's logprob cost against the least a logprob answer costs."""
    lines = []
    for running, s in results.items():
        row = s.get("least")
        if row is None:
            continue
        floor = cost_parts(s["floor_per_request"])
        whole = floor[ALL[len(floor) - 1]]
        parts = ", ".join(f"{p} {v:.2f}" for p, v in row["ms"].items() if p != "client's parse")
        over = {
            side: cost_parts(s[f"{side}_per_request"])[ALL[len(floor) - 1]] - whole
            for side in ("on", "off")
        }
        least_ms = row["server_ms"]
        client = row["ms"].get("client's parse")
        lines += [
            "",
            f"**The least at {running} running** (`benches/answer_floor.py`, run in this "
            f"process after the rounds: the same requests' logprob rows as bare torch calls, "
            f"one hand-over of flat arrays, the objects the client receives"
            + (
                f", checked equal to what SGLang {row['oracle']}'s own functions make of the "
                "same values"
                if row.get("oracle")
                else ""
            )
            + f"): {least_ms:.2f} ms a request ({parts}"
            + (
                f"; the client's own parse of the JSON, {client:.2f} ms, is not in the "
                "server's processes and is left out"
                if client is not None
                else ""
            )
            + f"). On the floor's {whole:.2f} ms a request (all of the table's parts), that is "
            f"{(whole + least_ms) / whole:.3f}x, the least the release's answer costs on this "
            f"engine but for a cheaper way to do the same work than these bare calls. "
            f"flatgather's logprobs cost {over['on']:.2f} ms a "
            f"request over the floor ({(whole + over['on']) / whole:.3f}x), "
            f"{over['on'] - least_ms:+.2f} ms from the least; stock's {over['off']:.2f} ms "
            f"({(whole + over['off']) / whole:.3f}x), {over['off'] - least_ms:+.2f} ms from it.",
        ]
    return lines


def cost_lines(results: dict) -> list[str]:
    """The logprobs' cost per request by where it lies: each side's parts,
    and the two logprob sides' excess over the floor's."""
    names = list(cost_parts(next(iter(results.values()))["floor_per_request"]))
    lines = [
        "",
        "**Where the logprobs cost** (the same rounds and medians, the collector apart): "
        "the scheduler's CPU ms per request split by its steps (`Scheduler.run_batch` and "
        "`process_batch_result`) and, inside them, the model runner's two stages, each "
        "timed by the clock of the thread that ran it: *the model forward* (`ModelRunner."
        "forward`: the model, the logits processor, the input logprobs and flatgather's "
        "pruning), *sampling* (`ModelRunner.sample` and `compute_logprobs_only`: the "
        "sampler, with the output logprobs' vocabulary-wide `log_softmax`, top-k and id "
        "gathers, and flatgather's gathers there), "
        + (
            "*the output streaming* (`stream_output`: each step's output message built, a "
            "dozen logprob fields a request, pickled and sent), *the rest of the step* (the "
            "result processing, the copies to the host), "
            if "the output streaming" in names
            else "*the rest of the step* (the result processing, the output streaming, the "
            "copies to the host), "
        )
        + "*the scheduler outside "
        "its steps* (its CPU without the collector, less its steps: receiving, scheduling, "
        "and its idle loop, which spins between batches, so that while the scheduler waits "
        "on the tokenizer manager this part grows with no logprob work done), and the "
        "tokenizer manager's CPU without the collector. For stock and flatgather, the part "
        "over the floor's (what the logprobs cost there) in brackets.",
        "",
        "| running requests | side | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for running, s in results.items():
        floor = cost_parts(s["floor_per_request"])
        for side in SIDES:
            parts = cost_parts(s[f"{side}_per_request"])
            cells = [
                f"{parts[n]:.2f}"
                if side == "floor"
                else f"{parts[n]:.2f} ({parts[n] - floor[n]:+.2f})"
                for n in names
            ]
            lines.append(f"| {running} | {SIDE_NAMES[side]} | " + " | ".join(cells) + " |")
    for running, s in results.items():
        floor = cost_parts(s["floor_per_request"])
        over = {n: v - floor[n] for n, v in cost_parts(s["on_per_request"]).items()}
        whole = over.pop(ALL[len(over) - 1])
        if whole <= 0:
            continue
        shares = ", ".join(f"{n} {v:+.2f} ms ({v / whole:.0%})" for n, v in over.items())
        lines += [
            "",
            f"At {running} running, flatgather's logprobs cost {whole:.2f} ms a request over "
            f"the floor: {shares}.",
        ]
    return lines


def markdown(release: str, results: dict, args, command: str, machine: dict) -> str:
    import platform

    import torch

    lines = [
        "# A real engine: flatgather off and on, and the floor",
        "",
        "Generated by the command below (`benches/engine.py`); every ratio compares sides "
        "measured in the same run.",
        "",
        "```sh",
        command,
        "```",
        "",
        f"- SGLang {release}, CPU server: {_served_by(args)}; no speculative decoding "
        f"(torch-native attention), the tiny random Llama of `tests/engine`; torch "
        f"{torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} cores, "
        "1 torch thread per process",
        _workload(args),
        "- **three sides** in every round, the order rotating from round to round: *stock* "
        "(`FLATGATHER_SGLANG=0`), *flatgather* (`FLATGATHER_SGLANG=1`), and the *floor*: "
        "stock serving the same prompts with the same output lengths (`ignore_eos`) and no "
        + (
            "logprobs asked for (the prompts still echoed), what the "
            if args.client == "openai"
            else "logprobs asked for (`return_logprob` false, no top-k, no token ids), what the "
        )
        + "server costs when logprobs cost nothing; no side has a prefix cache "
        "(`disable_radix_cache`: every call repeats the prompts, which only the floor "
        "could take from it)",
        f"- **timing:** {machine['rounds']} rounds per size"
        + (
            ""
            if machine["rounds"] == args.rounds
            else f" (of the {args.rounds} asked for: `--max-minutes` stopped it there)"
        )
        + ", each one engine per side, no profiler and no trace attached (only the bench's "
        "message and collection counters, on every side alike); an engine serves one "
        f"warm-up call, then {args.calls} timed calls, and its time is their median. Each "
        "ratio is a time over another side's time in the same round; a figure is the "
        "geometric mean of the rounds' ratios with its 95% t-interval over rounds",
        f"- **profiles:** {args.profile_rounds} round(s) per size with the scheduler's "
        f"profile and {args.cprofile_rounds} with `cProfile` in every process of the server, "
        "after the timing rounds and apart from them; their throughput over the bare rounds' "
        "is the profilers' cost",
        "- **answers:** every call of every engine, warm-up and timed, timing and profiled "
        "rounds, stock and flatgather, was compared bit for bit with the first engine's "
        "answers to the same call, and the floor's with the first floor engine's; every "
        "engine's output ids, the floor's included, equal the first engine's "
        f"({machine['compared']} calls compared, all identical: a difference stops the run); "
        + ", ".join(
            f"{s['distinct_answers']} distinct set(s) of answers with logprobs and "
            f"{s['floor_distinct_answers']} without at {n} running"
            for n, s in results.items()
        )
        + " over all calls. No stock or floor engine logged anything from flatgather; every "
        "flatgather engine logged that it was active, the same lines each time",
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
        + "; ".join(
            f"at {n} running requests, {_plainly(s)}; logprobs cost stock "
            f"{_fmt_interval(s['off_over_floor'])} the floor's time, flatgather "
            f"{_fmt_interval(s['on_over_floor'])}"
            for n, s in results.items()
        )
        + ".",
        "",
        "| running requests | req/s stock | req/s flatgather | req/s floor "
        "| flatgather / stock, geometric mean (95% interval) | rounds flatgather faster "
        "| the interval | stock / floor | flatgather / floor "
        "| tokens/s stock | tokens/s flatgather |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for running, s in results.items():
        lines.append(
            f"| {running} | {s['off_requests_per_s']:.1f} | {s['on_requests_per_s']:.1f} "
            f"| {s['floor_requests_per_s']:.1f} "
            f"| {_fmt_interval(s['ratio'])} | {s['on_faster']} of {s['rounds']} "
            f"| {_verdict(s)} | {_fmt_interval(s['off_over_floor'])} "
            f"| {_fmt_interval(s['on_over_floor'])} "
            f"| {s['off_tokens_per_s']:.0f} | {s['on_tokens_per_s']:.0f} |"
        )
    lines += [
        "",
        "- *flatgather / stock*: stock's time over flatgather's; above 1, flatgather is faster.",
        "- *stock / floor*, *flatgather / floor*: that side's time over the floor's, the "
        "cost of the logprobs; 1.00 means logprobs are free.",
        "",
        "The rounds' ratios, in order (flatgather / stock; stock / floor; flatgather / floor):",
        "",
    ]
    for running, s in results.items():
        lines.append(
            f"- {running}: "
            + "; ".join(
                ", ".join(f"{r:.3f}" for r in s[key])
                for key in ("ratios", "off_over_floor_ratios", "on_over_floor_ratios")
            )
        )
    lines += [
        "",
        "**What a request costs each process** (timing rounds, median over rounds, per "
        "request over the timed calls): the bytes each process sent on its sockets (the "
        "messages as they went on the wire: the scheduler's outputs, and the detokenizer's; "
        + (
            "with a tokenizer, the scheduler's outputs go through the detokenizer), "
            if args.texts or args.client == "openai"
            else "the engine runs without a tokenizer (`skip_tokenizer_init`), so the scheduler "
            "sends its outputs straight to the tokenizer manager and the detokenizer idles), "
        )
        + "the garbage collector's generation-0 collections in each process (one every 700 "
        "net allocations of container objects, so a count of the Python objects a request "
        "makes), and each process's CPU time.",
        "",
        "| running requests | side | bytes sent: scheduler "
        "| detokenizer | gen-0 collections: tokenizer manager "
        "| scheduler | detokenizer | CPU ms: tokenizer manager | scheduler | detokenizer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += _per_request_rows(
        results,
        lambda pr: (
            f"| {pr['scheduler']['bytes']:,.0f} | {pr['detokenizer']['bytes']:,.0f} "
            + "".join(f"| {pr[role]['gc0']:.2f} " for role in ROLES)
            + "".join(f"| {pr[role]['cpu_ms']:.2f} " for role in ROLES)
        ),
    )
    lines += [
        "",
        "**The garbage collector apart** (the same rounds and medians): the full "
        "(generation-2) collections in one engine's timed calls and the CPU ms each took "
        "(a full collection walks every object of the process, so it costs the same "
        "whichever request set it off, and whether one falls inside the timed calls is "
        "chance: one more adds its whole cost to the process's CPU per request), the CPU "
        "ms per request spent collecting (any generation), and each process's CPU ms per "
        "request without it. Each collection is timed by the clock of the thread that "
        "ran it.",
        "",
        "| running requests | side | full collections: tokenizer manager | scheduler "
        "| detokenizer | ms each: tokenizer manager | scheduler | detokenizer "
        "| GC ms per request: tokenizer manager | scheduler | detokenizer "
        "| CPU ms without GC: tokenizer manager | scheduler | detokenizer |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += _per_request_rows(
        results,
        lambda pr: (
            "".join(f"| {pr[role]['full_collections']:g} " for role in ROLES)
            + "".join(
                f"| {pr[role]['full_gc_ms']:.0f} " if pr[role]["full_collections"] else "| - "
                for role in ROLES
            )
            + "".join(f"| {pr[role]['gc_ms']:.3f} " for role in ROLES)
            + "".join(f"| {pr[role]['cpu_net_ms']:.2f} " for role in ROLES)
        ),
    )
    lines += cost_lines(results)
    lines += least_lines(results)
    if args.profile_rounds:
        lines += [
            "",
            "**The share of step time** (the scheduler's profile, its rounds only) is the "
            "time the scheduler spent "
            "inside the functions whose loops flatgather replaces (`_get_pruned_states`, the "
            "token-id and top-k logprob helpers, `copy_to_cpu`, `move_logprobs_to_cpu`, "
            "`_normalize_decode_outputs`), over its `run_batch` plus `process_batch_result` "
            "time, warm-up call included; on each side it is whatever object is in place, the "
            "release's or flatgather's. The garbage collector's pauses are counted on their "
            "own, not in the function they fall in. The last columns compare the "
            "profiled rounds' throughput with the bare rounds' median: below 1, the profile "
            "slowed its side down (with few profiled rounds, a rough measure).",
            "",
            "| running requests | replaced functions' share of step time, stock "
            "| same, flatgather | same, floor | GC pauses, stock | same, flatgather "
            "| same, floor | profiled / bare req/s, stock (the profiler's cost) "
            "| same, flatgather | same, floor |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for running, s in results.items():
            lines.append(
                f"| {running} "
                + "".join(
                    f"| {100 * s[f'{side}_profiled_replaced_share']:.1f}% "
                    f"({1e3 * s[f'{side}_profiled_replaced_s']:.0f} ms of "
                    f"{1e3 * s[f'{side}_profiled_step_s']:.0f}) "
                    for side in SIDES
                )
                + "".join(f"| {1e3 * s[f'{side}_profiled_gc_s']:.0f} ms " for side in SIDES)
                + "".join(f"| {s[f'{side}_profiled_speed']:.3f} " for side in SIDES)
                + "|"
            )
    if args.cprofile_rounds:
        lines += [
            "",
            "**Every process's profile** (`cProfile` in the main thread of each process of "
            "the server, its rounds only, the timed calls alone, the first such round; "
            "the profiler slows Python code most, so the shares lean towards it; its clock "
            "is the main thread's CPU time, so waiting and being descheduled count nothing). "
            "Each share "
            "is of the process's CPU time, the scheduler's of its step (`run_batch` plus "
            "`process_batch_result`: between batches it spins in its idle loop, `on_idle`, "
            "given apart): *logprob functions* is the time inside SGLang's "
            "(or flatgather's, in their place) logprob functions, the tokenizer manager's "
            "`convert_logprob_style`, `add_logprob_to_meta_info` and `detokenize_*` and the "
            "scheduler's gathers and `add_*logprob_return_values` (a direct call of one by "
            "another counted once); *output streaming* the scheduler's `stream_output`; "
            "*pickling* `pickle.dumps` and `pickle.loads` (the messages between processes).",
            "",
            "| running requests | side | process | CPU ms per request (profiled) "
            "| the share's whole, ms per request | logprob functions, ms (share) "
            "| output streaming | pickling | idle loop, ms |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for running, side, role, pp in _each_process(results):
            lines.append(
                f"| {running} | {SIDE_NAMES[side]} | {role} | {pp['cpu_ms']:.2f} "
                f"| {pp['whole_ms']:.2f} ({'step' if pp['of'] == 'step' else 'CPU'}) "
                f"| {pp['logprob_ms']:.2f} ({100 * pp['logprob_share']:.1f}%) "
                f"| {100 * pp['stream_share']:.1f}% "
                f"| {100 * pp['pickle_share']:.1f}% | {pp['idle_ms']:.2f} |"
            )
        lines += [
            "",
            "The profiled rounds' throughput over the bare rounds' (the profiler's cost): "
            + "; ".join(
                f"{running} running: "
                + ", ".join(
                    f"{SIDE_NAMES[side]} {s[f'{side}_cprofiled_speed']:.3f}" for side in SIDES
                )
                for running, s in results.items()
            )
            + ".",
            "",
            f"The top {TOP} functions of each process, in ms per request: by their own time "
            "(waits and decorators left out; the scheduler's, among the functions its step "
            "calls, at any depth, not its idle loop's polling), then by the time inside them "
            "and their callees (the server's code only); a function the step shares with the "
            "idle loop (the pool statistics) carries the time of both's calls. A process that "
            "did nothing in the window (the detokenizer, without a tokenizer) lists nothing.",
            "",
        ]
        for running, side, role, pp in _each_process(results):
            lines.append(
                f"- {running} running, {SIDE_NAMES[side]}, {role}: own: "
                + (", ".join(f"`{n}` {ms:.2f}" for n, ms in pp["top_own"]) or "nothing")
                + "; inside: "
                + (", ".join(f"`{n}` {ms:.2f}" for n, ms in pp["top_inside"]) or "nothing")
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
        f"[{running} running] {label} ({row['order']}): "
        + ", ".join(f"{SIDE_NAMES[side]} {row[side]['requests_per_s']:.1f}" for side in SIDES)
        + f" req/s; stock/flatgather time {row['off']['s'] / row['on']['s']:.3f}, "
        f"stock/floor {row['off']['s'] / row['floor']['s']:.3f}, "
        f"flatgather/floor {row['on']['s'] / row['floor']['s']:.3f}; "
        f"other processes {'?' if others is None else f'{others:.2f}'} cores; "
        f"{row['seconds']:.0f} s",
        file=sys.stderr,
        flush=True,
    )


def run_round(
    bench: Bench, usage: Usage, running: int, i: int, of: int, profile: str | None
) -> dict:
    """One engine per side, the order rotating from round to round."""
    started, before = time.perf_counter(), usage.snapshot()
    order = SIDES[i % 3 :] + SIDES[: i % 3]
    row: dict = {"order": ", ".join(SIDE_NAMES[side] for side in order)}
    kind = {None: "timed", "scheduler": "profiled", "processes": "cprofiled"}[profile]
    for side in order:
        row[side] = bench.engine(running, side, f"{kind}{i + 1}", profile)
    after = usage.snapshot()
    row["others_cores"] = others_cores(before, after)
    row["own_cores"] = own_cores(before, after)
    row["seconds"] = time.perf_counter() - started
    label = {"timed": "round", "profiled": "profiled round", "cprofiled": "cProfile round"}[kind]
    progress(running, f"{label} {i + 1}/{of}", row)
    return row


MIN_ROUNDS = 3
"""Timing rounds run whatever ``--max-minutes`` says: fewer and the interval
is not worth much."""

PROFILED_WEIGHT = {"scheduler": 1.2, "processes": 2.0}
"""A profiled round's length in timing rounds, for ``--max-minutes`` (cProfile
runs through each process's start-up too)."""


def measure(bench: Bench, usage: Usage, args) -> tuple[dict, dict, int]:
    """Rounds of every size in turn (a drift of the machine reaches every
    size alike), the timing rounds first, then the profiled ones; with
    ``--max-minutes``, no timing round starts that would leave too little
    time for the profiled rounds. Returns the results, the raw rows and the
    timing rounds run."""
    started = time.perf_counter()
    timing: dict[int, list] = {n: [] for n in args.running}
    profiled: dict[int, list] = {n: [] for n in args.running}
    cprofiled: dict[int, list] = {n: [] for n in args.running}
    after = (
        PROFILED_WEIGHT["scheduler"] * args.profile_rounds
        + PROFILED_WEIGHT["processes"] * args.cprofile_rounds
    )
    done = 0
    for i in range(args.rounds):
        if args.max_minutes and i >= MIN_ROUNDS:
            spent = time.perf_counter() - started
            if spent + spent / i * (1 + after) > 60 * args.max_minutes:
                print(
                    f"stopping after {i} of {args.rounds} timing rounds: "
                    f"--max-minutes {args.max_minutes:g}",
                    file=sys.stderr,
                    flush=True,
                )
                break
        for running in args.running:
            timing[running].append(run_round(bench, usage, running, i, args.rounds, None))
        done = i + 1
    for i in range(args.profile_rounds):
        for running in args.running:
            profiled[running].append(
                run_round(bench, usage, running, i, args.profile_rounds, "scheduler")
            )
    for i in range(args.cprofile_rounds):
        for running in args.running:
            cprofiled[running].append(
                run_round(bench, usage, running, i, args.cprofile_rounds, "processes")
            )
    results, raw = {}, {}
    for running in args.running:
        results[running] = summarize(timing[running], profiled[running], cprofiled[running])
        raw[running] = {
            "timing": timing[running],
            "profiled": profiled[running],
            "cprofiled": cprofiled[running],
        }
        s = results[running]
        print(
            f"[{running} running] flatgather / stock {_fmt_interval(s['ratio'])}: "
            f"{_verdict(s)}; stock / floor {_fmt_interval(s['off_over_floor'])}, "
            f"flatgather / floor {_fmt_interval(s['on_over_floor'])}",
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
        "--profile-rounds",
        type=int,
        default=1,
        help="rounds per size with the scheduler's profile, apart",
    )
    parser.add_argument(
        "--cprofile-rounds",
        type=int,
        default=1,
        help="rounds per size with cProfile in every process of the server, apart",
    )
    parser.add_argument(
        "--client",
        choices=("engine", "http", "openai"),
        default="engine",
        help="engine: sglang.Engine in the process; http: python -m sglang.launch_server "
        "and one POST /generate a call; openai: the same server and one POST "
        "/v1/completions a call (--shape echo: echo, logprobs 5, max_tokens 1)",
    )
    parser.add_argument(
        "--shape",
        choices=("logprobs", "echo"),
        default="logprobs",
        help="logprobs: 16-64-token prompts, 16-32 output tokens; echo: 100-300-token "
        "prompts, 1 output token (loglikelihood scoring)",
    )
    parser.add_argument(
        "--texts",
        action="store_true",
        help="with --client http: every side loads the tests' byte-level tokenizer, and the "
        "requests with logprobs ask for each token's text (return_text_in_logprobs)",
    )
    parser.add_argument(
        "--freeze-gc",
        action="store_true",
        help="with --client engine: after the warm-up call, Engine.freeze_gc() on every "
        "side (what launch_server does after its warm-up), so that a full collection no "
        "longer walks the objects made at start-up",
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
    if args.client == "openai" and args.shape != "echo":
        parser.error("--client openai sends the echo-scoring shape: give --shape echo")
    if args.freeze_gc and args.client != "engine":
        parser.error("--freeze-gc is for --client engine (launch_server freezes on its own)")
    if args.texts and args.client != "http":
        parser.error(
            "--texts needs --client http (Engine.generate takes no return_text_in_logprobs)"
        )
    if args.rounds < 1 or args.calls < 1 or min(args.profile_rounds, args.cprofile_rounds) < 0:
        parser.error(
            "--rounds and --calls must be 1 or more, --profile-rounds and --cprofile-rounds "
            "0 or more"
        )

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
        bench = Bench(work, work / "models", args)
        try:
            results, raw, rounds = measure(bench, usage, args)
        except Failed as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        compared, on_lines = bench.compared, sorted((bench.on_lines or Counter()).elements())
    least_shape = LEAST_SHAPES.get((args.client, args.shape, args.texts))
    if least_shape is not None:
        for running in args.running:
            results[running]["least"] = least(least_shape, running)
    load_after = os.getloadavg()[0]
    warnings = busy_warnings(load_before, results)
    minutes = (time.perf_counter() - started) / 60
    if args.max_minutes and minutes > args.max_minutes:
        warnings.append(
            f"the run took {minutes:.0f} minutes, past `--max-minutes {args.max_minutes:g}`: "
            f"the first {MIN_ROUNDS} timing rounds and the profiled rounds run whatever it says"
        )
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    machine = {
        "rounds": rounds,
        "load_before": load_before,
        "load_after": load_after,
        "compared": compared,
        "flatgather_log": on_lines,
        "warnings": warnings,
        "minutes": minutes,
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
