"""Run the same workload on two real SGLang engines, flatgather off and on.

Each side is its own ``python serve.py`` process, started the way an
operator starts a server: flatgather is switched on or off by
``FLATGATHER_SGLANG`` alone, and reaches the engine's spawned scheduler
through the installed ``.pth`` line. Both sides see the same models, the same
``sgl_kernel`` stand-in and the same harness additions (``site/``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import models

HERE = Path(__file__).resolve().parent
SITE = HERE / "site"
SERVE = HERE / "serve.py"

SPECULATIVE = {"eagle3-topk1", "eagle3-topk2"}
SERVE_TIMEOUT_S = 600


@dataclass(frozen=True)
class Report:
    """One patch in one module, as the engine's installer recorded it."""

    patch: str
    module: str
    state: str
    notes: tuple[str, ...]
    """What was left out, and why."""
    vouched: tuple[str, ...]
    """What the vouching of code replaced whole rests on."""
    pid: int


@dataclass(frozen=True)
class Served:
    answers: list
    trace: list[str]
    """The markers of the replacements that answered in the scheduler's
    event loop, in the order of their first answer."""
    flatgather_lines: list[str]
    """The log lines flatgather wrote (``[flatgather] ...``)."""
    log: str
    applied: dict[int, list[str]] = field(default_factory=dict)
    """Per process, the marker of each replacement put in place."""
    reports: list[Report] = field(default_factory=list)
    handed: list[str] = field(default_factory=list)
    """The markers of the replacements that, at least once, handed a call
    to the release's code."""
    untracked: list[str] = field(default_factory=list)
    """Replacements the trace could not watch."""
    events: Counter = field(default_factory=Counter)
    """How many times each event of the trace happened (both sides)."""
    answered_pids: set[int] = field(default_factory=set)
    front: list[str] = field(default_factory=list)
    """The markers of the replacements that answered in the front end's loop
    (the tokenizer manager's, in the server's own process)."""
    front_pids: set[int] = field(default_factory=set)
    main_pid: int | None = None
    """The process that served the client (the front-end scenario): the
    server's ``launch_server`` process, or the one that ran the engine."""

    def unanswered(self) -> list[str]:
        """The replacements put in place in the process whose event loop
        answered (the scheduler) that never answered there."""
        applied = [m for pid in self.answered_pids for m in self.applied.get(pid, [])]
        return [m for m in applied if not any(a == m or a.startswith(f"{m} (") for a in self.trace)]


def read_trace(path: Path) -> dict:
    """The trace's records (see ``site/sitecustomize.py``) as ``Served``'s
    fields."""
    fields = {
        "trace": [],
        "applied": {},
        "reports": [],
        "untracked": [],
        "handed": [],
        "events": Counter(),
        "answered_pids": set(),
        "front": [],
        "front_pids": set(),
    }
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        kind, *values, pid = line.split("\t")
        if kind == "answered":
            fields["trace"].append(values[0])
            fields["answered_pids"].add(int(pid))
        elif kind == "applied":
            fields["applied"].setdefault(int(pid), []).append(values[0])
        elif kind == "report":
            patch, module, state, notes, vouched = values
            notes, vouched = tuple(json.loads(notes)), tuple(json.loads(vouched))
            fields["reports"].append(Report(patch, module, state, notes, vouched, int(pid)))
        elif kind == "front":
            fields["front"].append(values[0])
            fields["front_pids"].add(int(pid))
        elif kind == "handed":
            fields["handed"].append(values[0])
        elif kind == "untracked":
            fields["untracked"].append(values[0])
        elif kind == "event":
            fields["events"][values[0]] += 1
        else:
            raise AssertionError(f"{path}: a record of no known kind: {line!r}")
    return fields


def make_models(root: Path) -> tuple[Path, Path]:
    target, draft = root / "target", root / "draft"
    if not (target / "config.json").exists():
        models.make_target(target)
    if not (target / "tokenizer.json").exists():
        models.make_tokenizer(target)
    if not (draft / "config.json").exists():
        models.make_draft(draft)
    return target, draft


def release_dir() -> Path:
    """The directory the running ``sglang`` was imported from (the release
    under test, first on ``PYTHONPATH``)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin, "no sglang importable"
    return Path(spec.origin).parent.parent


def environment(scenario: str, flatgather: bool, trace: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name in [k for k in env if k.startswith(("FLATGATHER_", "SGLANG_", "TRITON_"))]:
        del env[name]
    env |= {
        "PYTHONPATH": os.pathsep.join([str(release_dir()), str(SITE)]),
        "SGLANG_USE_CPU_ENGINE": "1",
        "FLATGATHER_SGLANG": "1" if flatgather else "0",
        "FLATGATHER_ENGINE_TRACE": str(trace),
        "PYTHONUNBUFFERED": "1",
        # Two cores: one torch thread per process keeps the sides' timings
        # apart and the scheduler from starving the others.
        "OMP_NUM_THREADS": "1",
    }
    if scenario in SPECULATIVE:
        # EAGLE's attention on a CPU without AMX is SGLang's Triton kernels,
        # run by Triton's interpreter.
        env["TRITON_INTERPRET"] = "1"
    if scenario == "eagle3-topk1":
        # Random draft weights accept ~1.1 tokens a step; force multi-token
        # verify rows (SGLang allows it with real draft tokens at topk 1).
        env |= {
            "SGLANG_SIMULATE_ACC_LEN": "3",
            "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token",
        }
    return env


def serve(
    workdir: Path,
    models_root: Path,
    scenario: str,
    flatgather: bool,
    env: dict[str, str] | None = None,
    **workload,
) -> Served:
    """Start an engine, serve the workload, shut it down; what it answered."""
    target, draft = make_models(models_root)
    side = "on" if flatgather else "off"
    kind = "-http" if workload.get("http") else ""
    kind += f"-{workload['front_end']}" if workload.get("front_end") else ""
    kind += "-split" if workload.get("split") else ""
    tag = f"{scenario}{kind}{workload.get('tag', '')}-{side}"
    workdir.mkdir(parents=True, exist_ok=True)
    out, trace = workdir / f"{tag}.json", workdir / f"{tag}.trace"
    trace.unlink(missing_ok=True)
    spec = {
        "scenario": scenario,
        "target": str(target),
        "draft": str(draft),
        "out": str(out),
        **workload,
    }
    spec_path = workdir / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, str(SERVE), str(spec_path)],
        env=environment(scenario, flatgather, trace) | (env or {}),
        capture_output=True,
        text=True,
        timeout=SERVE_TIMEOUT_S,
        cwd=workdir,
    )
    log = proc.stdout + proc.stderr
    (workdir / f"{tag}.log").write_text(log)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(log.splitlines()[-40:])
        raise AssertionError(f"the {side} engine failed ({proc.returncode}):\n{tail}")
    result = json.loads(out.read_text())
    return Served(
        answers=result["answers"],
        flatgather_lines=[line for line in log.splitlines() if line.startswith("[flatgather]")],
        log=log,
        main_pid=result.get("main_pid"),
        **read_trace(trace),
    )


def first_difference(stock: list, flat: list) -> str | None:
    """Where the two sides' answers first differ, or None."""
    if len(stock) != len(flat):
        return f"{len(stock)} answers with flatgather off, {len(flat)} on"
    for i, (a, b) in enumerate(zip(stock, flat, strict=True)):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return (
                    f"request {i}, {key}: off {json.dumps(a.get(key))[:300]} "
                    f"!= on {json.dumps(b.get(key))[:300]}"
                )
    return None


def close(a, b, tolerance: float) -> bool:
    """The same structure, the same ids and lengths, and values (floats, which
    the answers carry as their ``repr``) within ``tolerance``: a batch of
    another composition rounds differently on a CPU; a shifted block is off
    by far more, or has other ids or another length."""
    if isinstance(a, str) and isinstance(b, str):
        x, y = float(a), float(b)
        return x == y or abs(x - y) <= tolerance
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, tolerance) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


VARYING = (
    # Request ids (random per request) and the OpenAI responses' id.
    "id",
    # The OpenAI responses' creation time, in seconds.
    "created",
    # Wall-clock timings the tokenizer manager adds to a finished request.
    "e2e_latency",
    "response_sent_to_client_ts",
)
"""The response fields that differ between two runs of the same server,
normalized out by name; every other byte of a response is compared."""
_VARYING = re.compile(
    rb'("(?:' + b"|".join(re.escape(k.encode()) for k in VARYING) + rb')":)'
    rb'("(?:[^"\\]|\\.)*"|-?[0-9][0-9.eE+-]*)'
)


def normalized(body: bytes) -> bytes:
    """``body`` with the value of each ``VARYING`` field replaced by ``0``,
    byte for byte otherwise."""
    return _VARYING.sub(rb"\g<1>0", body)


def sse_events(body: bytes) -> list[bytes]:
    """An SSE stream's events (``data: ...``), as sent."""
    assert body.startswith(b"data: ") and body.endswith(b"\n\n"), body[:200]
    return body[: -len(b"\n\n")].split(b"\n\n")


def _span(event: bytes, before: int) -> tuple[int, int]:
    """The tokens an event covers: a ``/generate`` event is a snapshot of the
    request so far (up to its ``completion_tokens``), an OpenAI event a
    delta (its logprobs' tokens after those of the events before it)."""
    if event == b"data: [DONE]":
        return (before, -1)
    chunk = json.loads(event[len(b"data: ") :])
    if "meta_info" in chunk:
        return (0, chunk["meta_info"]["completion_tokens"])
    logprobs = chunk["choices"][0].get("logprobs") or {}
    count = len(logprobs.get("content") or logprobs.get("tokens") or [])
    return (before, before + count)


def stream_events(body: bytes) -> dict[tuple[int, int], bytes]:
    """A stream's events by the tokens each covers (see ``_span``)."""
    events, before = {}, 0
    for event in sse_events(body):
        span = _span(event, before)
        assert span not in events or span[0] == span[1], f"two events cover {span}"
        # Events that cover no token (a chat stream's role, the finish) are
        # told apart by their order.
        key = span if span not in events else (span[0], span[1], len(events))
        events[key] = event
        before = max(before, span[1])
    return events


def _apart(x: bytes, y: bytes) -> str | None:
    """Where two bodies differ (or None): byte for byte."""
    return None if x == y else _around(x, y)


def compare_stream(stock: bytes, flat: bytes, apart=_apart) -> tuple[str | None, int]:
    """Where two streams differ (or None), and how many events were compared.

    The tokenizer manager sends a streaming client the latest of the outputs
    waiting for it: when it falls behind the scheduler for a step (a busy
    machine), two steps go out as one event, on either side. So events are
    matched by the tokens they cover: each event both sides sent is compared
    byte for byte (after ``normalized``; or by ``apart``, which says where
    two events differ), the last events and the terminator too, and each
    side's events must cover the same tokens in the end."""
    a, b = stream_events(normalized(stock)), stream_events(normalized(flat))
    last = (list(a)[-2], list(b)[-2]) if len(a) > 1 and len(b) > 1 else (None, None)
    if last[0] is None or max(k[1] for k in a) != max(k[1] for k in b):
        return f"the streams cover other tokens: off {list(a)} on {list(b)}", 0
    end = apart(a[list(a)[-1]], b[list(b)[-1]]) or apart(a[last[0]], b[last[1]])
    if end is not None:
        return f"the streams end differently: {end}", 0
    common = [k for k in a if k in b]
    for key in common:
        difference = apart(a[key], b[key])
        if difference is not None:
            return f"event {key}: off {difference}", len(common)
    return None, len(common)


def _around(x: bytes, y: bytes) -> str:
    i = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    return f"{x[max(0, i - 120) : i + 120]!r} != on {y[max(0, i - 120) : i + 120]!r}"


def compare_front_end(stock: list, flat: list) -> tuple[str | None, int]:
    """Where two front-end runs' responses first differ (or None), and the
    number of stream events compared: the status and the body bytes after
    ``normalized``; a stream by ``compare_stream``."""
    if [c["name"] for c in stock] != [c["name"] for c in flat]:
        return f"other calls: {[c['name'] for c in stock]} != {[c['name'] for c in flat]}", 0
    events = 0
    for a, b in zip(stock, flat, strict=True):
        x, y = a["body"].encode("latin-1"), b["body"].encode("latin-1")
        if a["status"] != b["status"]:
            return f"{a['name']}: status {a['status']} off, {b['status']} on", events
        if x.startswith(b"data: "):
            difference, compared = compare_stream(x, y)
            events += compared
        else:
            x, y = normalized(x), normalized(y)
            difference = None if x == y else _around(x, y)
        if difference is not None:
            return f"{a['name']}: {difference}", events
    return None, events


def active_pids(lines: list[str]) -> set[int]:
    """The processes where flatgather logged it was active."""
    found = (re.search(r"\bactive in pid (\d+)\b", line) for line in lines)
    return {int(m.group(1)) for m in found if m}
