"""A real SGLang engine gives the same answers with flatgather on and off.

Each side is an unmodified ``sglang.Engine`` (tokenizer manager, scheduler,
model runner, radix cache, detokenizer, spawned processes) serving a tiny
random Llama on the CPU, in its own process, with flatgather switched by
``FLATGATHER_SGLANG`` alone, as an operator switches it; the scheduler gets it
through the installed ``.pth`` line. The workload (``engine/workload.py``)
reaches every path flatgather patches, and the trace (``engine/site``) shows
that each ran in the scheduler's event loop. Answers are compared bit for
bit: output ids, input and output logprobs, top-k and token-id logprobs.

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

pytestmark = pytest.mark.engine

# What every engine run with logprobs reaches, in any scenario.
COMMON = {
    "prune: flat plan (B >= 2)",
    "input logprobs: token-id plan",
    "output logprobs: top-k plan",
    "output logprobs: token-id plan",
    "output chain: rebuilt host-copy loop",
    "output chain: one host copy",
    "output chain: rebuilt tolist loop",
    "output chain: one tolist",
    "prefill results: rebuilt method",
}
REACHED = {
    "plain": COMMON | {"prune: one-request copy"},
    "eagle3-topk1": COMMON
    | {
        "prune: lazy aux resolved at the store",
        "draft prefill: rebuilt method",
        "draft prefill: flat rotation",
    },
}
REACHED["eagle3-topk2"] = REACHED["eagle3-topk1"]

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
    stock = harness.serve(tmp_path, models_root, scenario, flatgather=False, **workload)
    flat = harness.serve(tmp_path, models_root, scenario, flatgather=True, **workload)

    # Off is off: flatgather never loaded, its trace is empty.
    assert stock.trace == [] and stock.flatgather_lines == []
    # On is on, in the scheduler too, and every patched path ran there.
    assert any("active in pid" in line for line in flat.flatgather_lines), flat.flatgather_lines
    assert len(stock.answers) == workload["requests"]
    difference = harness.first_difference(stock.answers, flat.answers)
    assert difference is None, difference
    missing = REACHED[scenario] - set(flat.trace)
    assert not missing, f"never ran in the engine: {sorted(missing)}; ran: {flat.trace}"
    # The workload asked for something: logprobs of every kind came back.
    kinds = {k for a in stock.answers for k, v in a.items() if v}
    assert {"input_top_logprobs", "input_token_ids_logprobs", "output_top_logprobs"} <= kinds


def test_launch_server_over_http_answers_the_same(tmp_path, models_root):
    """The server as operators start it, ``python -m sglang.launch_server``,
    the workload as one ``POST /generate``."""
    _runs("http")
    workload = WORKLOADS["plain"] | {"requests": 24, "http": True}
    workload["shape"] = workload["shape"] | _ids()
    stock = harness.serve(tmp_path, models_root, "plain", flatgather=False, **workload)
    flat = harness.serve(tmp_path, models_root, "plain", flatgather=True, **workload)
    assert stock.trace == [] and stock.flatgather_lines == []
    assert any("active in pid" in line for line in flat.flatgather_lines), flat.flatgather_lines
    assert len(stock.answers) == workload["requests"]
    difference = harness.first_difference(stock.answers, flat.answers)
    assert difference is None, difference
    assert {"prune: flat plan (B >= 2)", "output chain: one tolist"} <= set(flat.trace)


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


def test_a_request_retracted_in_flight_leaves_the_others_their_own_input_logprobs(
    tmp_path, models_root
):
    """SGLang issue #36938 in a real engine. The overlap scheduler launches a
    prefill batch, then, before it processes that batch's result, retracts a
    request of it (``SGLANG_TEST_RETRACT=1``: SGLang's own switch that runs
    its retraction every third step). The result loop skips the retracted
    request without moving its input-logprob cursor, so on the stock engine
    the requests after it get the wrong rows; with flatgather each gets its
    own, the same as in a run without retraction."""
    _runs("retract")
    if ROW is not None and ROW.skip_advances_logprob_pt:
        pytest.skip(f"SGLang {RELEASE} advances the cursor itself")
    workload = RETRACTION | {"shape": RETRACTION["shape"] | _ids(), "tag": "-retract"}
    calm = harness.serve(tmp_path / "calm", models_root, "plain", flatgather=False, **workload)
    # A small KV pool, filled eagerly, and SGLang's retraction every third step.
    workload["engine"] = {"max_total_tokens": 600, "schedule_conservativeness": 0.01}
    retract = {"SGLANG_TEST_RETRACT": "1"}
    stock = harness.serve(tmp_path, models_root, "plain", flatgather=False, env=retract, **workload)
    flat = harness.serve(tmp_path, models_root, "plain", flatgather=True, env=retract, **workload)
    assert "retraction" in stock.log and "retraction" in flat.log

    def wrong(served) -> list[int]:
        return [
            i
            for i, (a, b) in enumerate(zip(calm.answers, served.answers, strict=True))
            if not harness.same_values(harness.input_logprobs(a), harness.input_logprobs(b), 1e-3)
        ]

    assert wrong(flat) == []
    # The bug is there to fix: some request of the stock engine was served
    # rows that are not its own.
    assert wrong(stock), "the stock engine served every request its own input logprobs"


@pytest.mark.skipif(os.environ.get("FLATGATHER_ENGINE_DETERMINISM") != "1", reason="on demand")
@pytest.mark.parametrize("scenario", ["plain", "eagle3-topk1"])
def test_the_stock_engine_answers_the_same_twice(scenario, tmp_path, models_root):
    """The comparison means something only if stock is deterministic: two
    stock runs give the same answers (on demand: FLATGATHER_ENGINE_DETERMINISM=1)."""
    _runs(scenario)
    workload = WORKLOADS[scenario] | {"shape": WORKLOADS[scenario]["shape"] | _ids()}
    first = harness.serve(tmp_path / "a", models_root, scenario, flatgather=False, **workload)
    second = harness.serve(tmp_path / "b", models_root, scenario, flatgather=False, **workload)
    assert harness.first_difference(first.answers, second.answers) is None
