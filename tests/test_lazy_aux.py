"""Lazy aux pruning: inside ``LogitsProcessor.forward`` only the aux rows that
are stored get gathered (none under FULL capture, whose store takes the
unpruned layers); every other caller sees the full result. The outputs are
compared with the release's own forward."""

from __future__ import annotations

from typing import ClassVar

import flatgather.sglang
import pytest
import torch
from _forward import make_processor, pruning_gate
from _sglang import (
    PACKED_AUX,
    PRUNES_AUX,
    LogitsProcessor,
    assert_same,
    expected_pruned_states,
    oracle_context,
    pruned_states,
)
from flatgather.bench.batches import (
    forward_metadata,
    make_forward_inputs,
    make_states,
    metadata,
    output_fields,
)
from test_forward import HIDDEN, VOCAB, make_tensors, run_forward
from torch.utils._python_dispatch import TorchDispatchMode

AUX_KINDS = ["list"] + (["packed"] if PACKED_AUX else [])
EXTEND, START = [6] * 32, [0, 3, 6, 5] * 8  # 32 requests of every kind, 192 tokens


class RowsGathered(TorchDispatchMode):
    """Rows selected by index_select from tensors as wide as the aux layers."""

    def __init__(self, widths):
        super().__init__()
        self.widths, self.rows = widths, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.index_select:
            source, index = args[0], args[2]
            if source.dim() == 2 and source.shape[1] in self.widths and source.shape[0] > 100:
                self.rows += index.numel()
        return func(*args, **(kwargs or {}))


def args_of(capture, aux_kind, pad=0, before_norm=False):
    return (EXTEND, START, capture, aux_kind, 1, [0] * 32, [None] * 32, before_norm, pad)


def aux_rows_gathered(capture, aux_kind, lazy, pad=0, before_norm=False):
    report = flatgather.sglang.install(lazy_aux=lazy)
    assert report.lazy_aux is lazy
    widths = {HIDDEN * 3} if aux_kind == "packed" else {HIDDEN}
    with RowsGathered(widths) as counter:
        out = output_fields(run_forward(*args_of(capture, aux_kind, pad, before_norm)))
    flatgather.sglang.uninstall()
    return counter.rows, out


def stock_forward(capture, aux_kind, pad=0, before_norm=False):
    return output_fields(run_forward(*args_of(capture, aux_kind, pad, before_norm), stock=True))


@pytest.mark.matrix
@pytest.mark.parametrize("aux_kind", AUX_KINDS)
@pytest.mark.parametrize(("capture", "rows_per_layer"), [("LAST", 32), ("NULL", 0), ("FULL", 0)])
@pytest.mark.parametrize(("pad", "before_norm"), [(0, False), (9, True)])
def test_forward_gathers_only_the_stored_aux_rows(
    aux_kind, capture, rows_per_layer, pad, before_norm
):
    if capture == "LAST" and aux_kind == "list" and not PRUNES_AUX:
        pytest.skip("LAST capture with list aux layers crashes the release (PR #21589)")
    expected = stock_forward(capture, aux_kind, pad, before_norm)
    eager, eager_out = aux_rows_gathered(capture, aux_kind, False, pad, before_norm)
    lazy, lazy_out = aux_rows_gathered(capture, aux_kind, True, pad, before_norm)
    layers = 1 if aux_kind == "packed" else 3
    kept = flatgather.prune_plan(EXTEND, START).num_pruned
    # hidden_states (and the before-norm states) are as wide as one aux
    # layer: their kept rows count too.
    hidden_rows = kept * (1 + before_norm) if aux_kind == "list" else 0
    assert eager == hidden_rows + layers * kept
    assert lazy == hidden_rows + layers * rows_per_layer
    assert_same(eager_out, expected)
    assert_same(lazy_out, expected)


def _storage(tensor):
    return tensor.untyped_storage().data_ptr()


@pytest.mark.matrix
@pytest.mark.parametrize("capture", ["LAST", "NULL", "FULL"])
@pytest.mark.parametrize(
    ("aux_kind", "layers"),
    [("none", 0), ("list", 1), ("list", 3)] + ([("packed", 3)] if PACKED_AUX else []),
)
@pytest.mark.parametrize("before_norm", [False, True])
def test_a_one_request_forward_is_the_release_s_own(capture, aux_kind, layers, before_norm):
    """One request, scored from 0, from 4 and from its end (start == extend),
    one installation for the three: its run of rows copied, its sampled aux
    row sliced lazily. Every output is the release's on the very same input
    tensors, and what is stored is a tensor of its own wherever the
    release's is (a single list layer or a packed tensor is stored as
    handed: a slice of it would alias the model's aux buffer)."""
    if capture == "LAST" and aux_kind == "list" and not PRUNES_AUX:
        pytest.skip("LAST capture with list aux layers crashes the release (PR #21589)")
    flatgather.sglang.install()
    for start in (0, 4, 7):
        _one_request_forward(capture, aux_kind, layers, start, before_norm)


def _one_request_forward(capture, aux_kind, layers, start, before_norm):
    extend = [7]
    input_ids, hidden, before, aux = make_forward_inputs(
        extend, 5, VOCAB, torch.float32, HIDDEN, before_norm, aux_kind, layers, pad=3
    )
    inputs = [hidden, *([before] if before is not None else [])]
    inputs += [aux] if isinstance(aux, torch.Tensor) else list(aux or [])

    def run(stock):
        processor, head = make_processor(VOCAB, HIDDEN, stock=stock)
        md = forward_metadata(extend, [start], capture, input_ids, [2], [[1, 3]])
        with oracle_context():
            out = processor.forward(
                input_ids, hidden, head, md, aux_hidden_states=aux, hidden_states_before_norm=before
            )
        return out, output_fields(out)

    stock, expected = run(stock=True)
    ours, got = run(stock=False)
    assert_same(got, expected, f"scored from {start}")
    if stock.hidden_states is not None:
        aliased = {_storage(stock.hidden_states)} & {_storage(t) for t in inputs}
        if not aliased:
            assert _storage(ours.hidden_states) not in {_storage(t) for t in inputs}, start


@pytest.mark.matrix
def test_install_reports_full_capture_verified():
    report = flatgather.sglang.install()
    assert report.lazy_full, report.notes


@pytest.mark.parametrize("aux_kind", AUX_KINDS)
def test_callers_outside_forward_get_the_full_aux_result(aux_kind):
    h, _, aux = make_states(EXTEND, 0, torch.float32, HIDDEN, False, aux_kind, 3)
    expected = expected_pruned_states(EXTEND, START, h, None, aux, metadata(EXTEND, START, "LAST"))
    flatgather.sglang.install(lazy_aux=True)
    actual = pruned_states(h, None, aux, metadata(EXTEND, START, "LAST"))
    assert_same(actual, expected)


class OwnStore(LogitsProcessor):
    """A model's processor with its own ``_get_hidden_states_to_store``,
    which keeps what it is handed and stores the sampled aux rows."""

    handed: ClassVar[list] = []

    def _get_hidden_states_to_store(
        self, hidden, before_norm, aux, pruned, pruned_before_norm, aux_pruned, sample, md
    ):
        self.handed.append(aux_pruned)
        packed = aux_pruned if isinstance(aux_pruned, torch.Tensor) else torch.cat(aux_pruned, -1)
        return packed[sample]


@pytest.mark.matrix
@pytest.mark.parametrize("aux_kind", AUX_KINDS)
@pytest.mark.parametrize("capture", ["LAST", "FULL", "NULL"])
def test_a_subclass_with_its_own_store_is_handed_the_pruned_aux_layers(aux_kind, capture):
    """Lazy aux pruning is for the release's store behind flatgather's
    wrapper: a subclass that overrides it gets the pruned layers as the
    release prunes them (with PR #21589 where the release lacks it)."""
    input_ids, hidden, _, aux = make_tensors(EXTEND, 2, aux_kind, False, 0)
    expected = expected_pruned_states(EXTEND, START, hidden, None, aux, metadata(EXTEND, START))
    flatgather.sglang.install()
    processor, lm_head = make_processor(VOCAB, HIDDEN, cls=OwnStore)
    md = forward_metadata(EXTEND, START, capture, input_ids, [0] * 32, [None] * 32)
    OwnStore.handed.clear()
    with oracle_context():
        out = processor.forward(input_ids, hidden, lm_head, md, aux_hidden_states=aux)
    assert len(OwnStore.handed) == 1
    assert_same(OwnStore.handed[0], expected[2])
    packed = expected[2] if aux_kind == "packed" else torch.cat(expected[2], -1)
    assert_same(out.hidden_states, packed[expected[3]])


@pytest.mark.matrix
@pytest.mark.parametrize("sglang_padding", [False, True], ids=["metadata", "forward-batch"])
def test_only_a_forward_that_can_be_lazy_takes_the_gate(monkeypatch, sglang_padding):
    """One request without aux layers has nothing lazy: its forward skips
    the uninstall gate and the lazy scope. One request with aux layers (its
    sampled row is gathered lazily) and two requests go through the gate.
    Each is the release's answer."""
    flatgather.sglang.install()
    gate = pruning_gate()
    entered = []
    monkeypatch.setattr(gate, "enter", lambda: entered.append(1) or False)
    cases = {
        "one request, no aux": ([5], [1], "none", False),
        "one request, list aux": ([5], [1], "list", True),
        "two requests, no aux": ([3, 4], [0, 2], "none", True),
    }
    for name, (extend, start, aux_kind, gated) in cases.items():
        entered.clear()
        args = (extend, start, "NULL", aux_kind, 1, [0] * len(extend), [None] * len(extend), False)
        expected = output_fields(run_forward(*args, sglang_padding=sglang_padding, stock=True))
        got = output_fields(run_forward(*args, sglang_padding=sglang_padding))
        assert_same(got, expected)
        assert entered == ([1] if gated else []), name
