"""SGLang 0.5.10 predates PR #21589; install() backports both of its fixes.

The first (aux layers pruned in the logprob branch) is tested here; the
second (the draft prefill's forward without logprobs) with the rest of the
draft worker's prefill, in test_draft_prefill.py, on every release that
lacks it."""

from __future__ import annotations

import flatgather.sglang
import pytest
import torch
from _sglang import (
    RELEASE,
    assert_same,
    fixed_aux_oracle,
    hidden_to_store,
    pruned_states,
    stock_pruned_states,
)
from flatgather.bench.batches import make_states, metadata

pytestmark = pytest.mark.skipif(RELEASE != "0.5.10", reason="0.5.10 backports")

EXTEND, START = [4, 5, 6], [0, 5, 3]


def inputs():
    h, _, aux = make_states(EXTEND, 7, torch.float32, 8, False, "list", 3)
    return h, aux


def test_stock_crashes_on_last_capture_with_aux_layers():
    h, aux = inputs()
    md = metadata(EXTEND, START, "LAST")
    result = stock_pruned_states(h, None, aux, md)
    assert result[2] is None  # the aux layers were dropped ...
    with pytest.raises(TypeError):  # ... and torch.cat(None) fails
        hidden_to_store(h, None, aux, result, md)


def test_installed_prunes_aux_as_fixed_releases_do():
    h, aux = inputs()
    flatgather.sglang.install()
    md = metadata(EXTEND, START, "LAST")
    result = pruned_states(h, None, aux, md)
    expected_aux = fixed_aux_oracle(aux, lambda: metadata(EXTEND, START))
    assert_same(result[2], expected_aux)
    stored = hidden_to_store(h, None, aux, result, md)
    # LAST capture: the sampled row of each request, aux layers side by side.
    rows = [3, 8, 14]
    assert_same(stored, torch.cat([layer[rows] for layer in aux], dim=-1))


def test_forward_crash_reproduced_and_gone_with_install():
    from flatgather.bench.batches import output_fields
    from test_forward import HIDDEN, run_forward

    args = ([4, 5, 6], [0, 5, 3], "LAST", "list", 5, [0, 0, 0], [None] * 3, False)
    with pytest.raises(TypeError):
        run_forward(*args)
    flatgather.sglang.install()
    out = output_fields(run_forward(*args))
    assert out["hidden_states"].shape == (3, 3 * HIDDEN)
    assert out["input_token_logprobs"].shape == (7,)
