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
So the bytes are compared exactly first; where they differ, the two
servers' logged prefill batches must differ too (else the difference is
flatgather's: the test fails), every byte but the numbers must be equal,
and each number within ``TOLERANCE`` of stock's. The engine tests with fixed
batches prove the values bit for bit; this one proves the Rust server reads
what flatgather's scheduler hands it as it reads the release's: the ids,
texts, lengths and structure of every response.
"""

from __future__ import annotations

import importlib.util
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
    """Whether the responses are the same bytes (else, asserted: the batches
    formed otherwise, and the responses are the same but for rounding); the
    number of decimal numbers compared."""
    difference, _ = harness.compare_front_end(stock.answers, flat.answers)
    numbers = sum(len(NUMBER.findall(c["body"].encode("latin-1"))) for c in stock.answers)
    if difference is None:
        return True, numbers
    assert _batches(stock), "the scheduler logged no prefill batch"
    assert _batches(stock) != _batches(flat), (
        f"the batches formed alike and the responses differ: {difference}"
    )
    stock, flat = stock.answers, flat.answers
    assert [c["name"] for c in stock] == [c["name"] for c in flat]
    for a, b in zip(stock, flat, strict=True):
        assert a["status"] == b["status"], (a["name"], a["status"], b["status"])
        x = harness.normalized(a["body"].encode("latin-1"))
        y = harness.normalized(b["body"].encode("latin-1"))
        apart = _apart_from_rounding(x, y)
        assert apart is None, f"{a['name']}: {apart} ({difference})"
    return False, numbers


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
    print(
        f"SGLang {RELEASE}: {len(flat.answers)} responses (status {statuses}), "
        f"{numbers} numbers, {'the same bytes' if exact else 'the same but for rounding'}"
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
