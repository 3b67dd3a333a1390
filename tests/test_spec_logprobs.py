"""The output-logprob chain of decode and speculative verify steps
(flatgather.sglang.patches.output_logprobs.runtime): flat, and bit-exact with the release.

The oracle is always the release's own chain, its stage objects taken
before any install (flatgather.bench.spec_chain): its spec logprob
function, ``GenerationBatchResult.copy_to_cpu``, the scheduler's
``_normalize_decode_outputs`` and ``_apply_decode_logprobs`` (inline before
0.5.13: there the bench's chain runs stage 3 as the method's comprehensions,
and the method itself, as installed, runs against the release's on stand-ins
for the scheduler, the batch and its requests). Everything the scheduler
holds after stage 3, and everything it appends to each request, must be
identical: values bit for bit, Python types, nesting, the id lists
themselves.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import textwrap
import types

import flatgather.sglang as fs
import numpy as np
import pytest
import torch
from _sglang import RELEASE  # skips without a release
from flatgather import PlanError, testing
from flatgather._core import SpecLogprobsPlan
from flatgather.bench import spec_chain as sc
from flatgather.bench.counts import aten_ops, host_syncs
from flatgather.sglang import installer
from flatgather.sglang.patches import output_logprobs
from flatgather.sglang.patches.output_logprobs import difference
from flatgather.sglang.patches.output_logprobs import runtime as flat_logprobs
from flatgather.sglang.patches.prefill_result.harness import INERT
from hypothesis import given, settings
from hypothesis import strategies as st

CHAIN = sc.find()  # the release's own stage objects, before any install
VOCAB = 48
# Before 0.5.21 a row without ids is an empty list, on which the release's
# own stage 3 fails (AttributeError): a batch mixing None with ids crashes it.
NONE_AS_TENSOR = "new_empty" in (
    sc._raw_function(CHAIN.spec.__globals__["get_token_ids_logprobs"])
    .__globals__["get_token_ids_logprobs_raw"]
    .__code__.co_names
)


def outcome(step, stock: bool, copy: bool = True):
    try:
        return sc.run(step, stock=stock, copy=copy)
    except Exception as exc:  # the same failure, or none
        return {"raised": type(exc).__name__}


def check(step, copy: bool = True) -> dict:
    expected = outcome(step, stock=True, copy=copy)
    fs.install()
    actual = outcome(step, stock=False, copy=copy)
    found = difference(actual, expected, "chain")
    assert found is None, found
    return actual


# --- the plan (the binding) --------------------------------------------------------------------


def test_plan_seed_examples():
    plan = SpecLogprobsPlan.top_k([2, 2, 1, 1, 0, 0], 8, 10)
    assert (plan.width, plan.num_rows, plan.num_values, plan.uniform) == (2, 6, 12, False)
    assert plan.split_sizes() == [2, 0, 2, 0, 1, 1, 1, 1, 0, 2, 0, 2]
    assert plan.rows_of(list(range(12))) == [[0, 1], [2, 3], [4], [6], [], []]
    plan = SpecLogprobsPlan.token_ids([[7, 3], [], None, [-1]], 4, 10)
    out = np.zeros(plan.buffer_len(), dtype=np.int64)
    plan.fill(out)
    assert out.tolist() == [7, 3, 39] and plan.none_rows() == [2]
    assert plan.rows_of([0.5, 1.5, 2.5]) == [[0.5, 1.5], [], [], [2.5]]
    for bad, kind in (([1, -1], "negative"), ([1, 11], "left_to_release"), ([], "empty_batch")):
        with pytest.raises(PlanError) as err:
            SpecLogprobsPlan.top_k(bad, 4, 10)
        assert err.value.kind == kind
    with pytest.raises(PlanError) as err:
        SpecLogprobsPlan.token_ids([[1], [10]], 2, 10)
    assert (err.value.kind, err.value.request) == ("token_id_out_of_range", 1)


# --- install -----------------------------------------------------------------------------------


@pytest.mark.matrix
def test_install_patches_every_stage_the_release_has_and_notes_nothing():
    report = fs.install()
    chain = [n for n in report.notes if "logprob" in n and "left stock" in n]
    assert not chain, chain
    spec_module = CHAIN.spec.__module__
    expected = {
        f"{spec_module}.get_top_logprobs",
        f"{spec_module}.get_token_ids_logprobs",
        "sglang.srt.managers.utils.GenerationBatchResult.copy_to_cpu",
    }
    if CHAIN.processor is not None:
        where = f"{CHAIN.processor.__module__}.{CHAIN.processor.__qualname__}"
        expected |= {f"{where}._normalize_decode_outputs", f"{where}.move_logprobs_to_cpu"}
    if CHAIN.spec_kind == "method":  # 0.5.10: the worker module looks them up itself
        expected |= {f"{sc.WORKER}.get_top_logprobs", f"{sc.WORKER}.get_token_ids_logprobs"}
    assert expected <= set(report.patched), sorted(expected - set(report.patched))
    # The rebuilt methods are the release's, rebuilt: same name, same file.
    built = CHAIN.result_cls.copy_to_cpu
    assert built is not CHAIN.stock["copy_to_cpu"]
    assert built.__qualname__ == CHAIN.stock["copy_to_cpu"].__qualname__
    assert fs.uninstall()
    assert sc._raw(CHAIN.result_cls, "copy_to_cpu") is CHAIN.stock["copy_to_cpu"]
    assert vars(CHAIN.result_cls)["copy_to_cpu"] is not built


@pytest.mark.matrix
def test_the_mixin_methods_are_rewritten_before_0_5_13():
    """Up to 0.5.12 stage 3 is inline in the mixin's process_batch_result_*:
    only its comprehensions are replaced, and the rewrite with them put back
    is the release's tree."""
    if CHAIN.processor is not None:
        pytest.skip("the release has SchedulerBatchResultProcessor")
    import sglang.srt.managers.scheduler_output_processor_mixin as mixin

    prepared = output_logprobs.CHAIN.prepare(mixin)
    assert not prepared.notes, prepared.notes
    assert {p.name for p in prepared.swaps} == {
        "process_batch_result_prefill",
        "process_batch_result_decode",
    }


# --- bit-exact on the named cases ----------------------------------------------------------------

IDS = [[3, 1], None, [], [2, -1, 47, 2], [0], [-48, 5, 4, 9]]
NAMED = {
    "top 0/1/20 mixed, requests without logprobs": dict(B=6, A=4, top=[0, 1, 20, 0, 5, 20]),
    "top-k all equal (the rows as they are)": dict(B=5, A=3, top=[5] * 5),
    "token ids ragged, empty": dict(B=4, A=4, top=[0] * 4, ids=[IDS[0], IDS[2], IDS[3], IDS[5]]),
    "token ids None mixed in": dict(B=5, A=2, top=[1, 0, 0, 3, 0], ids=IDS[:5]),
    "both, A = 1 (plain decode's shape)": dict(B=7, A=1, top=[2] * 7, ids=[IDS[0]] * 7),
    "A = 8": dict(B=3, A=8, top=[4, 0, 20], ids=[IDS[3], IDS[4], IDS[0]]),
    "B = 1": dict(B=1, A=4, top=[5], ids=[IDS[3]]),
    "B = 1, A = 1 (one row: the release's chain)": dict(B=1, A=1, top=[5], ids=[IDS[0]]),
}


@pytest.mark.matrix
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("copy", [True, False], ids=["copy_to_cpu", "no-copy"])
@pytest.mark.parametrize("name", list(NAMED))
def test_the_chain_is_the_release_s_on_named_cases(name, copy, dtype):
    case = NAMED[name]
    B = case["B"]
    ids = case.get("ids", [None] * B)
    step = sc.make_step(B, case["A"], case["top"], ids, vocab=VOCAB, dtype=dtype, seed=B)
    out = check(step, copy=copy)
    mixed_none = None in ids and any(i is not None for i in ids)
    if "raised" in out:  # the release's own failure (see NONE_AS_TENSOR)
        assert not NONE_AS_TENSOR and mixed_none
    if B * case["A"] >= flat_logprobs.MIN_ROWS and (NONE_AS_TENSOR or not mixed_none):
        # Flat: a .tolist() per list, not per row (ids, logprobs, and at most
        # top val, top idx, token-id val).
        assert fg_syncs(step, copy) <= 5


def fg_syncs(step, copy: bool = True) -> int:
    one, two, three, _ = sc.stages(CHAIN, step)

    def chain():
        one()
        if copy:
            two()
        three()

    return host_syncs(chain)


@st.composite
def steps(draw):
    B = draw(st.integers(1, 24))
    A = draw(st.integers(1, 8))
    top = draw(st.lists(st.sampled_from([0, 0, 1, 3, 20]), min_size=B, max_size=B))
    id_list = st.lists(st.integers(-VOCAB, VOCAB - 1), max_size=5)
    if NONE_AS_TENSOR:
        ids = draw(st.lists(st.none() | id_list, min_size=B, max_size=B))
    else:  # None mixed with ids fails in the release: covered by the named cases
        ids = draw(st.lists(id_list, min_size=B, max_size=B) | st.just([None] * B))
    accept = draw(st.lists(st.integers(1, A), min_size=B, max_size=B))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    return sc.make_step(B, A, top, ids, accept, vocab=VOCAB, dtype=dtype, seed=B * A)


@pytest.mark.matrix
# A tenth of the property tests' examples: 30 on the whole-suite releases.
@settings(max_examples=max(1, settings.default.max_examples // 10))
@given(step=steps(), copy=st.booleans())
def test_the_chain_is_the_release_s_on_any_step(step, copy):
    fs.uninstall()
    out = check(step, copy=copy)
    assert "raised" not in out, out


# --- stage 3 up to 0.5.12: the rewritten mixin method itself -----------------------------------

MIXIN = "sglang.srt.managers.scheduler_output_processor_mixin"
_RESOLVE = ("_resolve_spec_overlap_tokens", "_resolve_spec_overlap_token_ids")


class _Scheduler:
    """``self`` of the mixin's ``process_batch_result_decode``: the
    attributes given, the release's own spec-v2 token resolver, any other
    attribute an inert collaborator."""

    def __init__(self, owner: type, **attrs) -> None:
        vars(self).update(attrs)
        for name in _RESOLVE:
            if name in vars(owner):
                setattr(self, name, types.MethodType(vars(owner)[name], self))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return INERT


_RECEIVED = tuple(
    f"output_{kind}_{part}"
    for kind in ("token_logprobs", "top_logprobs", "token_ids_logprobs")
    for part in ("val", "idx")
)


class _DecodeReq:
    """A request of a decode batch, as that method and the release's resolver
    read it (up to 0.5.12 the logprob lists are on the request itself). Any
    other attribute raises: a release that reads more shows here."""

    def __init__(self, i: int, step, skipped: str | None) -> None:
        self.rid = f"req{i}"
        self.is_retracted = skipped == "retracted"
        self._finished = skipped == "finished"
        self.return_logprob = True
        self.top_logprobs_num = step.top[i]
        self.token_ids_logprob = step.ids[i]
        self.output_ids = []
        for name in _RECEIVED:
            setattr(self, name, [])
        self.kv_committed_len = self.spec_verify_ct = 0
        self.spec_accepted_tokens = self.spec_accepted_drafts = self.spec_num_correct_drafts = 0
        self.return_hidden_states = self.require_reasoning = False
        self.grammar = self.multimodal_inputs = self.session = None
        self.time_stats = INERT

    def finished(self) -> bool:
        return self._finished

    def check_finished(self, *args) -> None:
        pass  # unfinished: the request stays in the batch

    def update_spec_acceptance_histogram(self, *args) -> None:
        pass

    update_spec_correct_drafts_histogram = update_spec_acceptance_histogram

    def received(self) -> dict:
        return {name: getattr(self, name) for name in ("output_ids", *_RECEIVED)}


def _decode_result(method, step, stock: bool, spec: bool, skipped: dict) -> dict:
    """Stages 1 and 2 of ``step`` (the release's own objects, or whatever is
    installed), then ``method``, the mixin's ``process_batch_result_decode``,
    on stand-ins for the scheduler and the batch: what each request
    receives, and the lists the scheduler holds after it."""
    owner = importlib.import_module(MIXIN).SchedulerOutputProcessorMixin
    one, two, _, state = sc.stages(CHAIN, step, stock)
    try:
        one()
        two()
        result = state["result"]
        lo = result.logits_output
        if not spec:  # plain decode (A = 1): one logprob per request
            lo.next_token_logprobs = lo.next_token_logprobs.view(-1)
        result.accept_lens = torch.tensor(step.accept)
        result.speculative_num_draft_tokens = step.A
        reqs = [_DecodeReq(i, step, skipped.get(i)) for i in range(step.B)]
        batch = types.SimpleNamespace(
            reqs=reqs,
            return_logprob=True,
            is_spec_v2=spec,
            spec_algorithm=types.SimpleNamespace(is_none=lambda: not spec),
            batch_size=lambda: len(reqs),
        )
        scheduler = _Scheduler(
            owner,
            enable_overlap=True,  # the retracted and finished requests are skipped
            enable_overlap_mlx=False,
            enable_metrics=False,
            enable_hisparse=False,
            num_generated_tokens=0,
            forward_ct_decode=0,
            draft_worker=types.SimpleNamespace(speculative_num_draft_tokens=step.A),
            server_args=types.SimpleNamespace(disaggregation_decode_enable_offload_kvcache=False),
            model_config=types.SimpleNamespace(think_end_id=None),
        )
        flat = flat_logprobs.registered(lo.next_token_top_logprobs_val)
        with torch.inference_mode():
            method(scheduler, batch, result)
    except Exception as exc:  # the same failure, or none
        return {"raised": type(exc).__name__}
    return {
        "requests": [r.received() for r in reqs],
        "top_val": lo.next_token_top_logprobs_val,
        "top_idx": lo.next_token_top_logprobs_idx,
        "ids_val": lo.next_token_token_ids_logprobs_val,
        "flat": flat,
    }


_DECODE_CASES = {
    **NAMED,
    "retracted and finished requests skipped": dict(
        B=5,
        A=3,
        top=[2, 0, 5, 1, 20],
        ids=[IDS[0], IDS[2], IDS[3], IDS[4], IDS[5]],
        skipped={1: "retracted", 3: "finished"},
    ),
    "the first and the last skipped": dict(
        B=4, A=2, top=[3, 3, 3, 3], skipped={0: "finished", 3: "retracted"}
    ),
}


@pytest.mark.matrix
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(_DECODE_CASES))
def test_the_rewritten_decode_method_gives_each_request_the_release_s(name, dtype):
    """Up to 0.5.12 stage 3 is inline in the mixin's
    process_batch_result_decode: the method flatgather installs (rebuilt
    from the release's source) against the release's own, both driven on
    the chain's real stages 1 and 2 with stand-ins for the scheduler, the
    batch and its requests (retracted and finished ones among them, skipped
    as an overlap scheduler skips them): what each request receives, and the
    lists the scheduler holds after it."""
    if CHAIN.processor is not None:
        pytest.skip("the release has SchedulerBatchResultProcessor")
    owner = importlib.import_module(MIXIN).SchedulerOutputProcessorMixin
    stock = vars(owner)["process_batch_result_decode"]
    assert not hasattr(stock, "__flatgather__")
    case = _DECODE_CASES[name]
    B, A = case["B"], case["A"]
    ids = case.get("ids", [None] * B)
    skipped = case.get("skipped", {})
    modes = (True, False) if A == 1 else (True,)  # plain decode has one row per request
    steps = {
        spec: sc.make_step(B, A, case["top"], ids, vocab=VOCAB, dtype=dtype, seed=B)
        for spec in modes
    }
    expected = {spec: _decode_result(stock, steps[spec], True, spec, skipped) for spec in modes}
    fs.install()
    method = vars(owner)["process_batch_result_decode"]
    assert getattr(method, "__flatgather__", None) == output_logprobs.CONSUMERS
    for spec in modes:
        actual = _decode_result(method, steps[spec], False, spec, skipped)
        mode = "spec v2" if spec else "plain decode"
        if "raised" in expected[spec]:  # the release's own failure (see NONE_AS_TENSOR)
            assert actual == expected[spec] and not NONE_AS_TENSOR, (mode, actual)
            continue
        assert not expected[spec].pop("flat")
        flat = actual.pop("flat", None)
        found = difference(actual, expected[spec], mode)
        assert found is None, found
        # flatgather's stage 3 got its lists flat (a batch of one row is the release's).
        assert flat == (B * A >= flat_logprobs.MIN_ROWS and any(case["top"]))
        got = actual["requests"]
        for i in skipped:  # skipped: nothing appended
            assert not any(got[i].values()), (mode, i, got[i])
        for i in set(range(B)) - set(skipped):  # each kept one: its accepted tokens
            accepted = steps[spec].accept[i] if spec else 1
            assert len(got[i]["output_token_logprobs_val"]) == accepted, (mode, i, got[i])


# --- flat: what one step costs ------------------------------------------------------------------


def _costs(B: int) -> tuple[int, int, int]:
    step = sc.make_step(B, 4, [5] * B, [[3, 7, 11, 40]] * B, vocab=VOCAB, seed=B)
    one, two, three, _ = sc.stages(CHAIN, step)
    copies: list = []

    def chain():
        one()
        two()
        three()

    with sc.emulated_copies(copies) as emulated:
        ops = aten_ops(chain)
        syncs = host_syncs(chain)
    return ops, len(copies) // 2 if emulated else -1, syncs


@pytest.mark.matrix
def test_ops_copies_and_tolist_calls_per_step_do_not_grow_with_the_batch():
    fs.install()
    small, large = _costs(8), _costs(128)
    assert small == large, (small, large)
    _, copies, syncs = large
    # tolist: next_token_logprobs, next token ids, top val, top idx, token-id val.
    assert syncs == 5 and copies in (-1, 5), large


# --- partial installs never give another answer ------------------------------------------------


def _stage(patch) -> str | None:
    if patch.name in (flat_logprobs.TOP, flat_logprobs.TOKEN_IDS):
        return "producers"
    if patch.name == "copy_to_cpu":
        return "copy"
    if getattr(patch.new, "__flatgather__", None) == output_logprobs.CONSUMERS:
        return "consumers"
    return None


def _only(*stages: str) -> None:
    """install(), then put back the release's own object of every stage of
    the chain not named."""
    fs.install()
    state = installer._state
    keep = []
    for patch in state.swaps:
        if _stage(patch) in (None, *stages):
            keep.append(patch)
        else:
            patch.revert()
    state.swaps[:] = keep


@pytest.mark.matrix
@pytest.mark.parametrize(
    "stages", [("producers",), ("producers", "copy"), ("copy", "consumers"), ("consumers",)]
)
def test_any_subset_of_the_stages_gives_the_release_s_answer(stages):
    ids = [[3, 1], [], [5, -2, 7]] * 2 if not NONE_AS_TENSOR else IDS
    step = sc.make_step(6, 3, [0, 1, 20, 2, 2, 5], ids, vocab=VOCAB)
    expected = outcome(step, stock=True)
    _only(*stages)
    found = difference(outcome(step, stock=False), expected, "chain")
    assert found is None, found


@pytest.mark.matrix
def test_an_uninstall_between_the_stages_gives_the_release_s_answer():
    step = sc.make_step(6, 3, [0, 1, 20, 2, 2, 5], [[3, 1], [], [5, -2, 7]] * 2, vocab=VOCAB)
    expected = sc.run(step, stock=True)
    fs.install()
    one, two, three, state = sc.stages(CHAIN, step)
    one()
    assert flat_logprobs.registered(state["result"].logits_output.next_token_top_logprobs_val)
    fs.uninstall()  # the release's copy and scheduler now see flatgather's lists
    two()
    three()
    lo = state["result"].logits_output
    got = {
        "top_val": lo.next_token_top_logprobs_val,
        "ids_val": lo.next_token_token_ids_logprobs_val,
    }
    want = {"top_val": expected["top_val"], "ids_val": expected["ids_val"]}
    assert difference(got, want, "chain") is None


# --- what goes to the release --------------------------------------------------------------------


@pytest.mark.matrix
def test_compiled_code_and_small_calls_get_the_release_s_function(monkeypatch):
    fs.install()
    module = __import__(CHAIN.spec.__module__, fromlist=["x"])
    top = module.get_top_logprobs
    logprobs = torch.randn(6, VOCAB).log_softmax(-1)
    vals, _ = top(logprobs, [2] * 6, no_copy_to_cpu=True)
    assert flat_logprobs.registered(vals)
    vals, _ = top(logprobs[:1], [2], no_copy_to_cpu=True)
    assert not flat_logprobs.registered(vals)  # one row
    vals, _ = top(logprobs, [2] * 6)
    assert type(vals[0]) is list  # the copying path is the release's
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    vals, _ = top(logprobs, [2] * 6, no_copy_to_cpu=True)
    assert not flat_logprobs.registered(vals)


@pytest.mark.matrix
def test_a_module_that_imports_a_patched_producer_gets_the_release_s_back():
    """A module imported after install() that takes the helpers from the
    patched module (0.5.10's worker, the sampler) is checked against, and
    restored to, the release's own function; preparing it writes nothing
    (what changes the module is the swap, applied and reverted)."""
    fs.install()
    module = __import__(CHAIN.spec.__module__, fromlist=["x"])
    defining = module.get_top_logprobs.__globals__["__name__"]
    late = types.ModuleType("late_importer")
    theirs = late.get_top_logprobs = module.get_top_logprobs  # flatgather's, as imported now
    release = sc._raw_function(late.get_top_logprobs)
    assert late.get_top_logprobs is not release and defining
    prepared = output_logprobs.PRODUCER.prepare(late)
    assert vars(late)["get_top_logprobs"] is theirs, "prepare() wrote to the module"
    (patch,) = prepared.swaps
    patch.apply()
    assert patch.new.__wrapped__ is release
    patch.revert()
    assert vars(late)["get_top_logprobs"] is release


def test_registered_lists_are_bounded_and_forgotten_at_uninstall():
    fs.install()
    top = flat_logprobs.make_top_logprobs(lambda *a: None)
    logprobs = torch.randn(4, VOCAB)
    lists = [top(logprobs, [1] * 4, True)[0] for _ in range(flat_logprobs._LIVE_MAX)]
    assert not flat_logprobs.registered(lists[0]) and flat_logprobs.registered(lists[-1])
    fs.uninstall()
    assert not flat_logprobs.registered(lists[-1])
    # A list changed after registration goes to the release's loop.
    vals, _ = top(logprobs, [1] * 4, True)
    vals[0] = vals[0] + 1
    assert flat_logprobs.rows_tolist(vals, lambda v: v.tolist()) == [v.tolist() for v in vals]


def test_rewrite_replaces_only_the_known_comprehensions():
    tree = ast.parse(
        textwrap.dedent(
            """
            def f(self, out):
                a = [v.tolist() for v in out.next_token_top_logprobs_val]
                b = [_d2h(x) if torch.is_tensor(x) else x for x in out.next_token_top_logprobs_idx]
                c = [v.tolist() for v in out.other]
                return a, b, c
            """
        )
    ).body[0]
    result = output_logprobs.rewrite(tree)
    assert {kind for kind, _ in result.elts.values()} == {
        output_logprobs.TOLIST,
        output_logprobs.TO_HOST,
    }
    assert "out.other" in ast.unparse(result.tree) and ast.unparse(result.tree).count("[") == 1
    other = ast.parse(
        "def f(o):\n    return [v.tolist() + 1 for v in o.next_token_top_logprobs_val]"
    )
    assert "another shape" in output_logprobs.rewrite(other.body[0])


@pytest.mark.parametrize("edit", ["another list", "another helper"])
def test_a_rewrite_whose_call_is_not_its_loop_is_refused(monkeypatch, edit):
    """The rewrite with its loops put back must be the release's tree, each
    loop rebuilt from its call's own list and lambda, of the call's kind:
    a call that reads another list, or hands the rows to the other helper,
    is refused (the install-time run of each element would not see it)."""

    from flatgather.sglang.patches.output_logprobs import loops

    class Edited(loops._Replace):
        def visit_ListComp(self, node):
            call = super().visit_ListComp(node)
            if isinstance(call, ast.Call) and call.args[0].attr.endswith("_idx"):
                if edit == "another list":
                    call.args[0].attr = call.args[0].attr.replace("_idx", "_val")
                else:
                    call.func.id = output_logprobs.TO_HOST
            return call

    tree = ast.parse(
        "def f(o):\n"
        "    a = [v.tolist() for v in o.next_token_top_logprobs_val]\n"
        "    b = [x.tolist() for x in o.next_token_top_logprobs_idx]\n"
    ).body[0]
    assert isinstance(output_logprobs.rewrite(tree), output_logprobs.Rewrite)
    monkeypatch.setattr(loops, "_Replace", Edited)
    found = output_logprobs.rewrite(tree)
    assert found == "the rewritten method is not the release's with the loops put back", found


# --- the install-time checks catch what they guard -------------------------------------------


@pytest.fixture
def fresh_checks():
    """The producer checks are remembered per installation: a test that
    breaks flatgather's code must leave no verdict behind on the shared
    patch either."""
    vars(output_logprobs.PRODUCER).pop("_memo", None)
    yield
    vars(output_logprobs.PRODUCER).pop("_memo", None)


@pytest.mark.matrix
def test_a_producer_that_differs_is_left_stock(monkeypatch, fresh_checks):
    module = __import__(CHAIN.spec.__module__, fromlist=["x"])
    # The rows in the wrong order: the check must see it.
    real = flat_logprobs._views
    monkeypatch.setattr(flat_logprobs, "_views", lambda plan, flat: real(plan, flat)[::-1])
    prepared = output_logprobs.PRODUCER.prepare(module)
    assert not prepared.swaps and prepared.notes, prepared


@pytest.mark.matrix
def test_a_chain_helper_that_differs_leaves_the_methods_stock(monkeypatch, fresh_checks):
    import sglang.srt.managers.utils as utils

    real = flat_logprobs._Flat.tolist
    monkeypatch.setattr(flat_logprobs._Flat, "tolist", lambda self, elt: real(self, elt)[1:])
    if CHAIN.processor is not None:
        module = __import__(CHAIN.processor.__module__, fromlist=["x"])
        prepared = output_logprobs.CHAIN.prepare(module)
        assert not prepared.swaps and prepared.notes, prepared
    monkeypatch.setattr(flat_logprobs, "_views", lambda plan, flat: [flat] * plan.num_rows)
    prepared = output_logprobs.CHAIN.prepare(utils)
    assert not prepared.swaps and prepared.notes, prepared


# --- the host copy: only the releases' own ----------------------------------------------------

# The element of copy_to_cpu's comprehensions, as every release writes it:
# `v.to("cpu", non_blocking=True)` up to 0.5.14, `_async_d2h(v)` since.
_COPY_ELT = re.compile(r'(\w+\((\w)\)|(\w)\.to\("cpu", non_blocking=True\)) if torch\.is_tensor')


def _host_copy(t):
    """A one-argument host copy that is none of the releases': on a CPU it
    gives what theirs give, and it has no pinned branch."""
    return t.to("cpu", non_blocking=True)


def _copy_mutant(tmp_path, monkeypatch, element: str | None):
    """The release's ``GenerationBatchResult.copy_to_cpu``, its source in a
    module of its own that reads the release module's globals, with each
    logprob row's copy written as ``element`` (a format of the row's name;
    None: as the release writes it); and a stand-in for the release's module
    holding it, for :func:`output_logprobs.CHAIN.prepare`."""
    import sglang.srt.managers.utils as utils

    text = textwrap.dedent(inspect.getsource(CHAIN.stock["copy_to_cpu"]))
    if element is not None:
        text, n = _COPY_ELT.subn(
            lambda m: element.format(m.group(2) or m.group(3)) + " if torch.is_tensor", text
        )
        assert n == 3, text
    name = f"fg_copy_mutant_{abs(hash((element, RELEASE)))}"
    (tmp_path / f"{name}.py").write_text(
        f"import {utils.__name__} as _release\n"
        "globals().update({k: v for k, v in vars(_release).items() if not k.startswith('__')})\n"
        f"from {__name__} import _host_copy\n"
        f"class GenerationBatchResult:\n{textwrap.indent(text, '    ')}"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    sys.modules.pop(name)
    return types.SimpleNamespace(
        __name__=utils.__name__, GenerationBatchResult=module.GenerationBatchResult
    )


@pytest.mark.matrix
def test_a_host_copy_of_other_code_leaves_copy_to_cpu_stock(tmp_path, monkeypatch):
    """On a CPU every release's host copy returns its input (or a plain
    copy): the check against the release's loop cannot tell another
    one-argument copy from the release's, so the copy must be one of the
    releases' own (its fingerprint in COPY_HELPERS)."""
    # The harness itself refuses nothing: the release's own copy is rebuilt.
    same = output_logprobs.CHAIN.prepare(_copy_mutant(tmp_path, monkeypatch, None))
    assert [p.name for p in same.swaps] == ["copy_to_cpu"] and not same.notes, same
    other = output_logprobs.CHAIN.prepare(_copy_mutant(tmp_path, monkeypatch, "_host_copy({0})"))
    assert not other.swaps, other
    (note,) = other.notes
    assert "copy_to_cpu left stock" in note and "_host_copy" in note, note
    assert "not a host copy flatgather knows" in note, note


@pytest.mark.matrix
def test_the_release_s_host_copy_is_known():
    import sglang.srt.managers.utils as utils

    helper = vars(utils).get("_async_d2h")
    if helper is None:  # up to 0.5.14: v.to("cpu", non_blocking=True) inline
        assert "_async_d2h" not in inspect.getsource(CHAIN.stock["copy_to_cpu"])
        return
    found = output_logprobs.consumers._copy_fingerprint(helper)
    assert RELEASE in output_logprobs.COPY_HELPERS.get(found, ()), (
        f"{RELEASE}: host copy fingerprint {found} not in COPY_HELPERS; regenerate it"
    )


def _copies_to_host(device: str, stock: bool, step, counter: list) -> dict:
    """Stages 1 and 2 of ``step`` on ``device`` (the release's own objects,
    or whatever is installed), each copy's ``record_stream`` counted: the
    host rows and whether each is pinned."""
    lo = sc._logits_output(step)
    if stock:
        with testing.module_functions_as_shipped():
            sc._stage1(CHAIN, step, lo)
    else:
        sc._stage1(CHAIN, step, lo)
    result = CHAIN.result_cls(logits_output=lo, next_token_ids=step.predict)
    result.copy_done = torch.cuda.Event() if device == "cuda" else sc._Event()
    copy = CHAIN.stock["copy_to_cpu"] if stock else CHAIN.result_cls.copy_to_cpu
    before = len(counter)
    copy(result, return_logprob=True)
    result.copy_done.synchronize()
    rows = {
        "top_val": lo.next_token_top_logprobs_val,
        "top_idx": lo.next_token_top_logprobs_idx,
        "ids_val": lo.next_token_token_ids_logprobs_val,
    }
    # A row of no values may have no memory at all: its pinning means nothing.
    pinned = {
        k: [v.is_pinned() for v in rows_ if torch.is_tensor(v) and v.numel()]
        for k, rows_ in rows.items()
    }
    return {
        "rows": rows,
        "pinned": pinned,
        "record_stream": len(counter) - before,
        "tensor_rows": {k: sum(map(torch.is_tensor, rows_ or ())) for k, rows_ in rows.items()},
        # Which lists are handed on flat (flatgather's copy ran on them).
        "flat": {k: flat_logprobs.registered(rows_) for k, rows_ in rows.items()},
    }


@pytest.mark.matrix
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_copy_to_cpu_is_the_release_s_on_the_device(device):
    """Stage 2 on the device's tensors: on CUDA the release's copy takes its
    pinned branch (a pinned host tensor, the copy, record_stream per row),
    which no CPU run reaches. flatgather's copy gives the same host rows,
    pinned where the release's are, with one record_stream per flat
    tensor."""
    counter: list = []
    real = torch.Tensor.record_stream

    def record_stream(self, stream):
        counter.append(1)
        return real(self, stream)

    assert "record_stream" not in vars(torch.Tensor)  # inherited: deleted after
    torch.Tensor.record_stream = record_stream
    try:
        ids = IDS[:5] if NONE_AS_TENSOR else [[3, 1], [], [2, -1, 47, 2], [0], [-48, 5, 4, 9]]
        step = sc.make_step(5, 4, [0, 1, 20, 3, 5], ids, vocab=VOCAB, dtype=torch.bfloat16)
        step.logits, step.predict = step.logits.to(device), step.predict.to(device)
        expected = _copies_to_host(device, True, step, counter)
        fs.install()
        actual = _copies_to_host(device, False, step, counter)
    finally:
        del torch.Tensor.record_stream
    assert actual["flat"]["top_val"], "flatgather's copy did not take its path"
    assert not any(expected["flat"].values())
    found = difference(actual["rows"], expected["rows"], "host rows")
    assert found is None, found
    assert actual["pinned"] == expected["pinned"]
    if device == "cuda":
        assert any(any(p) for p in expected["pinned"].values()), "no pinned row: no device branch"
    if expected["record_stream"]:  # the helpers' device branch (0.5.15 on)
        # One per flat tensor instead of one per row; the other copies alike.
        saved = sum(expected["tensor_rows"][k] - 1 for k, flat in actual["flat"].items() if flat)
        assert expected["record_stream"] - actual["record_stream"] == saved > 0, (expected, actual)
    else:  # `.to("cpu", non_blocking=True)` (pinned by torch on CUDA), or a CPU run
        assert actual["record_stream"] == 0


def test_move_logprobs_to_cpu_is_the_release_s():
    """The prefill twin of stage 3, on the lists the sampler's producers make."""
    if CHAIN.processor is None:
        pytest.skip("no SchedulerBatchResultProcessor before 0.5.13")
    stock = sc._raw(CHAIN.processor, "move_logprobs_to_cpu")
    step = sc.make_step(5, 1, [3, 0, 1, 3, 20], [None] * 5, vocab=VOCAB)

    def run(fn, install: bool):
        if install:
            fs.install()
        lo = sc._logits_output(step)
        sc._stage1(CHAIN, step, lo)
        fn(None, batch=types.SimpleNamespace(return_logprob=True), logits_output=lo)
        return [lo.next_token_top_logprobs_val, lo.next_token_top_logprobs_idx]

    with testing.module_functions_as_shipped():
        expected = run(stock, False)
    actual = run(CHAIN.processor.move_logprobs_to_cpu, True)
    assert difference(actual, expected) is None


@pytest.mark.matrix
def test_plain_decode_reaches_the_same_producers():
    """Non-speculative decode asks the same two helpers for the same shape
    (one row per request): its caller must find flatgather's."""
    try:
        from sglang.srt.layers.logprob_processor import OutputLogprobProcessor

        caller = OutputLogprobProcessor.compute_logprobs
    except ImportError:  # before 0.5.16: the sampler imports the helpers
        import sglang.srt.layers.sampler as sampler

        caller = next(
            f
            for f in vars(sampler.Sampler).values()
            if "get_top_logprobs" in getattr(getattr(f, "__code__", None), "co_names", ())
        )
    fs.install()
    for name in (flat_logprobs.TOP, flat_logprobs.TOKEN_IDS):
        assert getattr(caller.__globals__[name], "__flatgather__", None), name
