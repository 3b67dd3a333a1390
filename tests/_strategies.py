"""Hypothesis strategies for SGLang prefill batches."""

from __future__ import annotations

import random

from hypothesis import strategies as st

# Requests past this many in a batch come from a seeded generator rather than
# one Hypothesis draw each: drawing 1024 composite values costs ~100 ms an
# example, the generator a few. The first ones still shrink one by one.
DRAWN = 8


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


def _random_request(rng: random.Random, max_extend: int) -> tuple[int, int]:
    extend = rng.randint(1, max_extend) if rng.random() < 0.5 else rng.randint(1, 4)
    kind = rng.randrange(3)
    start = 0 if kind == 0 else extend if kind == 1 else rng.randint(0, extend)
    return extend, start


@st.composite
def batches(draw, max_batch: int = 1024, max_extend: int = 48):
    """Batch sizes from 1 to ``max_batch``, small ones most often."""
    size = draw(st.integers(1, 8) | st.integers(1, 64) | st.integers(1, max_batch))
    head = min(size, DRAWN)
    pairs = draw(st.lists(requests(max_extend), min_size=head, max_size=head))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    pairs += [_random_request(rng, max_extend) for _ in range(size - head)]
    return [e for e, _ in pairs], [s for _, s in pairs]
