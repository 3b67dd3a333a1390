"""Token-id input logprobs in one gather: bit-exact with the release's own
functions, call by call and through the whole ``LogitsProcessor.forward``
(chunked or not, raw logits with a normalizer or log-softmax, float32 and
bfloat16, top-k and token ids mixed), with a number of torch ops and
``.tolist()`` calls that does not grow with the batch."""

from __future__ import annotations

import functools
import sys
import types

import flatgather.sglang
import pytest
import torch
from _forward import make_processor
from _sglang import ROW, assert_same, lp, oracle_context
from flatgather.bench.batches import forward_metadata, make_forward_inputs, output_fields
from flatgather.bench.counts import AtenOps, HostSyncs
from flatgather.sglang.patches import input_logprobs
from hypothesis import given
from hypothesis import strategies as st

CHUNK_MODULE = sys.modules.get("sglang.srt.layers.logprob_processor", lp)
# The release's own functions, before any test patches them.
STOCK_CHUNK = vars(CHUNK_MODULE)[input_logprobs.CHUNK]
STOCK_PREFILL = vars(lp).get(input_logprobs.PREFILL)
CHUNK_KEYWORDS = set(STOCK_CHUNK.__code__.co_varnames[: STOCK_CHUNK.__code__.co_argcount])
VOCAB, HIDDEN = 48, 8


def installed_chunk():
    report = flatgather.sglang.install()
    assert f"{CHUNK_MODULE.__name__}.{input_logprobs.CHUNK}" in report.patched, report.notes
    return vars(CHUNK_MODULE)[input_logprobs.CHUNK]


@pytest.mark.matrix
def test_install_replaces_each_function_with_the_walk_of_the_release():
    chunk = installed_chunk()
    assert chunk.__flatgather__.skip_empty is ROW.token_ids_skip_empty
    if STOCK_PREFILL is not None:
        assert vars(lp)[input_logprobs.PREFILL] is not STOCK_PREFILL
    flatgather.sglang.uninstall()
    assert vars(CHUNK_MODULE)[input_logprobs.CHUNK] is STOCK_CHUNK


@pytest.mark.matrix
def test_a_function_that_no_walk_reproduces_is_left_stock(monkeypatch):
    @functools.wraps(STOCK_CHUNK)
    def changed(*args, **kwargs):
        end = STOCK_CHUNK(*args, **kwargs)
        args[3].append("one entry too many")
        return end

    monkeypatch.setattr(CHUNK_MODULE, input_logprobs.CHUNK, changed)
    report = flatgather.sglang.install()
    assert vars(CHUNK_MODULE)[input_logprobs.CHUNK] is changed
    note = next(n for n in report.notes if input_logprobs.CHUNK in n)
    assert "left stock" in note and "length" in note


def ids_lists():
    ids = st.lists(st.integers(-VOCAB, VOCAB - 1), max_size=4)
    return st.one_of(st.none(), ids, ids)


@st.composite
def chunk_calls(draw):
    """One call as a chunk of the release's caller makes it: the chunk's
    rows may end inside a request, and the first may continue one."""
    n = draw(st.integers(1, 12))
    lens = draw(st.lists(st.sampled_from([0, 1, 2, 3, 5, 8]), min_size=n, max_size=n))
    ids = draw(st.lists(ids_lists(), min_size=n, max_size=n))
    total = sum(lens)
    rows = draw(st.sampled_from([total, 0, max(total - 1, 0), total // 2, total + 2]))
    split = draw(st.sampled_from([0, 0, 1, 2])) if lens[0] > 2 else 0
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    normalized = "log_normalizer" in CHUNK_KEYWORDS and draw(st.booleans())
    pinned = "copy_to_pinned_cpu" in CHUNK_KEYWORDS and draw(st.booleans())
    return lens, ids, rows, split, dtype, normalized, pinned, draw(st.integers(0, 2**16))


def call(fn, lens, ids, rows, split, dtype, normalized, pinned, seed):
    gen = torch.Generator().manual_seed(seed)
    logprobs = (torch.randn(rows, VOCAB, generator=gen) * 3).to(dtype)
    kwargs = {}
    if normalized:
        x = logprobs.float()
        row_max = x.amax(-1) if rows else x.new_zeros(0)
        kwargs["log_normalizer"] = (row_max, torch.logsumexp(x - row_max[:, None], -1))
    if pinned:
        kwargs["copy_to_pinned_cpu"] = True
    val, idx = ([[[0.5]]], [[[1]]]) if split else ([], [])
    ids = [None if i is None else list(i) for i in ids]
    try:
        returned = fn(logprobs, ids, list(lens), val, idx, split, **kwargs)
    except Exception as exc:
        return {"raised": type(exc)}
    # The release appends each request's own id list: compare which one.
    owner = {id(i): n for n, i in enumerate(ids) if i is not None}
    named = [[owner.get(id(x), x) for x in entry] for entry in idx]
    return {"returned": returned, "val": val, "idx": named}


@pytest.mark.matrix
@given(chunk_calls())
def test_each_call_is_the_release_s_own(args):
    expected = call(STOCK_CHUNK, *args)
    assert_same(call(installed_chunk(), *args), expected)


@pytest.mark.skipif(STOCK_PREFILL is None, reason="the release has no whole-batch function")
@given(chunk_calls())
def test_each_whole_batch_call_is_the_release_s_own(args):
    lens, ids = args[0], args[1]
    logprobs = torch.randn(sum(lens), VOCAB).to(args[4])
    md = types.SimpleNamespace(token_ids_logprobs=ids, extend_logprob_pruned_lens_cpu=lens)

    def run(fn):
        try:
            return fn(logprobs, md)
        except Exception as exc:
            return type(exc)

    expected = run(STOCK_PREFILL)
    flatgather.sglang.install()
    assert_same(run(vars(lp)[input_logprobs.PREFILL]), expected)


def configure(processor, chunk_size, fast):
    """Chunked input logprobs of ``chunk_size`` rows (None: unchunked) and
    the raw-logits normalizer path (``fast``) where the release has it."""
    owner = getattr(processor, "input_logprob_processor", processor)
    owner.enable_logprobs_chunk = chunk_size is not None
    owner.logprobs_chunk_size = chunk_size or 1 << 20
    if hasattr(owner, "enable_fast_input_logprobs"):
        owner.enable_fast_input_logprobs = fast


@st.composite
def forward_batches(draw):
    n = draw(st.integers(1, 24))
    extend = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    start = [draw(st.sampled_from([0, e, e - 1, e // 2])) for e in extend]
    top = draw(st.lists(st.sampled_from([0, 0, 1, 5, 20]), min_size=n, max_size=n))
    ids = st.lists(st.integers(0, VOCAB - 1), max_size=3)
    # The unchunked path of releases up to 0.5.15 fails on a request without
    # ids once any asks: half the batches have none.
    some = st.one_of(st.none(), ids, ids) if draw(st.booleans()) else ids
    token_ids = draw(st.lists(some, min_size=n, max_size=n))
    return extend, start, top, token_ids


def prepared_forward(batch, chunk_size, fast, dtype, stock):
    """``forward`` on ``batch``, everything but the call built beforehand."""
    extend, start, top, token_ids = batch
    processor, lm_head = make_processor(VOCAB, HIDDEN, 3, stock=stock)
    configure(processor, chunk_size, fast)
    lm_head.weight = lm_head.weight.to(dtype)
    input_ids, hidden, _, _ = make_forward_inputs(
        extend, sum(extend), VOCAB, dtype, HIDDEN, False, "none", 0
    )
    md = forward_metadata(extend, start, "NULL", input_ids, top, token_ids)

    def run():
        with oracle_context():
            try:
                return output_fields(processor.forward(input_ids, hidden, lm_head, md))
            except Exception as exc:  # the releases fail on some id lists: the same way
                return type(exc)

    return run


def run_forward(batch, chunk_size, fast, dtype, stock):
    return prepared_forward(batch, chunk_size, fast, dtype, stock)()


@pytest.mark.matrix
@given(
    batch=forward_batches(),
    chunk_size=st.sampled_from([None, 1, 3, 7]),
    fast=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_whole_forward_is_the_release_s_own(batch, chunk_size, fast, dtype):
    expected = run_forward(batch, chunk_size, fast, dtype, stock=True)
    flatgather.sglang.install()
    assert_same(run_forward(batch, chunk_size, fast, dtype, stock=False), expected)


def counts(batch_size):
    """Non-view aten ops dispatched, and ``Tensor.tolist`` calls."""
    extend = [6] * batch_size
    start = [i % 7 for i in range(batch_size)]
    batch = (extend, start, [5] * batch_size, [[1, 2, 3]] * batch_size)
    forward = prepared_forward(batch, None, False, torch.float32, stock=False)
    with HostSyncs() as syncs, AtenOps() as ops:
        out = forward()
    assert isinstance(out, dict), out
    return len(ops.names), syncs.calls["tolist"]


@pytest.mark.matrix
def test_ops_and_tolist_calls_do_not_grow_with_the_batch():
    flatgather.sglang.install()
    small, large = counts(16), counts(256)
    assert small == large
    flatgather.sglang.uninstall()
    stock_small, stock_large = counts(16), counts(256)
    # The release makes at least one .tolist() per request with token ids.
    assert stock_large[1] - stock_small[1] >= 240


@pytest.mark.matrix
def test_the_check_sees_the_gather_answer():
    """The cases the install-time check runs must reach the gather, or the
    check proves nothing."""
    flat = input_logprobs.PATCH.prepare(CHUNK_MODULE)
    assert flat.swaps and not flat.notes
