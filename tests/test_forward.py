"""A whole ``LogitsProcessor.forward`` on CPU, input logprobs requested:
identical outputs with and without ``install()``."""

from __future__ import annotations

import flatgather.sglang
import torch
from _forward import forward_metadata, make_processor, output_fields
from _sglang import CAPTURE_MODES, PACKED_AUX, PRUNES_AUX, assert_same
from _strategies import batches
from hypothesis import given
from hypothesis import strategies as st

VOCAB, HIDDEN = 48, 8
AUX_KINDS = ["none", "list"] + (["packed"] if PACKED_AUX else [])


def run_forward(extend, start, capture, aux_kind, seed, top, token_ids, before_norm):
    gen = torch.Generator().manual_seed(seed)
    rows = sum(extend)
    processor, lm_head = make_processor(VOCAB, HIDDEN, seed)
    input_ids = torch.randint(0, VOCAB, (rows,), generator=gen)
    hidden = torch.randn(rows, HIDDEN, generator=gen)
    before = torch.randn(rows, HIDDEN, generator=gen) if before_norm else None
    layers = [torch.randn(rows, HIDDEN, generator=gen) for _ in range(3)]
    aux = {"none": None, "list": layers, "packed": torch.cat(layers, dim=-1)}[aux_kind]
    md = forward_metadata(extend, start, capture, input_ids, top, token_ids)
    return processor.forward(
        input_ids, hidden, lm_head, md, aux_hidden_states=aux, hidden_states_before_norm=before
    )


def both(*args):
    flatgather.sglang.uninstall()
    try:
        stock = output_fields(run_forward(*args))
    except TypeError:
        stock = None  # only 0.5.10's LAST + aux crash, checked below
    flatgather.sglang.install()
    ours = output_fields(run_forward(*args))
    flatgather.sglang.uninstall()
    return stock, ours


@st.composite
def logprob_requests(draw):
    extend, start = draw(batches(max_batch=48, max_extend=24))
    top = draw(st.lists(st.integers(0, 3), min_size=len(extend), max_size=len(extend)))
    # Token-id logprobs for every request or none: 0.5.10 and 0.5.15 index
    # the ids of every scored request once any request asks.
    ids = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3)
    if draw(st.booleans()):
        token_ids = draw(st.lists(ids, min_size=len(extend), max_size=len(extend)))
    else:
        token_ids = [None] * len(extend)
    return extend, start, top, token_ids


@given(
    request=logprob_requests(),
    capture=st.sampled_from(list(CAPTURE_MODES)),
    aux_kind=st.sampled_from(AUX_KINDS),
    seed=st.integers(0, 2**16),
    before_norm=st.booleans(),
)
def test_forward_outputs_identical(request, capture, aux_kind, seed, before_norm):
    extend, start, top, token_ids = request
    stock, ours = both(extend, start, capture, aux_kind, seed, top, token_ids, before_norm)
    if stock is None:
        # 0.5.10 without the backport: LAST capture with aux layers crashes.
        assert not PRUNES_AUX and capture == "LAST" and aux_kind == "list"
        assert ours["hidden_states"].shape == (len(extend), 3 * HIDDEN)
        return
    assert_same(ours, stock)


def test_seed_example_forward_with_everything_requested():
    args = ([4, 5, 6], [0, 5, 3], "FULL", AUX_KINDS[-1], 3, [2, 0, 1], [[1, 2], [4], [3]], True)
    stock, ours = both(*args)
    assert_same(ours, stock)
    assert ours["input_token_logprobs"].shape == (7,)
    assert ours["next_token_logits"].shape == (3, VOCAB)
