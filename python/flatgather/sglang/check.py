"""The one side-by-side check of a replacement against the release's own
function: on each case, the same answer (values, types, the same failure),
and flatgather's own path taken exactly where the case says it should be
(a replacement that quietly falls back to the release's code everywhere
would pass on answers alone)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["Answered", "side_by_side"]

Case = TypeVar("Case")


class Answered:
    """Counts the calls flatgather's own path answered (the replacement is
    built with this as its ``on_answer``)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def side_by_side(
    original: Callable,
    replacement: Callable,
    cases: Iterable[Case],
    run: Callable[[Callable, Case], Any],
    answered: Answered,
    flat: Callable[[Case], bool],
    where: Callable[[Case], str],
    compare: Callable[[Any, Any, str], str | None],
) -> str | None:
    """None when, on every case, ``run(replacement, case)`` is
    ``run(original, case)`` by ``compare`` and the replacement answered
    through ``answered`` exactly where ``flat(case)``; else the first
    difference, prefixed by ``where(case)``."""
    for case in cases:
        expected = run(original, case)
        before = answered.count
        actual = run(replacement, case)
        found = compare(actual, expected, "")
        if found:
            return f"{where(case)}: {found}"
        if (answered.count > before) != flat(case):
            took = "did not answer" if flat(case) else "answered"
            return f"{where(case)}: the gather {took}"
    return None
