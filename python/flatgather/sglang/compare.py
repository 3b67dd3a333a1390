"""Whether a result is the release's: the first place where two results
differ, or None. The one comparison the probe, the install-time checks, the
tests and the bench all make: types, tensor dtypes, shapes, devices,
contiguity (or, with ``strides``, the strides themselves) and bytes (NaN
included), lists and dicts item by item, floats bit for bit (by ``repr``:
``-0.0`` is not ``0.0``, two NaN are the same value), other values by
equality.
"""

from __future__ import annotations

import torch

__all__ = ["describe", "first_difference"]


def describe(value) -> str:
    """A short description of ``value`` for a message: a tensor's values
    when it is small, else its shape; any other value's repr, cut short."""
    if isinstance(value, torch.Tensor):
        if value.numel() <= 8:
            return f"tensor({value.tolist()}, dtype={value.dtype})"
        return f"tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_SCALARS = (int, float, bool, str, type(None))


def first_difference(actual, expected, path: str = "result", strides: bool = False) -> str | None:
    """The first place where ``actual`` and ``expected`` differ in type,
    dtype, shape, device, contiguity (with ``strides``: strides) or bytes, as
    ``path: expected X, got Y``; None when they are identical."""
    if type(actual) is not type(expected):
        return (
            f"{path}: expected {type(expected).__name__} {describe(expected)}, "
            f"got {type(actual).__name__} {describe(actual)}"
        )
    if isinstance(expected, torch.Tensor):
        for attr in ("dtype", "shape", "device"):
            want, got = getattr(expected, attr), getattr(actual, attr)
            if got != want:
                return f"{path}.{attr}: expected {want}, got {got}"
        if strides and actual.stride() != expected.stride():
            return f"{path}: expected strides {expected.stride()}, got {actual.stride()}"
        if actual.is_contiguous() != expected.is_contiguous():
            return f"{path}: expected contiguous={expected.is_contiguous()}, got the other"
        a = actual.detach().contiguous().view(-1).view(torch.uint8)
        e = expected.detach().contiguous().view(-1).view(torch.uint8)
        if not torch.equal(a, e):
            return f"{path}: expected {describe(expected)}, got {describe(actual)}"
        return None
    if isinstance(expected, dict):
        if actual.keys() != expected.keys():
            # Sorted by repr: a dict's keys may mix types (a ``None`` text
            # among strings, in a top-k position's dict).
            want, got = sorted(expected, key=repr), sorted(actual, key=repr)
            return f"{path}: keys {want} expected, got {got}"
        for key in expected:
            where = f"{path}.{key}" if path else str(key)
            found = first_difference(actual[key], expected[key], where, strides)
            if found:
                return found
        return None
    if isinstance(expected, (list, tuple)):
        if (
            all(type(e) in _SCALARS for e in expected)
            and all(type(a) in _SCALARS for a in actual)
            and repr(actual) == repr(expected)
        ):
            # The common case, without a call per element: the repr of these
            # scalars tells every value apart (floats bit for bit).
            return None
        if len(actual) != len(expected):
            return f"{path}: expected length {len(expected)}, got {len(actual)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            found = first_difference(a, e, f"{path}[{i}]", strides)
            if found:
                return found
        return None
    if isinstance(expected, float):
        if repr(actual) == repr(expected):  # bit for bit, any NaN alike
            return None
        return f"{path}: expected {expected!r}, got {actual!r}"
    if actual != expected:
        return f"{path}: expected {describe(expected)}, got {describe(actual)}"
    return None
