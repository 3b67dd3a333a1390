"""Hypothesis strategies for SGLang prefill batches."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def requests(draw, max_extend: int = 48):
    """(extend, start): start 0, start == extend (a chunked-prefill chunk)
    and anything between, each often."""
    extend = draw(st.integers(1, max_extend) | st.integers(1, 4))
    start = draw(st.sampled_from(["zero", "end", "any"]))
    if start == "zero":
        return extend, 0
    if start == "end":
        return extend, extend
    return extend, draw(st.integers(0, extend))


@st.composite
def batches(draw, max_batch: int = 1024, max_extend: int = 48):
    """Batch sizes from 1 to ``max_batch``, small ones most often."""
    size = draw(st.integers(1, 8) | st.integers(1, 64) | st.integers(1, max_batch))
    pairs = draw(st.lists(requests(max_extend), min_size=size, max_size=size))
    return [e for e, _ in pairs], [s for _, s in pairs]
