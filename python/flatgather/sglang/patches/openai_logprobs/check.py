"""The check, before anything is patched, that the replacement of
``to_openai_style_logprobs`` answers as the release's own function.

:func:`verify` calls both side by side on stand-in tuples: plain texts,
``None`` logprobs and positions, empty lists, ``None`` texts and texts with
U+FFFD (from 0.5.21 these go to the release's ``_lossless_token_text``, with
no tokenizer and with a stand-in byte-level one whose pieces are fragments),
one fragment met twice (the second time remembered), two top-k entries
with one text (the last one's value kept), integer
logprobs (kept as they are, not made floats), top-k entries of four items
(read by index up to 0.5.20); and what goes to the release's code: tuples
in place of lists, token entries of two items, a text that is not a string.
It compares the object each returns (its class, the fields set at
construction and every list, value types included) or the type of what it
raises, and that the replacement answered itself exactly where it should.
"""

from __future__ import annotations

from dataclasses import dataclass

from flatgather.sglang.check import Answered, side_by_side
from flatgather.sglang.compare import first_difference

__all__ = ["CASES", "STAND_IN", "ByteLevelStandIn", "verify"]


class ByteLevelStandIn:
    """A tokenizer that says it is byte-level and whose every piece is
    ``Ã``, the byte 0xC3 alone: not UTF-8, so a fragment."""

    is_byte_level = True

    def convert_ids_to_tokens(self, token_id):
        return "\u00c3"


STAND_IN = ByteLevelStandIn()
"""The one stand-in every check uses, alive as long as the process: the
release remembers a byte-level tokenizer by its ``id``
(``_BYTE_LEVEL_TOKENIZERS``), so a stand-in that died would leave its
address to the next object made there, a tokenizer of another kind
included, which the release would then take for byte-level."""


@dataclass(frozen=True)
class Case:
    args: tuple
    """input_token_logprobs, output_token_logprobs, input_top_logprobs, output_top_logprobs."""
    plain: bool
    """Whether the replacement up to 0.5.20 must answer (not hand the call back)."""
    lossless: bool
    """The same, for the replacement from 0.5.21."""
    tokenizer: bool = False
    """A byte-level stand-in tokenizer (from 0.5.21; none otherwise)."""


_IN = [(None, 1, "a"), (-0.5, 2, "b"), (-1.25, 3, "c")]
_OUT = [(-2.0, 4, "d")]
_TOP_IN = [None, [(-0.5, 2, "b"), (-1.0, 5, "e")], [(-1.25, 3, "c"), (-3.0, 6, "f")]]
_TOP_OUT = [[(-2.0, 4, "d"), (-4.0, 7, "g")]]
_ODD = [(-0.5, 8, "\ufffd"), (-1.5, 9, None), (-2.5, 10, "x\ufffdy"), (-3.5, 8, "\ufffd")]
"""Texts the release renders: one fragment twice (the second remembered)."""

CASES = (
    Case((_IN, _OUT, _TOP_IN, _TOP_OUT), True, True),
    Case((None, _OUT, None, _TOP_OUT), True, True),
    Case((None, None, None, None), True, True),
    Case(([], [], [], []), True, True),
    Case((_ODD, _OUT, [_ODD, None, []], [_ODD]), True, True),
    Case((_ODD, _OUT, [_ODD, None, []], [_ODD]), True, True, tokenizer=True),
    Case((_IN, [], [[(-1.0, 5, "e"), (-2.0, 6, "e")]], []), True, True),  # one text twice
    Case(([(-1, 1, "a"), (0, 2, "b")], None, [[(-3, 1, "a")]], None), True, True),  # ints stay ints
    Case((None, None, [[(-1.0, 5, "e", "more")]], None), True, False),  # read by index up to 0.5.20
    Case((tuple(_IN), _OUT, None, None), False, False),
    Case(([(-1.0, 5)], None, None, None), False, False),
    Case(([(-1.0, 5, b"bytes")], None, None, None), True, False),  # a text from 0.5.21
)


def verify(original, replacement, answered: Answered, lossless: bool, seen: dict):
    """None when ``replacement`` answers as ``original`` on every case,
    answering itself (counted by ``answered``) exactly where the case says;
    else the first difference. ``lossless``: the 0.5.21+ function, which
    takes a tokenizer (passed only to that one); ``seen``: the texts the
    replacement remembers, emptied before each case."""

    def run(fn, case: Case):
        seen.clear()
        args = tuple(list(a) if type(a) is list else a for a in case.args)
        extra = {"tokenizer": STAND_IN if case.tokenizer else None} if lossless else {}
        try:
            out = fn(*args, **extra)
        except Exception as exc:  # compared by type: the same failure, or none
            return {"raised": type(exc).__name__}
        return {
            "class": type(out),
            "set": sorted(getattr(out, "model_fields_set", ())),
            "fields": dict(vars(out)),
        }

    cases = [c for c in CASES if lossless or not c.tokenizer]
    return side_by_side(
        original,
        replacement,
        cases,
        run,
        answered,
        flat=lambda case: case.lossless if lossless else case.plain,
        where=lambda case: f"to_openai_style_logprobs{case.args!r}",
        compare=first_difference,
    )
