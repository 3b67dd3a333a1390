"""The seventh patch's check: its replacement beside the module's own
function on small cases, through the one side-by-side check."""

from __future__ import annotations

from flatgather.sglang.check import Answered, side_by_side
from flatgather.sglang.compare import first_difference

CASES = (
    # (values, lengths, whether the flat path answers)
    ([1, 2, 3, 4, 5, 6], [2, 0, 4], True),
    ([7], [1], True),
    ([], [], True),
    ([1, 2, 3], [1, 1], True),  # values past the requests
    ([1.5, 2.5], [2], False),  # floats: the module's own sum
    ([1, 2], [3], False),  # past the values: the module's own answer
    ([1, 2], [-1, 3], False),
)


def verify(original, counted, answered: Answered) -> str | None:
    """None when ``counted`` answers as ``original`` on every case, flat
    exactly where the case says; else the first difference."""
    return side_by_side(
        original,
        counted,
        CASES,
        run=lambda fn, case: _run(fn, case[0], case[1]),
        answered=answered,
        flat=lambda case: case[2],
        where=lambda case: f"values {case[0]}, lengths {case[1]}",
        compare=lambda actual, expected, _: first_difference(actual, expected),
    )


def _run(fn, values, lengths):
    try:
        return ("returned", fn(list(values), list(lengths)))
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))
