"""``flatgather._core.TokenIdsPlan`` at its boundary: whatever it is handed,
a plan or a ``PlanError`` with a known kind, never a crash; the caller's own
exceptions propagate as themselves."""

from __future__ import annotations

import numpy as np
import pytest
from flatgather import PlanError
from flatgather._core import TokenIdsPlan
from flatgather._errors import KINDS
from hypothesis import given
from hypothesis import strategies as st

BIG = st.integers(-(2**64), 2**64)
I64 = st.integers(-(2**63), 2**63 - 1)
SMALL = st.integers(-16, 16)
# Mostly well-formed values, so that plans get built and filled too.
ITEMS = st.one_of(
    SMALL, SMALL, SMALL, BIG, st.booleans(), st.none(), st.floats(), st.text(max_size=3)
)


@given(
    lens=st.one_of(st.lists(ITEMS, max_size=6), ITEMS),
    ids=st.one_of(st.lists(st.one_of(st.none(), st.lists(ITEMS, max_size=4), ITEMS), max_size=6)),
    vocab=st.one_of(st.integers(1, 17), I64),
    rows=st.one_of(st.integers(0, 40), I64),
    split=st.one_of(st.integers(0, 3), I64),
    skip_empty=st.booleans(),
    whole=st.booleans(),
)
def test_any_input_is_a_plan_or_a_plan_error(lens, ids, vocab, rows, split, skip_empty, whole):
    try:
        plan = TokenIdsPlan(lens, ids, vocab, rows, split, skip_empty, whole)
    except PlanError as exc:
        assert exc.kind in KINDS
        assert exc.request is None or 0 <= exc.request < 6
        return
    if plan.num_values <= 1 << 16:
        check_fill(plan, rows, vocab)


def check_fill(plan, rows, vocab):
    out = np.full(plan.buffer_len(True) + 1, -1, dtype=np.int64)
    plan.fill(out, rows=True)
    assert out[-1] == -1
    flat, row = out[: plan.num_values], out[plan.num_values : -1]
    assert ((flat >= 0) & (flat < rows * vocab)).all()
    assert (flat // vocab == row).all()


@given(
    lens=st.lists(st.integers(0, 6), min_size=1, max_size=8),
    data=st.data(),
    vocab=st.integers(1, 17),
    split=st.integers(0, 3),
)
def test_every_flat_index_is_its_row_and_id(lens, data, vocab, split):
    ids = [
        data.draw(st.one_of(st.none(), st.lists(st.integers(-vocab, vocab - 1), max_size=4)))
        for _ in lens
    ]
    rows = data.draw(st.integers(0, sum(lens) + 2))
    plan = TokenIdsPlan(lens, ids, vocab, rows, split)
    check_fill(plan, rows, vocab)
    out = np.empty(plan.buffer_len(), dtype=np.int64)
    plan.fill(out)
    check_owned(plan, out, lens, ids, vocab, split)


def check_owned(plan, out, lens, ids, vocab, split):
    """Each value is one of the ids its request asked for, at a row its
    request owns: in this chunk, request r owns ``lens[r]`` consecutive rows
    after those of the requests before it (the first request ``split``
    fewer: the previous chunk served them), ``width`` values a row."""
    lens = [max(lens[0] - split, 0), *lens[1:]]
    offset = [sum(lens[:r]) for r in range(len(lens))]
    taken = [0] * len(lens)
    for entry in plan.entries():
        if entry is None:
            continue
        request, count, width, value, _ = entry
        first = offset[request] + taken[request]
        for k in range(count * width):
            asked = ids[request][k % width]
            row, col = divmod(int(out[value + k]), vocab)
            assert col == asked % vocab
            assert row == first + k // width, (request, k, row, first)
            assert row < offset[request] + lens[request]
        taken[request] += count


def test_a_token_id_s_own_exception_propagates():
    class Interrupting:
        def __index__(self):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        TokenIdsPlan([1, 1], [[1], [Interrupting()]], 8, 2)


@pytest.mark.parametrize(
    ("ids", "kind", "which"),
    [
        ([[1], [8]], "token_id_out_of_range", 1),
        ([[1], [-9]], "token_id_out_of_range", 1),
        ([[1], (2,)], "bad_container", 1),
        ([[True], [1]], "not_an_integer", 0),
    ],
)
def test_refusals_name_the_request(ids, kind, which):
    with pytest.raises(PlanError) as info:
        TokenIdsPlan([1, 1], ids, 8, 2)
    assert (info.value.kind, info.value.request) == (kind, which)
