"""A whole ``LogitsProcessor.forward`` on CPU, input logprobs requested:
identical outputs with and without ``install()``, including batches padded
the way SGLang pads them (hidden_states past the tokens full of NaN)."""

from __future__ import annotations

import flatgather.sglang
import pytest
import torch
from _forward import make_processor, padded_forward_batch, release_outputs
from _sglang import CAPTURE_MODES, PACKED_AUX, assert_same, oracle_context
from _strategies import batches
from flatgather import PlanError
from flatgather.bench.batches import forward_metadata, make_forward_inputs, output_fields
from hypothesis import given
from hypothesis import strategies as st

VOCAB, HIDDEN = 48, 8
AUX_KINDS = ["none", "list"] + (["packed"] if PACKED_AUX else [])


def make_tensors(extend, seed, aux_kind, before_norm, pad):
    """input_ids, hidden states, before-norm states and 3 aux layers; the
    ``pad`` rows past the tokens full of NaN: never to be read."""
    return make_forward_inputs(
        extend, seed, VOCAB, torch.float32, HIDDEN, before_norm, aux_kind, 3, pad
    )


def run_forward(
    extend,
    start,
    capture,
    aux_kind,
    seed,
    top,
    token_ids,
    before_norm,
    pad=0,
    sglang_padding=False,
    stock=False,
):
    """``forward`` with metadata built by hand, or (``sglang_padding``) with
    a real ForwardBatch padded by the release's own ``_pad_inputs_to_size``."""
    processor, lm_head = make_processor(VOCAB, HIDDEN, seed, stock=stock)
    input_ids, hidden, before, aux = make_tensors(extend, seed, aux_kind, before_norm, pad)
    if sglang_padding:
        batch = padded_forward_batch(
            extend, start, capture, input_ids, top, token_ids, sum(extend) + pad
        )
        input_ids, md = batch.input_ids, batch
        assert input_ids.shape[0] == hidden.shape[0]
    else:
        md = forward_metadata(extend, start, capture, input_ids, top, token_ids)
    with oracle_context():
        return processor.forward(
            input_ids, hidden, lm_head, md, aux_hidden_states=aux, hidden_states_before_norm=before
        )


def both(*args, **kwargs):
    """The release's own forward and the installed one, on equal inputs."""
    extend, start, capture, aux_kind, seed, _, _, before_norm, *rest = args
    pad = rest[0] if rest else 0
    _, hidden, before, aux = make_tensors(extend, seed, aux_kind, before_norm, pad)
    stock = release_outputs(
        lambda mode: run_forward(extend, start, mode, *args[3:], **kwargs, stock=True),
        extend,
        start,
        capture,
        hidden,
        before,
        aux,
    )
    flatgather.sglang.install()  # once per test: later calls return at once
    ours = output_fields(run_forward(*args, **kwargs))
    return stock, ours


@st.composite
def logprob_requests(draw):
    extend, start = draw(batches(max_batch=48, max_extend=24))
    top = draw(st.lists(st.integers(0, 3), min_size=len(extend), max_size=len(extend)))
    # Token-id logprobs for every request or none: older releases index the
    # ids of every scored request once any request asks.
    ids = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3)
    if draw(st.booleans()):
        token_ids = draw(st.lists(ids, min_size=len(extend), max_size=len(extend)))
    else:
        token_ids = [None] * len(extend)
    return extend, start, top, token_ids


def check(stock, ours):
    assert_same(ours, stock)
    for name in ("next_token_logits", "input_token_logprobs"):
        if ours[name] is not None:  # None where no request has an input logprob
            assert not ours[name].isnan().any(), f"{name} read a padding row"


@pytest.mark.matrix
@given(
    request=logprob_requests(),
    capture=st.sampled_from(list(CAPTURE_MODES)),
    aux_kind=st.sampled_from(AUX_KINDS),
    seed=st.integers(0, 2**16),
    before_norm=st.booleans(),
    pad=st.sampled_from([0, 0, 1, 5, 40]),
    sglang_padding=st.booleans(),
)
def test_forward_outputs_identical(
    request, capture, aux_kind, seed, before_norm, pad, sglang_padding
):
    extend, start, top, token_ids = request
    stock, ours = both(
        extend,
        start,
        capture,
        aux_kind,
        seed,
        top,
        token_ids,
        before_norm,
        pad,
        sglang_padding=sglang_padding,
    )
    check(stock, ours)


@pytest.mark.matrix
@pytest.mark.parametrize("capture", list(CAPTURE_MODES))
@pytest.mark.parametrize("aux_kind", AUX_KINDS)
@pytest.mark.parametrize("before_norm", [False, True])
def test_padded_by_sglang_itself(capture, aux_kind, before_norm):
    """The release's own ``_pad_inputs_to_size`` pads the batch to a bucket
    (as DP attention and attention-TP scatter do): same outputs, no NaN read."""
    args = (
        [4, 5, 6],
        [0, 5, 3],
        capture,
        aux_kind,
        3,
        [2, 0, 1],
        [[1, 2], [4], [3]],
        before_norm,
        17,
    )
    stock, ours = both(*args, sglang_padding=True)
    check(stock, ours)


def test_seed_example_forward_with_everything_requested():
    args = ([4, 5, 6], [0, 5, 3], "FULL", AUX_KINDS[-1], 3, [2, 0, 1], [[1, 2], [4], [3]], True)
    stock, ours = both(*args)
    assert_same(ours, stock)
    assert ours["input_token_logprobs"].shape == (7,)
    assert ours["next_token_logits"].shape == (3, VOCAB)


def test_fewer_rows_than_tokens_fails_loudly_in_forward():
    flatgather.sglang.install()
    processor, lm_head = make_processor(VOCAB, HIDDEN)
    input_ids, hidden, _, _ = make_tensors([4, 5, 6], 0, "none", False, 0)
    md = forward_metadata([4, 5, 6], [0, 5, 3], "NULL", input_ids, [0] * 3, [None] * 3)
    with pytest.raises(PlanError) as info:
        processor.forward(input_ids, hidden[:12], lm_head, md)
    assert info.value.kind == "too_few_rows"
