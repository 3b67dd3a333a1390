"""The one comparison of results (flatgather.sglang.compare): what it tells
apart, in lists as in single values."""

from __future__ import annotations

import pytest
import torch
from flatgather.sglang.compare import first_difference


@pytest.mark.parametrize(
    "wrap", [lambda v: v, lambda v: [v], lambda v: [[1, v]], lambda v: {"k": v}]
)
def test_floats_are_compared_bit_for_bit(wrap):
    assert first_difference(wrap(0.0), wrap(-0.0)) is not None
    assert first_difference(wrap(float("nan")), wrap(float("nan"))) is None
    assert first_difference(wrap(1.5), wrap(1.5)) is None
    assert first_difference(wrap(True), wrap(1)) is not None


def test_strides_only_when_asked():
    a, b = torch.zeros(3, 2), torch.zeros(2, 3).t()
    assert first_difference(a, b) is not None  # contiguity differs
    c = torch.zeros(1, 4)
    d = torch.zeros(4, 1).t()  # contiguous too, other strides
    assert first_difference(c, d) is None
    assert "strides" in first_difference(c, d, strides=True)


def test_tensor_bytes_dtype_and_shape():
    t = torch.tensor([0.0, float("nan")])
    assert first_difference(t, t.clone()) is None
    assert first_difference(torch.tensor([-0.0]), torch.tensor([0.0])) is not None
    assert "dtype" in first_difference(t.double(), t)
    assert "shape" in first_difference(t[:1], t)


def test_keys_of_mixed_types_are_told_apart():
    """A top-k position's dict may hold a ``None`` text among strings: keys
    that differ are reported, not sorted into a TypeError."""
    found = first_difference({None: -1.0, "a": -2.0}, {"a": -2.0, "b": -1.0})
    assert found == "result: keys ['a', 'b'] expected, got ['a', None]"
    assert first_difference({None: -1.0, "a": -2.0}, {"a": -2.0, None: -1.0}) is None
