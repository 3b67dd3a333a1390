"""Helpers to drive the real SGLang code of the release under test."""

from __future__ import annotations

import flatgather.sglang
import flatgather.testing
import pytest
from conftest import RELEASE, ROW
from flatgather.bench.batches import metadata
from flatgather.sglang.compare import first_difference
from flatgather.sglang.unpinned import unpinned_without_cuda

if RELEASE is None:
    pytest.skip("no sglang on sys.path", allow_module_level=True)
if ROW is None:
    raise pytest.UsageError(f"sglang {RELEASE} is not in flatgather's release table")

# What the release does, from its row of the table (a matrix test checks the
# row against the running code).
PACKED_AUX = ROW.packed_aux
PRUNES_AUX = ROW.prunes_aux  # False before SGLang PR #21589
TRAILING_TOKEN_TO_SEQ = ROW.trailing_token_to_seq
WRITES_CPU_INDICES = ROW.writes_cpu_indices
DRAFT_NO_LOGPROB = ROW.draft_no_logprob

from sglang.srt.layers import logits_processor as lp  # noqa: E402
from sglang.srt.model_executor import forward_batch_info  # noqa: E402

LogitsProcessor = lp.LogitsProcessor
LogitsMetadata = lp.LogitsMetadata
ForwardMode = forward_batch_info.ForwardMode
CaptureHiddenMode = forward_batch_info.CaptureHiddenMode

# The release's own functions, taken before any test can patch them.
STOCK_PRUNED_STATES = vars(LogitsProcessor)["_get_pruned_states"]
STOCK_HIDDEN_TO_STORE = vars(LogitsProcessor)["_get_hidden_states_to_store"]
STOCK_FORWARD = vars(LogitsProcessor)["forward"]


def _stock_forward(self, *args, **kwargs):
    with flatgather.testing.module_functions_as_shipped():
        return STOCK_FORWARD(self, *args, **kwargs)


class StockLogitsProcessor(LogitsProcessor):
    """The release's own ``forward`` and helpers, whatever ``install()`` has
    done to ``LogitsProcessor`` and to the module-level functions it calls:
    the oracle for whole forwards."""

    forward = _stock_forward
    _get_pruned_states = STOCK_PRUNED_STATES
    _get_hidden_states_to_store = STOCK_HIDDEN_TO_STORE


CAPTURE_MODES = {
    "NULL": CaptureHiddenMode.NULL,
    "LAST": CaptureHiddenMode.LAST,
    "FULL": CaptureHiddenMode.FULL,
}


def oracle_context():
    """Where the release's own code runs as the oracle: with pinning off on
    a host without CUDA (0.5.12 pins whatever the host; it changes no value)."""
    return unpinned_without_cuda()


def pruned_states(hidden, before_norm, aux, md):
    """Whatever ``LogitsProcessor._get_pruned_states`` is right now."""
    with oracle_context():
        return LogitsProcessor._get_pruned_states(None, hidden, before_norm, aux, md)


def stock_pruned_states(hidden, before_norm, aux, md):
    with oracle_context():
        return STOCK_PRUNED_STATES(None, hidden, before_norm, aux, md)


def hidden_to_store(hidden, before_norm, aux, result, md, fn=None):
    """What ``_get_hidden_states_to_store`` (the release's own, or ``fn``)
    stores from a ``_get_pruned_states`` result."""
    pruned, pruned_before, aux_pruned, sample, _, _ = result
    fn = STOCK_HIDDEN_TO_STORE if fn is None else fn
    return fn(None, hidden, before_norm, aux, pruned, pruned_before, aux_pruned, sample, md)


def fixed_aux_oracle(aux, md_factory):
    """What a release with PR #21589 returns for list aux layers, computed by
    the release's own code: each layer pruned as if it were hidden_states."""
    return [stock_pruned_states(layer, None, None, md_factory())[0] for layer in aux]


def expected_pruned_states(extend, start, h, b, aux, md):
    """The release's own result, with list aux layers pruned where the
    release drops them (flatgather backports that fix)."""
    result = stock_pruned_states(h, b, aux, md)
    if isinstance(aux, list) and not PRUNES_AUX:
        assert result[2] is None
        result = (*result[:2], fixed_aux_oracle(aux, lambda: metadata(extend, start)), *result[3:])
    return result


def outcome(fn, *args):
    try:
        return ("returned", fn(*args))
    except Exception as exc:  # compared by type: the same failure, or none
        return ("raised", type(exc))


def assert_same(actual, expected, path="result"):
    """Same type, and for tensors same dtype, shape, device, contiguity and
    bytes (NaN padding included): the comparison flatgather's own checks make."""
    found = first_difference(actual, expected, path)
    assert found is None, found
