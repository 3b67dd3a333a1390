"""aten ops dispatched per call: the stock logprob branch grows with the
batch (about 4 per request); the installed one does not (at most L + 4 for
L aux layers, before-norm states included), padded or not. A batch of one
request is one slice and one ``cat`` per tensor, as the release copies it,
and its two index sets are ranges made on the device: no index_select, no
host-to-device copy."""

from __future__ import annotations

import flatgather.sglang
import pytest
import torch
from _sglang import PACKED_AUX, PRUNES_AUX, pruned_states
from flatgather.bench.batches import make_states, metadata
from flatgather.bench.counts import AtenOps


def count(batch, layers, packed=False, before_norm=True, pad=0):
    extend = [16] * batch
    start = [i % 17 for i in range(batch)]  # start 0 .. 16 == extend: every kind
    kind = "packed" if packed else "list" if layers else "none"
    h, b, aux = make_states(extend, 0, torch.float32, 8, before_norm, kind, layers, pad)
    md = metadata(extend, start)
    with AtenOps(views=True) as counter:
        pruned_states(h, b, aux, md)
    return counter.names


@pytest.mark.parametrize("batch", [1, 16, 256, 1024])
@pytest.mark.parametrize("layers", [0, 3])
@pytest.mark.parametrize("pad", [0, 13])
def test_installed_op_count_does_not_grow_with_batch(batch, layers, pad):
    stock = count(batch, layers, pad=pad)
    flatgather.sglang.install()
    ours = count(batch, layers, pad=pad)
    if batch == 1:
        tensors = layers + 2  # hidden_states, before-norm states, each aux layer
        assert sorted(ours) == sorted(["arange"] * 2 + ["slice", "cat"] * tensors), ours
        return
    assert len(ours) <= layers + 4, ours
    assert ours.count("index_select") == layers + 2
    # The stock loop slices every tensor it prunes once per request (before
    # PR #21589 it drops the aux layers instead of pruning them).
    assert len(stock) >= batch * ((layers if PRUNES_AUX else 0) + 2)


@pytest.mark.skipif(not PACKED_AUX, reason="the release has no packed aux")
@pytest.mark.parametrize("batch", [2, 256])
def test_packed_aux_is_one_index_select(batch):
    flatgather.sglang.install()
    ours = count(batch, 3, packed=True)
    assert ours.count("index_select") == 3
    assert len(ours) <= 5
