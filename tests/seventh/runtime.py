"""What the patched module calls at run time: the totals from one running
sum, whatever the batch size. Importable alone."""

from __future__ import annotations

import itertools
from collections.abc import Callable


def make_request_totals(original: Callable, on_answer: Callable[[], None] | None = None):
    """``request_totals`` answered flat where the batch is one it reproduces
    exactly (integer values, non-negative lengths within the values), by
    ``original`` otherwise; ``on_answer`` is called when it answers."""

    def request_totals(values, lengths):
        if not (
            isinstance(values, list)
            and isinstance(lengths, list)
            and all(type(v) is int for v in values)
            and all(type(n) is int and n >= 0 for n in lengths)
            and sum(lengths) <= len(values)
        ):
            return original(values, lengths)
        running = [0, *itertools.accumulate(values)]
        ends = [0, *itertools.accumulate(lengths)]
        if on_answer is not None:
            on_answer()
        return [running[b] - running[a] for a, b in itertools.pairwise(ends)]

    request_totals.__wrapped__ = original
    request_totals.__flatgather__ = "request-totals"
    return request_totals
