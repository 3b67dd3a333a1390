"""The installed ``_get_pruned_states`` against the release's own, on the
same inputs: same 6-tuple, same types, same bytes, same side effects on the
metadata, and the same hidden states stored by the release's
``_get_hidden_states_to_store``. ``hidden_states`` may carry padding rows past
the tokens (full of NaN here), as CUDA-graph buckets and DP attention leave
them; fewer rows than tokens is a PlanError."""

from __future__ import annotations

import dataclasses
import random

import flatgather.sglang
import pytest
import torch
from _sglang import (
    CAPTURE_MODES,
    PACKED_AUX,
    TRAILING_TOKEN_TO_SEQ,
    ForwardMode,
    LogitsMetadata,
    assert_same,
    expected_pruned_states,
    hidden_to_store,
    outcome,
    pruned_states,
    stock_pruned_states,
)
from _strategies import batches
from flatgather import PlanError, prune_plan
from flatgather.bench.batches import make_states, metadata
from hypothesis import given
from hypothesis import strategies as st

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Releases without packed aux never get one from their models; handing them
# one is tested once, small (the release walks it row by row, quadratically).
AUX_KINDS = ["none", "list", "empty-list"] + (["packed"] if PACKED_AUX else [])


def metadata_state(md) -> dict:
    return {f.name: getattr(md, f.name) for f in dataclasses.fields(LogitsMetadata)}


def compare(extend, start, h, b, aux, capture):
    """Run stock and installed on equal inputs and compare everything."""
    md_stock = metadata(extend, start, capture)
    expected = expected_pruned_states(extend, start, h, b, aux, md_stock)  # the release's own
    flatgather.sglang.install()  # once per test: later calls return at once
    md_ours = metadata(extend, start, capture)
    actual = pruned_states(h, b, aux, md_ours)
    assert_same(actual, expected)
    # Every field of the metadata, including what the release writes on it.
    assert_same(metadata_state(md_ours), metadata_state(md_stock), "metadata")
    stored = outcome(hidden_to_store, h, b, aux, actual, md_ours)
    stored_stock = outcome(hidden_to_store, h, b, aux, expected, md_stock)
    # An empty aux list fails in the release's own torch.cat under LAST
    # capture; it must fail the same way after pruning by flatgather.
    assert_same(stored, stored_stock, "hidden_states_to_store")
    return actual


@pytest.mark.matrix
@given(
    batch=batches(),
    seed=st.integers(0, 2**31),
    dtype=st.sampled_from(DTYPES),
    hidden=st.sampled_from([1, 4, 8]),
    before_norm=st.booleans(),
    aux_kind=st.sampled_from(AUX_KINDS),
    layers=st.integers(1, 3),
    capture=st.sampled_from(list(CAPTURE_MODES)),
    pad=st.sampled_from([0, 0, 1, 7, 64]),
)
def test_installed_equals_stock(
    batch, seed, dtype, hidden, before_norm, aux_kind, layers, capture, pad
):
    extend, start = batch
    h, b, aux = make_states(extend, seed, dtype, hidden, before_norm, aux_kind, layers, pad)
    compare(extend, start, h, b, aux, capture)


@pytest.mark.matrix
def test_sixty_random_padded_batches_are_bit_exact():
    """As a server hands them over: 60 random batches, each with 1 to 64
    padding rows full of NaN past its tokens, every aux kind and capture
    mode, through ``_get_pruned_states`` and ``_get_hidden_states_to_store``."""
    rng = random.Random(60)
    for case in range(60):
        size = rng.choice([1, 2, 5, 16, 64, 300])
        extend = [rng.randint(1, 40) for _ in range(size)]
        start = [rng.choice([0, e, rng.randint(0, e)]) for e in extend]
        aux_kind = rng.choice(AUX_KINDS)
        h, b, aux = make_states(
            extend, case, torch.bfloat16, 8, rng.random() < 0.5, aux_kind, 3, rng.randint(1, 64)
        )
        compare(extend, start, h, b, aux, rng.choice(list(CAPTURE_MODES)))


def test_seed_example_through_sglang():
    h, b, aux = make_states([4, 5, 6], 0, torch.float32, 4, True, "list", 3, pad=5)
    pruned, before, aux_pruned, sample, input_logprob, token_to_seq = compare(
        [4, 5, 6], [0, 5, 3], h, b, aux, "LAST"
    )
    rows = [0, 1, 2, 3, 8, 12, 13, 14]
    assert torch.equal(pruned, h[rows]) and torch.equal(before, b[rows])
    assert all(torch.equal(a, layer[rows]) for a, layer in zip(aux_pruned, aux, strict=True))
    assert sample.tolist() == [3, 4, 7]
    assert input_logprob.tolist() == [0, 1, 2, 3, 5, 6, 7]
    trailing = [2] if TRAILING_TOKEN_TO_SEQ else []
    assert token_to_seq == [0, 0, 0, 0, 1, 2, 2, 2, *trailing]
    assert not pruned.isnan().any()  # no padding row was read


@pytest.mark.parametrize(
    ("extend", "start"),
    [
        ([1], [0]),
        ([1], [1]),
        ([7], [7]),
        ([5, 5, 5], [5, 5, 5]),  # every request a chunk: no input logprob at all
        ([3, 9, 2], [0, 0, 0]),
        ([1] * 1024, [0] * 1024),
        ([2] * 1024, [2] * 1024),
        ([4096], [100]),
    ],
)
@pytest.mark.parametrize("aux_kind", AUX_KINDS)
@pytest.mark.parametrize("capture", list(CAPTURE_MODES))
@pytest.mark.parametrize("pad", [0, 3])
def test_named_edge_cases(extend, start, aux_kind, capture, pad):
    h, b, aux = make_states(extend, 1, torch.bfloat16, 8, True, aux_kind, 3, pad)
    compare(extend, start, h, b, aux, capture)


def one_changed(tensor, h, b, aux, change):
    """``(h, b, aux)`` with ``change`` made to ``tensor`` alone (of the aux
    layers, to the last)."""
    if tensor == "hidden":
        return change(h), b, aux
    if tensor == "before_norm":
        return h, change(b), aux
    return h, b, [*aux[:-1], change(aux[-1])]


@pytest.mark.matrix
@pytest.mark.parametrize("tensor", ["hidden", "before_norm", "aux"])
def test_fewer_rows_than_tokens_is_a_plan_error(tensor):
    extend, start = [4, 5, 6], [0, 5, 3]
    states = make_states(extend, 3, torch.float32, 4, True, "list", 2)
    h, b, aux = one_changed(tensor, *states, lambda t: t[:14])
    flatgather.sglang.install()
    with pytest.raises(PlanError) as info:
        pruned_states(h, b, aux, metadata(extend, start))
    assert info.value.kind == "too_few_rows" and "15 tokens" in str(info.value)


@pytest.mark.matrix
def test_zero_length_requests_get_the_release_answer():
    """A request of length 0 is outside the plan; the installed function
    hands such a batch to the release's own code, so the answer (or the
    error) is the release's."""
    extend, start = [3, 0, 2], [0, 0, 1]
    h, b, aux = make_states(extend, 4, torch.float32, 4, False, "none", 1, pad=2)
    expected = outcome(expected_pruned_states, extend, start, h, b, aux, metadata(extend, start))
    flatgather.sglang.install()
    assert_same(outcome(pruned_states, h, b, aux, metadata(extend, start)), expected)


# Batches the release takes (returning a result or failing its own assert)
# and the plan refuses: (extend_seq_lens_cpu, extend_logprob_start_lens_cpu).
REFUSED_BY_THE_PLAN = {
    "fewer starts than lengths": ([4, 5, 6], [0, 5]),  # the release zips: two requests
    "more starts than lengths": ([4, 5], [0, 5, 3]),
    "a start past its length": ([4, 5, 6], [0, 7, 3]),
    "a negative length": ([4, -2, 6], [0, 0, 3]),
    "a negative start": ([4, 5, 6], [0, -1, 3]),
    "no request": ([], []),
    "a float length": ([4, 5.0, 6], [0, 5, 3]),
    "a bool length": ([4, True, 6], [0, 0, 3]),
}


def odd_metadata(extend, start):
    md = metadata([1], [0])
    md.extend_seq_lens_cpu, md.extend_logprob_start_lens_cpu = list(extend), list(start)
    return md


@pytest.mark.matrix
@pytest.mark.parametrize("case", list(REFUSED_BY_THE_PLAN))
def test_metadata_the_plan_refuses_gets_the_release_answer(case):
    """The installed function hands such a batch to the release's own code:
    the same result (and metadata afterwards), or the same exception type."""
    extend, start = REFUSED_BY_THE_PLAN[case]
    with pytest.raises(PlanError):
        prune_plan(extend, start)
    h, b, aux = make_states([4, 5, 6], 6, torch.float32, 4, True, "list", 2, pad=2)
    md_stock, md_ours = odd_metadata(extend, start), odd_metadata(extend, start)
    expected = outcome(stock_pruned_states, h, b, aux, md_stock)
    flatgather.sglang.install()
    assert_same(outcome(pruned_states, h, b, aux, md_ours), expected)
    assert_same(metadata_state(md_ours), metadata_state(md_stock), "metadata")


@pytest.mark.matrix
@pytest.mark.parametrize("tensor", ["hidden", "before_norm", "aux"])
def test_a_0d_tensor_gets_the_release_answer(tensor):
    extend, start = [4, 5, 6], [0, 5, 3]
    states = make_states(extend, 7, torch.float32, 4, True, "list", 2)
    h, b, aux = one_changed(tensor, *states, lambda t: t[0, 0])
    expected = outcome(stock_pruned_states, h, b, aux, metadata(extend, start))
    flatgather.sglang.install()
    assert_same(outcome(pruned_states, h, b, aux, metadata(extend, start)), expected)


@pytest.mark.parametrize(
    "mode",
    [ForwardMode.DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND],
)
def test_other_branches_run_the_release_code(mode):
    """Decode, idle, verify, and prefill without logprobs: the installed
    function hands over to the release's own (same result, same objects)."""
    extend, start = [4, 5, 6], [0, 5, 3]
    h, b, aux = make_states(extend, 2, torch.float32, 4, True, "list", 2)

    def run():
        md = metadata(extend, start, "LAST", mode=mode)
        md.extend_return_logprob = False
        return pruned_states(h, b, aux, md)

    expected = run()
    flatgather.sglang.install()
    actual = run()
    assert_same(actual, expected)


@pytest.mark.skipif(PACKED_AUX, reason="the release handles packed aux itself")
def test_packed_aux_goes_to_the_release_where_it_has_no_packed_aux():
    extend, start = [4, 5, 6], [0, 5, 3]
    h, b, aux = make_states(extend, 5, torch.float32, 4, False, "packed", 2)
    expected = outcome(pruned_states, h, b, aux, metadata(extend, start))
    flatgather.sglang.install()
    assert_same(outcome(pruned_states, h, b, aux, metadata(extend, start)), expected)


def test_installed_function_is_marked_and_wraps_the_original():
    from _sglang import STOCK_PRUNED_STATES, LogitsProcessor

    report = flatgather.sglang.install()
    patched = vars(LogitsProcessor)["_get_pruned_states"]
    assert patched is not STOCK_PRUNED_STATES
    assert patched.__wrapped__ is STOCK_PRUNED_STATES
    assert patched.__flatgather__ == report.contract
