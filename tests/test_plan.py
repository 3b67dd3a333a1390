"""``flatgather.prune_plan``: the index sets, checked against SGLang's own
``_get_pruned_states`` of the release under test."""

from __future__ import annotations

import flatgather
import numpy as np
import pytest
import torch
from _sglang import TRAILING_TOKEN_TO_SEQ, stock_pruned_states
from _strategies import batches
from flatgather import PlanError, prune_plan
from flatgather._errors import KINDS
from flatgather.bench.batches import metadata
from hypothesis import given
from hypothesis import strategies as st


def test_seed_example_from_sglang_source():
    # extend [4, 5, 6], start [0, 5, 3] over rows t00..t03, t10..t14, t20..t25:
    # pruned rows t00 t01 t02 t03 t14 t23 t24 t25.
    plan = prune_plan([4, 5, 6], [0, 5, 3])
    assert plan.gather.tolist() == [0, 1, 2, 3, 8, 12, 13, 14]
    assert plan.sample.tolist() == [3, 4, 7]
    assert plan.input_logprob.tolist() == [0, 1, 2, 3, 5, 6, 7]
    assert plan.token_to_seq.tolist() == [0, 0, 0, 0, 1, 2, 2, 2]
    assert plan.num_pruned == 8
    for t in (plan.gather, plan.sample, plan.input_logprob, plan.token_to_seq):
        assert t.dtype == torch.int64 and t.device.type == "cpu" and t.dim() == 1
        assert t.untyped_storage().data_ptr() == plan.buffer.untyped_storage().data_ptr()


def test_chunked_prefill_request_keeps_one_row_and_no_logprob():
    plan = prune_plan([3, 2], [3, 0])
    assert plan.gather.tolist() == [2, 3, 4]
    assert plan.sample.tolist() == [0, 2]
    assert plan.input_logprob.tolist() == [1, 2]


def sglang_indices(extend, start):
    """The index sets as the release's own code computes them: rows numbered
    0..T-1 go through its _get_pruned_states, so the kept rows are the gather
    indices."""
    rows = torch.arange(sum(extend), dtype=torch.float64).unsqueeze(1)
    pruned, _, _, sample, input_logprob, token_to_seq = stock_pruned_states(
        rows, None, None, metadata(extend, start)
    )
    if TRAILING_TOKEN_TO_SEQ:
        # Releases before 0.5.16 append the last request's index once more.
        assert token_to_seq[-1] == len(extend) - 1
        token_to_seq = token_to_seq[:-1]
    return pruned[:, 0].long().tolist(), sample.tolist(), input_logprob.tolist(), token_to_seq


@pytest.mark.matrix
@given(batches(), st.integers(0, 64))
def test_plan_equals_sglang_indices(batch, pad):
    extend, start = batch
    plan = prune_plan(extend, start, num_rows=sum(extend) + pad)
    gather, sample, input_logprob, token_to_seq = sglang_indices(extend, start)
    assert plan.gather.tolist() == gather
    assert plan.sample.tolist() == sample
    assert plan.input_logprob.tolist() == input_logprob
    assert plan.token_to_seq.tolist() == token_to_seq
    assert plan.num_pruned == len(gather)


@pytest.mark.parametrize(
    "make",
    [
        lambda v: v,
        tuple,
        lambda v: torch.tensor(v, dtype=torch.int32),
        lambda v: torch.tensor(v, dtype=torch.int64)[::1],
        lambda v: torch.tensor([x for x in v for _ in "ab"])[::2],  # non-contiguous
        lambda v: np.array(v, dtype=np.int64),
        lambda v: np.array(v, dtype=np.uint16),
        lambda v: [np.int64(x) for x in v],
    ],
    ids=[
        "list",
        "tuple",
        "int32-tensor",
        "int64-tensor",
        "strided-tensor",
        "int64-array",
        "uint16-array",
        "numpy-scalars",
    ],
)
def test_accepts_integer_sequences(make):
    plan = prune_plan(make([4, 5, 6]), make([0, 5, 3]))
    assert plan.gather.tolist() == [0, 1, 2, 3, 8, 12, 13, 14]


def test_pin_memory_is_honoured_when_asked_off():
    assert not prune_plan([2], [0], pin_memory=False).buffer.is_pinned()


def test_default_pinning_never_asks_whether_cuda_is_available(monkeypatch):
    """Asking ``torch.cuda.is_available()`` may create a CUDA context (and
    fails in a forked child of a CUDA parent): by default the buffer is
    pinned only where this process already initialised CUDA."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: calls.append(1) or True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    plan = prune_plan([4, 5, 6], [0, 5, 3])
    assert calls == [] and not plan.buffer.is_pinned()


def test_padding_rows_are_allowed_unless_exact_rows():
    """``num_rows`` is the rows of hidden_states: at least the tokens (SGLang
    pads past them), exactly the tokens with ``exact_rows=True``."""
    padded = prune_plan([4, 5, 6], [0, 5, 3], num_rows=32)
    assert padded.gather.tolist() == [0, 1, 2, 3, 8, 12, 13, 14]
    assert prune_plan([4, 5, 6], [0, 5, 3], num_rows=15, exact_rows=True).num_pruned == 8
    with pytest.raises(PlanError) as info:
        prune_plan([4, 5, 6], [0, 5, 3], num_rows=16, exact_rows=True)
    assert info.value.kind == "row_mismatch" and info.value.request is None
    with pytest.raises(PlanError) as info:
        prune_plan([4, 5, 6], [0, 5, 3], num_rows=14)
    assert info.value.kind == "too_few_rows"
    assert "15 tokens" in str(info.value) and "14 rows" in str(info.value)


def test_rotation_plan_seed_example():
    plan = flatgather.rotation_plan([3, 1, 2], num_rows=6, embeds=True)
    ids = torch.tensor([10, 11, 12, 20, 30, 31])
    tails = torch.tensor([13, 21, 32])
    assert torch.cat((ids, tails))[plan.ids].tolist() == [11, 12, 13, 21, 31, 32]
    assert plan.embeds.tolist() == [1, 2, 2, 3, 5, 5]
    assert flatgather.rotation_plan([2]).embeds is None
    with pytest.raises(PlanError) as info:
        flatgather.rotation_plan([3, 1, 2], num_rows=7)
    assert info.value.kind == "row_mismatch"


BAD = [
    # (extend, start, num_rows, words the message must contain, request)
    ([4, -1], [0, 0], None, ["request 1", "extend_seq_lens[1] = -1", "negative"], 1),
    ([4, 2], [0, -2], None, ["request 1", "extend_logprob_start_lens[1] = -2"], 1),
    ([4, 5, 6], [0, 6, 3], None, ["request 1", "= 6 exceeds extend_seq_lens[1] = 5"], 1),
    ([4, 0], [0, 0], None, ["request 1", "extend_seq_lens[1] = 0"], 1),
    ([4, 5], [0], None, ["has 2 requests", "has 1"], None),
    ([], [], None, ["no request"], None),
    ([4, 2.0], [0, 0], None, ["request 1", "must be an int", "float 2.0"], 1),
    ([4, True], [0, 0], None, ["request 1", "bool"], 1),
    ([4, None], [0, 0], None, ["request 1", "got None"], 1),
    ([4, "5"], [0, 0], None, ["request 1", "str"], 1),
    ([2**63], [0], None, ["request 0", "int of 64 bits", "does not fit in int64"], 0),
    ([2**31, 5], [0, 0], None, ["request 0", "over the limit"], 0),
    ([4, 5, 6], [0, 5, 3], 14, ["15 tokens", "only 14 rows"], None),
    ([4, 5, 6], [0, 5, 3], -1, ["15 tokens", "only -1 rows"], None),
    ([2**25 * 3], [0], None, ["GiB", "over the limit of 1.00 GiB"], None),
]


@pytest.mark.parametrize(("extend", "start", "rows", "words", "request_index"), BAD)
def test_bad_metadata_raises_plan_error_naming_request_and_values(
    extend, start, rows, words, request_index
):
    with pytest.raises(PlanError) as info:
        prune_plan(extend, start, num_rows=rows)
    assert isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value)
    assert info.value.request == request_index
    assert info.value.kind in KINDS


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (torch.tensor([[4, 5]]), ["1-D", "(1, 2)"]),
        (torch.tensor([4.0, 5.0]), ["integers", "float32"]),
        (torch.tensor([True]), ["integers", "bool"]),
        (np.array([4.0]), ["integers", "float64"]),
        (np.zeros((2, 2), dtype=np.int64), ["1-D"]),
        (None, ["got None"]),
        ({4: 0}, ["dict"]),
    ],
)
def test_bad_containers_raise_plan_error(value, words):
    with pytest.raises(PlanError) as info:
        prune_plan(value, [0])
    for word in words:
        assert word in str(info.value)
    assert info.value.kind == "bad_container" and info.value.request is None


def test_plan_error_is_exported_value_error_and_pickles_whole():
    import pickle

    assert issubclass(flatgather.PlanError, ValueError)
    assert flatgather.MAX_TOKENS == 2**31 - 1
    assert flatgather.MAX_PLAN_BYTES == 2**30
    with pytest.raises(PlanError) as info:
        prune_plan([4, -1], [0, 0])
    copy = pickle.loads(pickle.dumps(info.value))
    assert (type(copy), str(copy), copy.kind, copy.request) == (
        PlanError,
        str(info.value),
        "negative",
        1,
    )
