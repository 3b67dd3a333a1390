"""The check of the rewritten method against the release's own: the stand-in
batches it runs on, and what must hold on each."""

from __future__ import annotations

from flatgather.sglang.patches.prefill_result.harness import (
    Harness,
    Request,
    compare_without_skipped,
)

__all__ = ["CASES", "verify"]

_r = Request

# (requests, batch.return_logprob): every request that is not skipped must
# get what the release's method gives it without the skipped ones.
CASES: tuple[tuple[tuple[Request, ...], bool], ...] = (
    ((_r(3, 0), _r(4, 1, top=2, token_ids=True), _r(2, 0, return_logprob=False)), True),
    ((_r(3, 0, skipped="retracted"), _r(4, 1, top=1), _r(5, 5)), True),
    ((_r(3, 1), _r(2, 0, skipped="finished"), _r(4, 0, middle_chunk=True), _r(3, 2)), True),
    ((_r(2, 0), _r(5, 2, return_logprob=False), _r(3, 0, skipped="retracted")), True),
    (
        (
            _r(2, 0, top=1),
            _r(3, 0, skipped="finished"),
            _r(4, 1, skipped="retracted", middle_chunk=True),
            _r(3, 0, token_ids=True),
        ),
        True,
    ),
    ((_r(4, 4, skipped="retracted"), _r(3, 0), _r(2, 0, skipped="finished")), True),
    # A middle chunk right before a skipped request: the advance over the
    # skipped one starts where the chunk's own branch leaves the cursor.
    (
        (
            _r(4, 1, top=1, middle_chunk=True),
            _r(3, 0, skipped="retracted"),
            _r(2, 0, token_ids=True),
            _r(3, 1, middle_chunk=True),
            _r(2, 0, skipped="finished"),
            _r(3, 0),
        ),
        True,
    ),
    ((_r(3, 0), _r(2, 0, skipped="retracted"), _r(4, 1)), False),
)


def verify(harness: Harness, ours, stock) -> str | None:
    """None when ``ours`` gives every request of :data:`CASES` what the
    release's ``stock`` gives it without the skipped ones; else the first
    difference."""
    for specs, return_logprob in CASES:
        problem = compare_without_skipped(harness, ours, stock, specs, return_logprob)
        if problem:
            return problem
    return None
