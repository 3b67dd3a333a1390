"""The server's front end gives the client the same bytes with flatgather on
and off.

The front end (the tokenizer manager, in the server's own process) turns the
scheduler's logprobs into what the client reads: with
``return_text_in_logprobs`` it decodes each token's text, the OpenAI
endpoints build their ``logprobs`` objects from them, streamed or not. Each
side is ``python -m sglang.launch_server`` serving the tiny Llama with a
byte-level tokenizer made on the spot (``engine/models.py``), switched by
``FLATGATHER_SGLANG`` alone; one server a side answers every call of
``workload.front_end_calls`` in turn, and the raw response bytes are compared
after normalizing out, by name, the fields that differ between any two runs
(``harness.VARYING``: ids, creation times, latencies). ``Engine.generate``
with ``return_text_in_logprobs`` is compared as the Python objects it
returns (their ``repr``, types included). A third server runs flatgather in
its spawned processes only, its own process stock: the front end as shipped
must answer the same over a patched scheduler.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from conftest import RELEASE, ROW
from engine import harness
from flatgather.sglang.patches import front_end, openai_logprobs
from flatgather.sglang.patches.front_end import runtime
from flatgather.sglang.patches.openai_logprobs import runtime as openai_runtime
from test_engine import _chunked, assert_flatgather_answered, assert_flatgather_off

pytestmark = pytest.mark.engine

SCENARIO = "front-end"


def _calls_it(module: str) -> bool:
    """Whether the release's ``module`` calls the OpenAI conversion (read
    from its source: importing the serving modules here would need the
    server's dependencies)."""
    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec else None
    return bool(origin) and f"{openai_runtime.NAME}(" in Path(origin).read_text()


MANAGER_MARKERS = {
    f"{front_end.FRONT_END}: {front_end.MODULES[0]}.{front_end.OWNER}.{fn}"
    for fn in (runtime.ONE, runtime.TOP)
}
"""The tokenizer manager's replacements, as the trace names them."""
OPENAI_MARKERS = {
    f"{openai_logprobs.OPENAI}: {module}.{openai_runtime.NAME}"
    for module in openai_logprobs.MODULES[1:3]
    if _calls_it(module)
}
"""The OpenAI conversion's replacement in each serving module that calls it
in the release, of those the scenario calls (completions and chat, not the
responses API)."""


def assert_front_end_answered(flat: harness.Served, openai: bool = True) -> None:
    """Both replacements of the tokenizer manager answered (returned without
    handing the call to the release's function) in its loop, and the OpenAI
    conversion's in the serving modules' handlers, in the server's own
    process and nowhere else."""
    assert OPENAI_MARKERS, "no serving module calls the OpenAI conversion"
    assert set(flat.front) == MANAGER_MARKERS | (OPENAI_MARKERS if openai else set()), flat.front
    assert flat.front_pids == {flat.main_pid}, (flat.front_pids, flat.main_pid)


def _runs() -> None:
    forced = os.environ.get("FLATGATHER_ENGINE_SCENARIOS")
    if forced is not None:
        if SCENARIO not in forced.split():
            pytest.skip(f"{SCENARIO} not in FLATGATHER_ENGINE_SCENARIOS")
        return
    # A server a side with a tokenizer: it runs where the HTTP scenario does.
    if ROW is None or "http" not in ROW.engine:
        why = ROW.engine_note if ROW and ROW.engine_note else "not in the release table"
        pytest.skip(f"SGLang {RELEASE}: no {SCENARIO} engine test (it runs with http: {why})")


def _serve(workdir, models_root, flatgather: bool, **workload) -> harness.Served:
    return harness.serve(workdir, models_root, "plain", flatgather, env=_chunked(), **workload)


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    return tmp_path_factory.mktemp("front-end-models")


@pytest.fixture(scope="module")
def stock_server(tmp_path_factory, models_root) -> harness.Served:
    """The stock server's answers, shared by the comparisons below."""
    _runs()
    workdir = tmp_path_factory.mktemp("front-end")
    stock = _serve(workdir, models_root, False, front_end="http")
    assert_flatgather_off(stock)
    return stock


def _assert_same(stock: harness.Served, other: harness.Served) -> int:
    """The same responses, byte for byte but the varying fields; the number
    of stream events compared."""
    assert [c["status"] for c in stock.answers].count(200) >= 9, stock.answers
    difference, events = harness.compare_front_end(stock.answers, other.answers)
    assert difference is None, difference
    assert events > 0
    return events


def test_the_server_s_responses_are_the_same_bytes_with_flatgather_on(
    stock_server, tmp_path, models_root
):
    flat = _serve(tmp_path, models_root, True, front_end="http")
    assert_flatgather_answered(flat, "http")
    # The server's own process, where the front end runs, had flatgather.
    assert flat.main_pid in harness.active_pids(flat.flatgather_lines), flat.flatgather_lines
    assert any(r.pid == flat.main_pid for r in flat.reports), flat.reports
    assert_front_end_answered(flat)
    events = _assert_same(stock_server, flat)
    print(f"SGLang {RELEASE}: {len(flat.answers)} responses and {events} stream events equal")


def test_a_stock_front_end_over_a_patched_scheduler_answers_the_same(
    stock_server, tmp_path, models_root
):
    """The server's process starts with the switch off and turns it on for
    the processes it spawns (``serve.SPLIT``): flatgather must be active in
    the scheduler and absent from the server's own process."""
    split = _serve(tmp_path, models_root, False, front_end="http", split=True)
    active = harness.active_pids(split.flatgather_lines)
    assert split.main_pid is not None and split.main_pid not in active, (split.main_pid, active)
    assert split.main_pid not in split.applied, split.applied
    assert all(r.pid != split.main_pid for r in split.reports), split.reports
    assert not split.front, split.front
    assert split.answered_pids and split.answered_pids <= active, (split.answered_pids, active)
    assert_flatgather_answered(split, "http")
    _assert_same(stock_server, split)


def test_engine_generate_returns_the_same_objects_with_flatgather_on(tmp_path, models_root):
    """``Engine.generate`` with ``return_text_in_logprobs``: each logprob field
    of ``meta_info``, the text and the ids, compared as their ``repr``."""
    _runs()
    stock = _serve(tmp_path, models_root, False, front_end="engine")
    flat = _serve(tmp_path, models_root, True, front_end="engine")
    assert_flatgather_off(stock)
    assert_flatgather_answered(flat, "http")
    assert flat.main_pid in harness.active_pids(flat.flatgather_lines), flat.flatgather_lines
    assert_front_end_answered(flat, openai=False)  # Engine.generate: no OpenAI layer
    # Text came back where it was asked for (a str per token), None where not.
    texts = {a["name"]: "None)" not in a["output_token_logprobs"] for a in stock.answers}
    assert texts == {n: not n.startswith("batch, no text") for n in texts}, stock.answers
    difference = harness.first_difference(stock.answers, flat.answers)
    assert difference is None, difference
