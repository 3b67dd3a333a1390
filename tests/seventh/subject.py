"""What the seventh patch patches: a module that stands for a release's,
with one function that walks a batch request by request."""

from __future__ import annotations


def request_totals(values, lengths):
    """The sum of each request's run of ``values`` (``lengths`` of them, in
    batch order): one slice and one ``sum`` per request."""
    totals = []
    start = 0
    for n in lengths:
        totals.append(sum(values[start : start + n]))
        start += n
    return totals
