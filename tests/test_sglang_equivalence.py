"""The installed ``_get_pruned_states`` against the release's own, on the
same inputs: same 6-tuple, same types, same bytes, same side effects, and
the same hidden states stored by the release's ``_get_hidden_states_to_store``."""

from __future__ import annotations

import flatgather.sglang
import pytest
import torch
from _sglang import (
    CAPTURE_MODES,
    PACKED_AUX,
    PRUNES_AUX,
    RELEASE,
    ForwardMode,
    assert_same,
    fixed_aux_oracle,
    hidden_to_store,
    metadata,
    pruned_states,
    stock_pruned_states,
)
from _strategies import batches
from hypothesis import given
from hypothesis import strategies as st

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
AUX_KINDS = ["none", "list", "empty-list"] + (["packed"] if PACKED_AUX else [])


def make_inputs(extend, seed, dtype, hidden, before_norm, aux_kind, layers):
    gen = torch.Generator().manual_seed(seed)
    rows = sum(extend)

    def tensor(width):
        return torch.randn(rows, width, generator=gen).to(dtype)

    h = tensor(hidden)
    b = tensor(hidden) if before_norm else None
    if aux_kind == "none":
        aux = None
    elif aux_kind == "empty-list":
        aux = []
    elif aux_kind == "list":
        aux = [tensor(hidden) for _ in range(layers)]
    else:
        aux = tensor(hidden * layers)
    return h, b, aux


def compare(extend, start, h, b, aux, capture):
    """Run stock and installed on equal inputs and compare everything."""
    flatgather.sglang.uninstall()
    md_stock = metadata(extend, start, capture)
    expected = stock_pruned_states(h, b, aux, md_stock)
    flatgather.sglang.install()
    md_ours = metadata(extend, start, capture)
    actual = pruned_states(h, b, aux, md_ours)

    if isinstance(aux, list) and not PRUNES_AUX:
        # 0.5.10 drops the aux layers here; the backport prunes them as later
        # releases do, computed by this release's own code layer by layer.
        assert expected[2] is None
        expected = (
            *expected[:2],
            fixed_aux_oracle(aux, lambda: metadata(extend, start)),
            *expected[3:],
        )
    assert_same(actual, expected)
    for name in ("sample_indices_cpu", "input_logprob_indices_cpu"):
        assert_same(getattr(md_ours, name, None), getattr(md_stock, name, None), name)
    stored = outcome(hidden_to_store, h, b, aux, actual, md_ours)
    stored_stock = outcome(hidden_to_store, h, b, aux, expected, md_stock)
    # An empty aux list fails in the release's own torch.cat under LAST
    # capture; it must fail the same way after pruning by flatgather.
    assert_same(stored, stored_stock, "hidden_states_to_store")
    return actual


def outcome(fn, *args):
    try:
        return ("returned", fn(*args))
    except Exception as exc:  # compared by type: the same failure, or none
        return ("raised", type(exc))


@given(
    batch=batches(),
    seed=st.integers(0, 2**31),
    dtype=st.sampled_from(DTYPES),
    hidden=st.sampled_from([1, 4, 8]),
    before_norm=st.booleans(),
    aux_kind=st.sampled_from(AUX_KINDS),
    layers=st.integers(1, 3),
    capture=st.sampled_from(list(CAPTURE_MODES)),
)
def test_installed_equals_stock(batch, seed, dtype, hidden, before_norm, aux_kind, layers, capture):
    extend, start = batch
    h, b, aux = make_inputs(extend, seed, dtype, hidden, before_norm, aux_kind, layers)
    compare(extend, start, h, b, aux, capture)


def test_seed_example_through_sglang():
    h, b, aux = make_inputs([4, 5, 6], 0, torch.float32, 4, True, "list", 3)
    pruned, before, aux_pruned, sample, input_logprob, token_to_seq = compare(
        [4, 5, 6], [0, 5, 3], h, b, aux, "LAST"
    )
    rows = [0, 1, 2, 3, 8, 12, 13, 14]
    assert torch.equal(pruned, h[rows]) and torch.equal(before, b[rows])
    assert all(torch.equal(a, layer[rows]) for a, layer in zip(aux_pruned, aux, strict=True))
    assert sample.tolist() == [3, 4, 7]
    assert input_logprob.tolist() == [0, 1, 2, 3, 5, 6, 7]
    trailing = [2] if RELEASE in ("0.5.10", "0.5.15") else []
    assert token_to_seq == [0, 0, 0, 0, 1, 2, 2, 2, *trailing]


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
def test_named_edge_cases(extend, start, aux_kind, capture):
    h, b, aux = make_inputs(extend, 1, torch.bfloat16, 8, True, aux_kind, 3)
    compare(extend, start, h, b, aux, capture)


@pytest.mark.parametrize(
    "mode",
    [ForwardMode.DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND],
)
def test_other_branches_run_the_release_code(mode):
    """Decode, idle, verify, and prefill without logprobs: the installed
    function hands over to the release's own (same result, same objects)."""
    extend, start = [4, 5, 6], [0, 5, 3]
    h, b, aux = make_inputs(extend, 2, torch.float32, 4, True, "list", 2)

    def run():
        md = metadata(extend, start, "LAST", mode=mode)
        md.extend_return_logprob = False
        return pruned_states(h, b, aux, md)

    expected = run()
    flatgather.sglang.install()
    actual = run()
    assert_same(actual, expected)


def test_installed_function_is_marked_and_wraps_the_original():
    from _sglang import STOCK_PRUNED_STATES, LogitsProcessor

    flatgather.sglang.install()
    patched = vars(LogitsProcessor)["_get_pruned_states"]
    assert patched is not STOCK_PRUNED_STATES
    assert patched.__wrapped__ is STOCK_PRUNED_STATES
    assert patched.__flatgather__.release == RELEASE
