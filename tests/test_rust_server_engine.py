"""The embedded Rust server gives the client the same bytes with flatgather
on and off.

From 0.5.19 SGLang ships an opt-in server written in Rust
(``SGLANG_RUST_SERVER=1``): it runs inside the scheduler's process, in place
of the Python API server, tokenizer manager and detokenizer, and reads the
scheduler's logprobs there. flatgather's front-end patches have nothing to
answer on this path (the tokenizer manager does not run); its scheduler
patches do. Each side is ``python -m sglang.launch_server`` with the switch
set, answering every call of ``workload.front_end_calls`` in turn (the
calls the Rust server refuses are compared as refused: status and body),
the raw bytes compared after normalizing out the fields that vary between
runs (``harness.VARYING``).

The Rust server hands a batch's requests to the scheduler one by one as it
tokenizes them, so which of them share a forward can differ from run to run,
and with it a row's float32 rounding on a CPU. Seen over six runs, three a
side: the batches formed one way in the three stock runs and one
flatgather run, another way in two flatgather runs (the scheduler's log of
its prefill batches shows it), and the responses were equal byte for byte
wherever the batches formed alike, 1e-6 apart in some values where not.
So the bytes are compared exactly first; where they differ, a number may
differ from stock's (within ``TOLERANCE``) only where the two servers'
logged prefill batches differ too, and every byte but the numbers must be
equal. Streams are compared event by event (``_apart``): under load the
Rust server's events carry one or two steps each, on either side, and with
them a chat stream's held-back token's entry comes and goes (a /generate
stream compared whole failed in CI; the held-back entry was seen on this
machine under load; ``_same_but_held_back``). The engine tests with fixed
batches prove the values bit for bit; this one proves the Rust server reads
what flatgather's scheduler hands it as it reads the release's: the ids,
texts, lengths and structure of every response.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from conftest import RELEASE
from engine import harness
from test_engine import _chunked, assert_flatgather_answered, assert_flatgather_off
from test_front_end_engine import _runs

pytestmark = pytest.mark.engine

RUST_SERVER = {"SGLANG_RUST_SERVER": "1"}
TOLERANCE = 1e-4
"""Relative: a row computed in another batch rounds differently in its last
float32 bits (seen: 2e-6); a wrong row, block or shift is far off."""
BATCH = re.compile(r"Prefill batch, #new-seq: \d+, #new-token: \d+, #cached-token: \d+")
RUNNING = re.compile(r"#running-req: \d+")
NUMBER = re.compile(rb"-?[0-9]+\.[0-9]+(?:[eE][-+]?[0-9]+)?")


def _apart_from_rounding(x: bytes, y: bytes) -> str | None:
    """Where two bodies differ in anything but their decimal numbers' last
    digits (or None): the text between the numbers equal, the numbers within
    ``TOLERANCE``."""
    if NUMBER.split(x) != NUMBER.split(y):
        return "the bytes between the numbers differ"
    a, b = NUMBER.findall(x), NUMBER.findall(y)
    for u, v in zip(a, b, strict=True):
        p, q = float(u), float(v)
        if abs(p - q) > TOLERANCE * max(abs(p), abs(q), 1e-30):
            return f"{u!r} against {v!r}"
    return None


def _batches(served: harness.Served) -> list[str]:
    """The prefill batches the scheduler logged, in order: requests, new and
    cached tokens, and how many were already running."""
    found = ((BATCH.search(line), RUNNING.search(line)) for line in served.log.splitlines())
    return [f"{batch.group(0)} {running.group(0)}" for batch, running in found if batch and running]


def _compare(stock: harness.Served, flat: harness.Served) -> tuple[bool, int]:
    """Whether the responses are the same bytes (else, asserted: each
    difference is one the release shows between its own runs); the number of
    decimal numbers compared."""
    difference, _ = harness.compare_front_end(stock.answers, flat.answers)
    numbers = sum(len(NUMBER.findall(c["body"].encode("latin-1"))) for c in stock.answers)
    if difference is None:
        return True, numbers
    assert _batches(stock), "the scheduler logged no prefill batch"
    # Rounding only where a row may have been computed in another batch.
    rounding = _batches(stock) != _batches(flat)
    stock, flat = stock.answers, flat.answers
    assert [c["name"] for c in stock] == [c["name"] for c in flat]
    for a, b in zip(stock, flat, strict=True):
        assert a["status"] == b["status"], (a["name"], a["status"], b["status"])
        apart = _apart(a["body"].encode("latin-1"), b["body"].encode("latin-1"), rounding)
        batches = "the batches formed otherwise" if rounding else "the batches formed alike"
        assert apart is None, f"{a['name']}: {apart} ({batches}; {difference})"
    return False, numbers


def _exactly(x: bytes, y: bytes) -> str | None:
    return None if x == y else "the bytes differ"


def _apart(x: bytes, y: bytes, rounding: bool) -> str | None:
    """Where two response bodies differ (or None): byte for byte, or, with
    ``rounding``, but for the numbers' last digits (``_apart_from_rounding``).

    A stream is compared event by event, matched by the tokens each covers,
    as ``harness.compare_stream`` matches them: the server sends a streaming
    client what it holds when it gets to it, so one side's two steps can go
    out as one event. Where they did, a chat stream can also differ in a
    held-back token's entry (``_same_but_held_back``)."""
    same = _apart_from_rounding if rounding else _exactly
    if not x.startswith(b"data: "):
        return same(harness.normalized(x), harness.normalized(y))
    difference, _ = harness.compare_stream(x, y, apart=same)
    if difference is None or _same_but_held_back(x, y, TOLERANCE if rounding else 0.0):
        return None
    return difference


def _held_back(entry: dict) -> bool:
    """Whether a chat logprob entry's token is no text by itself (a part of
    a UTF-8 character: its bytes do not decode alone)."""
    try:
        bytes(entry.get("bytes") or b"").decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _same_but_held_back(x: bytes, y: bytes, tolerance: float) -> bool:
    """Whether two chat streams send the same events, one for one, but for
    the logprob entries of held-back tokens.

    The Rust server holds back a token that is part of a UTF-8 character
    until the next one completes it, then sends the text of both in one
    event: with the held-back token's logprob entry where both tokens
    reached it in one step, without it where they came one step at a time.
    Seen on stock and flatgather alike, under load: the entry of a token of
    bytes [242] in one server's stream and not in the other's; without the
    load, both streams leave it out, and both whole responses hold it. So
    the events are compared one for one with those entries left out, each
    number within ``tolerance`` (relative) of the other's."""
    a, b = harness.sse_events(harness.normalized(x)), harness.sse_events(harness.normalized(y))
    if len(a) != len(b):
        return False
    for p, q in zip(a, b, strict=True):
        if p.startswith(b"data: {") and q.startswith(b"data: {"):
            p, q = (_without_held_back(json.loads(e[len(b"data: ") :])) for e in (p, q))
        if not _close(p, q, tolerance):
            return False
    return True


def _without_held_back(chunk: dict) -> dict:
    for choice in chunk.get("choices") or []:
        content = (choice.get("logprobs") or {}).get("content")
        if content:
            choice["logprobs"]["content"] = [e for e in content if not _held_back(e)]
    return chunk


def _close(p, q, tolerance: float) -> bool:
    """Whether two parsed JSON values are equal, each float within
    ``tolerance`` (relative) of the other's."""
    if isinstance(p, float) and isinstance(q, float):
        return abs(p - q) <= tolerance * max(abs(p), abs(q), 1e-30)
    if isinstance(p, dict) and isinstance(q, dict):
        return p.keys() == q.keys() and all(_close(p[k], q[k], tolerance) for k in p)
    if isinstance(p, list) and isinstance(q, list):
        return len(p) == len(q) and all(_close(u, v, tolerance) for u, v in zip(p, q, strict=True))
    return type(p) is type(q) and p == q


def _ships_it() -> bool:
    """Whether the release has the embedded Rust server, its extension built
    into the wheel."""
    spec = importlib.util.find_spec("sglang.srt.rust_extensions")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        path.name.startswith("_server.")
        for folder in spec.submodule_search_locations
        for path in Path(folder).iterdir()
    )


def _serve(workdir, models_root, flatgather: bool) -> harness.Served:
    return harness.serve(
        workdir,
        models_root,
        "plain",
        flatgather,
        env=_chunked() | RUST_SERVER,
        front_end="http",
        tag="-rust-server",
    )


def test_the_rust_server_s_responses_are_the_same_bytes_with_flatgather_on(tmp_path):
    _runs()
    if not _ships_it():
        pytest.skip(f"SGLang {RELEASE} has no embedded Rust server")
    models_root = tmp_path / "models"
    stock = _serve(tmp_path, models_root, False)
    assert_flatgather_off(stock)
    flat = _serve(tmp_path, models_root, True)
    assert_flatgather_answered(flat, "http")
    # Nothing answered in a front end: the Rust server replaced it.
    assert not flat.front, flat.front
    statuses = [c["status"] for c in stock.answers]
    assert statuses.count(200) >= 1, stock.answers
    exact, numbers = _compare(stock, flat)
    assert numbers > 100, numbers  # logprob values came back
    how = "the same bytes" if exact else "the same but for what differs between stock runs"
    print(
        f"SGLang {RELEASE}: {len(flat.answers)} responses (status {statuses}), "
        f"{numbers} numbers, {how}"
    )


def test_the_comparison_tells_rounding_from_a_wrong_answer():
    body = b'[[-0.6414031982421875,282,"is"],[-0.3392527401447296,49,"."]]'
    rounded = b'[[-0.6414018273353577,282,"is"],[-0.3392535150051117,49,"."]]'
    assert _apart_from_rounding(body, rounded) is None
    # Another id, another text, a value of another row, a row missing.
    assert _apart_from_rounding(body, body.replace(b"282", b"283"))
    assert _apart_from_rounding(body, body.replace(b'"is"', b'"it"'))
    assert _apart_from_rounding(body, body.replace(b"-0.6414031982421875", b"-0.3392527401447296"))
    assert _apart_from_rounding(body, body[: body.index(b",[-0.33")] + b"]")


def _event(values: list[tuple[bytes, int, str]]) -> bytes:
    rows = b",".join(b'[%s,%d,"%s"]' % (v, i, t.encode()) for v, i, t in values)
    return b'data: {"meta_info":{"completion_tokens":%d,"output_token_logprobs":[%s]}}\n\n' % (
        len(values),
        rows,
    )


DONE = b"data: [DONE]\n\n"


def test_a_stream_is_compared_event_by_event():
    rows = [(b"-0.6414031982421875", 282, "is"), (b"-0.3392527401447296", 49, ".")]
    rounded = [(b"-0.6414018273353577", 282, "is"), (b"-0.3392535150051117", 49, ".")]
    stream = _event(rows[:1]) + _event(rows) + DONE
    # The other server sent both steps as one event.
    assert _apart(stream, _event(rows) + DONE, False) is None
    assert _apart(stream, _event(rounded) + DONE, True) is None
    assert _apart(stream, _event(rounded) + DONE, False)  # rounding only across batches
    assert _apart(stream, _event(rounded[:1]) + _event(rounded) + DONE, True) is None
    # A wrong id in the last event, or in an event both sent; a token missing.
    wrong = [(b"-0.6414018273353577", 283, "is"), rounded[1]]
    assert _apart(stream, _event(wrong) + DONE, True)
    assert _apart(stream, _event(wrong[:1]) + _event(rounded) + DONE, True)
    assert _apart(stream, _event(rounded[:1]) + DONE, True)


def _chat(text: str, entries: list[tuple[list[int], float]]) -> bytes:
    content = [
        {"token": bytes(b).decode(errors="replace"), "bytes": b, "logprob": v, "top_logprobs": []}
        for b, v in entries
    ]
    delta = {"choices": [{"delta": {"content": text}, "logprobs": {"content": content}}]}
    return b"data: " + json.dumps(delta).encode() + b"\n\n"


def test_a_chat_stream_may_differ_only_in_a_held_back_token():
    start, en = _chat("\x00", [([0], -0.53)]), ([101, 110], -0.98)
    one_by_one = start + _chat("\ufffden", [en]) + _chat("en", [([101, 110], -1.17)]) + DONE
    together = start + _chat("\ufffden", [([242], -1.41), en]) + _chat("en", [([101, 110], -1.17)])
    assert _apart(one_by_one, together + DONE, False) is None
    # Another entry, a whole token; another value; an event fewer.
    other = start + _chat("\ufffden", [([101], -1.41), en]) + _chat("en", [([101, 110], -1.17)])
    assert _apart(one_by_one, other + DONE, False)
    assert _apart(one_by_one, together.replace(b"-1.17", b"-1.18") + DONE, False)
    assert _apart(one_by_one, start + _chat("\ufffden", [([242], -1.41), en]) + DONE, False)
