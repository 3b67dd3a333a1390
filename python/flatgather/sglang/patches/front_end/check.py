"""The check, before anything is patched, that the front end's replacements
answer as the release's own functions.

:func:`verify` calls the release's function and the replacement side by
side on a stand-in tokenizer manager whose tokenizer decodes each id to a
text of its own (and fails on a negative one, as a real tokenizer does): with
and without texts; positions with no values (``None`` where the release
gives ``None``), empty id lists, ids repeated within and across positions,
more ids than values, a call that meets ids decoded by an earlier one; no
tokenizer, lengths that differ, ids that are not ``int``, a subclass with
its own ``detokenize_logprob_tokens`` (all of which go to the release's
code). It compares what each returns, or the type of what it raises, and
that the replacement answered itself exactly where it should.

The stand-in tokenizer is not a ``transformers`` one, so the check hands
the replacement a cache of its own (:func:`~.runtime.cached_texts`) in
place of the service's choice of tokenizers
(:func:`~.runtime.texts_of`); what that choice admits is tested against the
release with a real tokenizer (``tests/test_front_end.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from flatgather.sglang.check import Answered, side_by_side
from flatgather.sglang.compare import first_difference
from flatgather.sglang.patches.front_end.runtime import ONE, TOP, cached_texts

__all__ = ["ONE_CASES", "TOP_CASES", "StandInTokenizer", "verify"]


class StandInTokenizer:
    """Decodes each sequence by itself, as ``transformers`` does; an empty
    batch gives one empty text, as ``transformers`` 5 does."""

    def __init__(self) -> None:
        self.calls = 0

    def batch_decode(self, sequences):
        self.calls += 1
        if not sequences:
            return [""]
        out = []
        for seq in sequences:
            if any(i < 0 for i in seq):
                raise OverflowError(f"out of range integral type conversion attempted: {seq}")
            out.append("".join(f"<{i}>" for i in seq))
        return out


@dataclass(frozen=True)
class Case:
    vals: list
    ids: list
    text: bool
    answers: bool
    """Whether the replacement must answer (not hand the call back)."""
    tokenizer: bool = True
    own_one: bool = False
    """The manager's class has a ``detokenize_logprob_tokens`` of its own."""
    warm: tuple = ()
    """Ids an earlier call decoded (in the replacement's cache)."""


_V = [-0.5, -1.25, -2.0, -3.5, -0.0]
TOP_CASES = (
    Case([_V[:2], [], _V[2:5]], [[3, 4], [5], [7, 3, 9]], True, True),
    Case([_V[:2], [], _V[2:5]], [[3, 4], [5], [7, 3, 9]], False, True),
    Case([_V[:2], _V[:2]], [[3, 3], [3, 4]], True, True, warm=(3, 8)),  # repeated ids
    Case([_V[:1], _V[:2]], [[6, 7, 8], [1, 2]], True, True),  # more ids than values
    Case([[], []], [[1], [2]], True, True, tokenizer=False),  # nothing to decode
    Case([], [], True, True),
    Case([_V[:2]], [[1, 2]], True, False, tokenizer=False),  # the release's assert
    Case([_V[:2], _V[:1]], [[1, 2]], True, False),  # lengths differ
    Case([_V[:2]], [[1, True]], True, False),  # an id that is not an int
    Case([_V[:2], _V[:1]], [[1, 2], [-4]], True, False),  # the tokenizer's error
    Case([_V[:2]], [[1, 2]], True, False, own_one=True),
    Case([_V[:2]], [None], False, False),  # the release's TypeError
)
ONE_CASES = (
    Case(_V[:3], [3, 4, 3], True, True),
    Case(_V[:3], [3, 4, 3], False, True),
    Case(_V[:2], [5, 6, 7], True, True, warm=(6,)),
    Case([], [], True, True),
    Case(_V[:2], [1, 2], True, False, tokenizer=False),
    Case(_V[:2], [1, 2.0], True, False),
    Case(_V[:2], [1, -2], True, False),
    Case(_V[:2], (1, 2), True, False),
)


def _manager(release_one, case: Case, cache: dict):
    class Manager:
        detokenize_logprob_tokens = release_one

    if case.own_one:

        class Manager(Manager):  # a subclass of the one above
            def detokenize_logprob_tokens(self, vals, ids, decode_to_text):
                return [(v, i, "its own") for v, i in zip(vals, ids, strict=False)]

    manager = Manager()
    manager.tokenizer = StandInTokenizer() if case.tokenizer else None
    if case.warm:
        cached_texts(manager.tokenizer, cache)(list(case.warm))
    return manager


def verify(original, replacement, release_one, answered: Answered, top: bool, cache: dict):
    """None when ``replacement`` (built to read its texts through ``cache``)
    answers as ``original`` on every case, answering itself (counted by
    ``answered``) exactly where the case says; else the first difference."""

    def run(fn, case: Case):
        cache.clear()
        manager = _manager(release_one, case, cache)
        try:
            return {"returned": fn(manager, list(case.vals), case.ids, case.text)}
        except Exception as exc:  # compared by type: the same failure, or none
            return {"raised": type(exc).__name__}

    return side_by_side(
        original,
        replacement,
        TOP_CASES if top else ONE_CASES,
        run,
        answered,
        flat=lambda case: case.answers,
        where=lambda case: (
            f"{TOP if top else ONE} on values {case.vals}, ids {case.ids}, "
            f"{'with' if case.text else 'without'} texts"
        ),
        compare=first_difference,
    )
