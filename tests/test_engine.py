"""A real SGLang engine gives the same answers with flatgather on and off.

Each side is an unmodified ``sglang.Engine`` (tokenizer manager, scheduler,
model runner, radix cache, detokenizer, spawned processes) serving a tiny
random Llama on the CPU, in its own process, with flatgather switched by
``FLATGATHER_SGLANG`` alone, as an operator switches it; the scheduler gets it
through the installed ``.pth`` line. The workload (``engine/workload.py``)
reaches every path flatgather patches, and the trace (``engine/site``) shows
that each replacement returned flatgather's own answer, not the release's
fallback, in the scheduler's event loop, every patch installed with no note.
Answers are compared bit for bit: output ids, input and output logprobs,
top-k and token-id logprobs.

The harness (``tests/engine/``) is the tests' own: the models made on the
spot, a torch stand-in for the few ``sgl_kernel`` ops the CPU engine
imports, and one fix of SGLang's CPU engine (the tree mask its Triton
backend reads), the same for both sides.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import RELEASE, ROW
from engine import harness
from flatgather.sglang import patches as rooms

pytestmark = pytest.mark.engine

PRUNED, FIX = "pruned-states", "prefill-skip-logprob-pt"
# The patches that answer in every engine run with logprobs, and which of the
# pruning's paths (one request, or several) each scenario reaches.
PATCHES = {
    "plain": {
        PRUNED,
        "input-token-ids-logprobs",
        FIX,
        "output-logprobs",
        "output-logprobs-chain",
    },
}
PATCHES["eagle3-topk1"] = PATCHES["eagle3-topk2"] = PATCHES["plain"] | {"draft-prefill-rotation"}
PATCHES["http"] = PATCHES["retract"] = PATCHES["plain"]
PRUNING = {"plain": {"B >= 2", "one request"}}
PRUNING["eagle3-topk1"] = PRUNING["eagle3-topk2"] = PRUNING["http"] = {"B >= 2"}
PRUNING["retract"] = PRUNING["plain"]

SPEC_PRODUCERS = "the speculative decoder's (up to 0.5.15 plain decoding calls the sampler's)"
UNREACHED = {
    # Replacements (by the end of their place) that a scenario's workload
    # never calls, and why: every other replacement put in place in the
    # scheduler must answer there at least once.
    "plain": {
        "LogitsProcessor._get_hidden_states_to_store": "no aux layers without EAGLE3",
        "layers.utils.logprob.get_top_logprobs": SPEC_PRODUCERS,
        "layers.utils.logprob.get_token_ids_logprobs": SPEC_PRODUCERS,
    },
}
UNREACHED["http"] = UNREACHED["retract"] = UNREACHED["plain"]
UNREACHED["eagle3-topk1"] = UNREACHED["eagle3-topk2"] = {}
# The front end's patches answer in the server's own process, never in the
# scheduler, which imports their modules on some releases (0.5.10 does):
# whether they answered there, tests/test_front_end_engine.py checks.
FRONT_PATCHES = {p.name for p in rooms.patches() if p.serves == "front"}


def assert_flatgather_answered(flat: harness.Served, scenario: str) -> None:
    """flatgather was on in the scheduler, installed every patch it has for
    this release with no note (nothing left stock, nothing refused), and
    each replacement put in place there returned flatgather's own answer in
    the event loop at least once (see ``engine/site/sitecustomize.py``).
    Every problem found is named in one failure."""
    assert any("active in pid" in line for line in flat.flatgather_lines), flat.flatgather_lines
    problems = []
    if not flat.reports:
        problems.append("the engine recorded no install")
    refused = [r for r in flat.reports if r.state not in ("applied", "as shipped") or r.notes]
    if refused:
        problems.append(f"left stock, refused or noted: {refused}")
    if flat.untracked:
        problems.append(f"not watched: {flat.untracked}")
    if len(flat.answered_pids) != 1:
        problems.append(f"answers in processes {sorted(flat.answered_pids)}, not one scheduler")
    unanswered = [
        m
        for m in flat.unanswered()
        if not m.endswith(tuple(UNREACHED[scenario])) and m.split(": ", 1)[0] not in FRONT_PATCHES
    ]
    if unanswered:
        handed = [m for m in unanswered if m in flat.handed]
        problems.append(
            f"never answered in the engine: {unanswered} (of those, handed to the "
            f"release's code: {handed})"
        )
    expected = PATCHES[scenario] - ({FIX} if ROW and ROW.skip_advances_logprob_pt else set())
    patches = {m.split(": ", 1)[0] for m in flat.trace}
    if not expected <= patches:
        problems.append(f"no answer from {sorted(expected - patches)}")
    paths = {m.rsplit(" (", 1)[-1].rstrip(")") for m in flat.trace if m.startswith(PRUNED)}
    if not PRUNING[scenario] <= paths:
        problems.append(f"pruning paths answered: {sorted(paths)}, not {sorted(PRUNING[scenario])}")
    assert not problems, "\n".join([*problems, f"answered: {flat.trace}"])


def assert_flatgather_off(stock: harness.Served) -> None:
    """Off is off: flatgather never loaded, nothing installed or answered."""
    assert stock.trace == [] and stock.flatgather_lines == [], stock.trace
    assert not stock.reports and not stock.applied and not stock.untracked


WORKLOADS = {
    # Dozens of requests, prompts up to 150 tokens, chunks of 64.
    "plain": {"requests": 40, "shape": {"max_len": 150}, "chunked_prefill_size": 64},
    # Each speculative step runs SGLang's Triton kernels in the interpreter:
    # fewer, shorter requests.
    "eagle3-topk1": {"requests": 12, "shape": {"max_len": 40}, "chunked_prefill_size": 32},
    "eagle3-topk2": {"requests": 12, "shape": {"max_len": 40}, "chunked_prefill_size": 32},
}


def _ids() -> dict:
    """The workload's id lists on this release: None, empty and ragged mixed,
    or, where the release's own scheduler fails on such a batch, ragged and
    never empty (see ``workload.requests``)."""
    return {"mixed_ids": ROW.engine_mixed_ids if ROW else True}


def _chunked() -> dict[str, str]:
    """Up to 0.5.15 the token-id input logprobs of a prefill go to
    ``get_token_ids_logprobs_prefill``, and to ``get_token_ids_logprobs_chunk``
    only under SGLang's own switch, for a batch of more rows than its chunk
    size: on, with chunks of 16 rows (a batch of the workload holds up to
    64), both functions serve it (the later releases have the chunked path
    alone)."""
    source = harness.release_dir() / "sglang" / "srt" / "layers" / "logits_processor.py"
    if "get_token_ids_logprobs_prefill" not in source.read_text():
        return {}
    return {"SGLANG_ENABLE_LOGITS_PROCESSER_CHUNK": "1", "SGLANG_LOGITS_PROCESSER_CHUNK_SIZE": "16"}


def _runs(scenario: str) -> None:
    forced = os.environ.get("FLATGATHER_ENGINE_SCENARIOS")
    if forced is not None:
        # A release or fork outside the table: the operator names what to run.
        if scenario not in forced.split():
            pytest.skip(f"{scenario} not in FLATGATHER_ENGINE_SCENARIOS")
        return
    engine = ROW.engine if ROW else ()
    if scenario not in engine:
        why = ROW.engine_note if ROW and ROW.engine_note else "not in the release table"
        pytest.skip(f"SGLang {RELEASE}: no {scenario} engine test ({why})")


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    return tmp_path_factory.mktemp("engine-models")


@pytest.mark.matrix
def test_the_stand_in_ops_are_the_release_s_kernels():
    """Each torch op of the ``sgl_kernel`` stand-in equals the release's own
    Triton kernel of the same job on random cases; an op this release has no
    kernel for is left unchecked only where the release table says why."""
    import ast

    _runs("plain")
    env = harness.environment("plain", False, harness.HERE / "unused.trace")
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, str(harness.HERE / "check_kernels.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    # Every op of the stand-in, read from its source: the package is the
    # engine's, on its PYTHONPATH only.
    stand_in = ast.parse((harness.SITE / "sgl_kernel" / "__init__.py").read_text())
    (ops,) = (
        ast.literal_eval(node.value)
        for node in stand_in.body
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["OPS"]
    )
    said = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    said = {op: what for op, what in said.items() if op in ops}
    assert set(said) == set(ops), proc.stdout
    unchecked = {
        op: what.removeprefix("not checked: ")
        for op, what in said.items()
        if what.startswith("not checked: ")
    }
    assert unchecked == dict(ROW.unchecked_ops if ROW else ()), proc.stdout
    checked = {op for op, what in said.items() if what.startswith("checked, 40 cases equal")}
    delegated = {op for op, what in said.items() if what.startswith("the release's own")}
    assert checked | delegated | set(unchecked) == set(ops), proc.stdout
    assert checked, proc.stdout


@pytest.mark.parametrize(
    "scenario",
    # The scenario without speculative decoding runs on every release.
    [pytest.param("plain", marks=pytest.mark.matrix), "eagle3-topk1", "eagle3-topk2"],
)
def test_the_engine_answers_the_same_with_flatgather_on(scenario, tmp_path, models_root):
    _runs(scenario)
    workload = WORKLOADS[scenario] | {"shape": WORKLOADS[scenario]["shape"] | _ids()}
    env = _chunked()
    stock = harness.serve(tmp_path, models_root, scenario, False, env=env, **workload)
    flat = harness.serve(tmp_path, models_root, scenario, True, env=env, **workload)

    assert_flatgather_off(stock)
    assert_flatgather_answered(flat, scenario)
    assert len(stock.answers) == workload["requests"]
    difference = harness.first_difference(stock.answers, flat.answers)
    assert difference is None, difference
    # The workload asked for something: logprobs of every kind came back.
    kinds = {k for a in stock.answers for k, v in a.items() if v}
    assert {"input_top_logprobs", "input_token_ids_logprobs", "output_top_logprobs"} <= kinds


def test_launch_server_over_http_answers_the_same(tmp_path, models_root):
    """The server as operators start it, ``python -m sglang.launch_server``,
    the workload as one ``POST /generate``."""
    _runs("http")
    workload = WORKLOADS["plain"] | {"requests": 24, "http": True}
    workload["shape"] = workload["shape"] | _ids()
    env = _chunked()
    stock = harness.serve(tmp_path, models_root, "plain", False, env=env, **workload)
    flat = harness.serve(tmp_path, models_root, "plain", True, env=env, **workload)
    assert_flatgather_off(stock)
    assert_flatgather_answered(flat, "http")
    assert len(stock.answers) == workload["requests"]
    difference = harness.first_difference(stock.answers, flat.answers)
    assert difference is None, difference


RETRACTION = {
    "requests": 40,
    # Each prompt shorter than the one before: SGLang retracts the request
    # with the fewest outputs and then the longest prompt first, that is the
    # first request of the prefill batch still in flight.
    "shape": {
        "min_len": 8,
        "max_len": 48,
        "new_tokens": (6, 12),
        "ignore_eos": True,
        "descending": True,
    },
    "chunked_prefill_size": 256,
}


INPUT_FIELDS = ("input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs")
RETRACTED, ADVANCED = "retracted in flight", "cursor advanced over a retracted request"


def test_a_request_retracted_in_flight_leaves_the_others_their_own_input_logprobs(
    tmp_path, models_root
):
    """SGLang issue #36938 in a real engine. The overlap scheduler launches a
    prefill batch, then, before it processes that batch's result, retracts a
    request of it (``SGLANG_TEST_RETRACT=1``: SGLang's own switch that runs
    its retraction every third step). The result loop skips the retracted
    request without moving its input-logprob cursor, so on the stock engine
    the requests after it get the wrong rows; with flatgather each gets its
    own.

    The race is read off each run: the requests found retracted when their
    prefill batch's result is processed, and, with flatgather, the fix's
    advance of the cursor over each of them (see ``engine/site``). A run
    that did not reach the race fails. Every input-logprob field is compared
    with a run without retraction (token ids exactly, values within a
    rounding tolerance: the batches differ), and the two retracting runs,
    which step through the same batches, with each other bit for bit but
    where the stock engine served a request rows not its own."""
    _runs("retract")
    if ROW is not None and ROW.skip_advances_logprob_pt:
        pytest.skip(f"SGLang {RELEASE} advances the cursor itself")
    workload = RETRACTION | {"shape": RETRACTION["shape"] | _ids(), "tag": "-retract"}
    chunked = _chunked()
    calm = harness.serve(tmp_path / "calm", models_root, "plain", False, env=chunked, **workload)
    # A small KV pool, filled eagerly, and SGLang's retraction every third step.
    workload["engine"] = {"max_total_tokens": 600, "schedule_conservativeness": 0.01}
    retract = chunked | {"SGLANG_TEST_RETRACT": "1"}
    stock = harness.serve(tmp_path, models_root, "plain", flatgather=False, env=retract, **workload)
    flat = harness.serve(tmp_path, models_root, "plain", flatgather=True, env=retract, **workload)
    assert_flatgather_off(stock)
    assert calm.events[RETRACTED] == 0, calm.events

    retracted = {"off": stock.events[RETRACTED], "on": flat.events[RETRACTED]}
    assert all(retracted.values()), (
        f"no request was retracted while its prefill batch was in flight ({retracted}): "
        "the race of #36938 was not reached"
    )
    assert retracted["off"] == retracted["on"], f"the sides retracted differently: {retracted}"
    assert stock.events[ADVANCED] == 0, stock.events
    # The fix ran on every one of them.
    assert flat.events[ADVANCED] == retracted["on"], flat.events

    def served_another_s(served) -> list[int]:
        return [
            i
            for i, (a, b) in enumerate(zip(calm.answers, served.answers, strict=True))
            if not all(harness.close(a.get(k), b.get(k), 1e-3) for k in INPUT_FIELDS)
        ]

    victims = served_another_s(stock)
    assert served_another_s(flat) == []
    # The bug is there to fix: some request of the stock engine was served
    # rows that are not its own.
    assert victims, "the stock engine served every request its own input logprobs"
    for i, (a, b) in enumerate(zip(stock.answers, flat.answers, strict=True)):
        differ = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
        assert differ <= (set(INPUT_FIELDS) if i in victims else set()), (i, sorted(differ))
    assert_flatgather_answered(flat, "retract")
    print(
        f"SGLang {RELEASE}, #36938 in the engine: {retracted['on']} requests retracted with "
        f"their prefill batch in flight, the fix's advance over {flat.events[ADVANCED]}; stock "
        f"served {len(victims)} of {len(stock.answers)} requests another's input "
        "logprobs, flatgather none"
    )


@pytest.mark.skipif(os.environ.get("FLATGATHER_ENGINE_DETERMINISM") != "1", reason="on demand")
@pytest.mark.parametrize("scenario", ["plain", "eagle3-topk1"])
def test_the_stock_engine_answers_the_same_twice(scenario, tmp_path, models_root):
    """The comparison means something only if stock is deterministic: two
    stock runs give the same answers (on demand: FLATGATHER_ENGINE_DETERMINISM=1)."""
    _runs(scenario)
    workload = WORKLOADS[scenario] | {"shape": WORKLOADS[scenario]["shape"] | _ids()}
    env = _chunked()
    first = harness.serve(tmp_path / "a", models_root, scenario, False, env=env, **workload)
    second = harness.serve(tmp_path / "b", models_root, scenario, False, env=env, **workload)
    assert harness.first_difference(first.answers, second.answers) is None
