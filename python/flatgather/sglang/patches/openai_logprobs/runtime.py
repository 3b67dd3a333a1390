"""The OpenAI ``logprobs`` object of a completion, built in one pass.

The OpenAI layer of the front end (``/v1/completions``, and the chat and
responses endpoints where they use it) turns the ``(logprob, token id,
text)`` tuples of a request (:mod:`~flatgather.sglang.patches.front_end`)
into a ``LogProbs`` object with ``to_openai_style_logprobs``. The release
walks every tuple in a Python loop, appending to the object's four lists one
value at a time; from 0.5.21 it also calls ``_lossless_token_text`` for every
text (top-k ones included), which hands the text back unchanged unless it is
``None`` or holds U+FFFD (a byte-level fragment, rendered as latin-1 from
the token's bytes, some 2 µs each). An echo-scoring request of 300 tokens
with the top 5 is some 1,800 such calls.

The replacements build each list with one comprehension and extend the
object's own lists with it, so the object is the release's: the same class,
made the same way (``LogProbs()``, nothing set at construction), its lists
holding the same values. From 0.5.21, the text check that
``_lossless_token_text`` starts with is made in the comprehension, and the
release's own function is called for the texts it does not pass, once per
tokenizer, id and text: what it answers reads nothing else (its code and
that of the two functions it calls, ``token_id_to_bytes`` and
``_is_byte_level_tokenizer``, vouched for by their fingerprints, and each
found in the module at every call) where the tokenizer's pieces are the
library's (:mod:`flatgather.sglang.tokenizers`); for any other tokenizer it
is called for every such text.

Anything else goes to the release's function: an argument that is not a
list (or ``None``), a module whose ``LogProbs`` or ``_lossless_token_text``
is not the one the replacement was built against, and any exception on the
way (the release's function then runs from the start, and raises what it
raises; a tokenizer it calls may be called twice).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from flatgather.sglang.tokenizers import PerTokenizer, library_methods

__all__ = [
    "LOSSLESS",
    "LOSSLESS_READS",
    "NAME",
    "PIECES",
    "forget_rendered",
    "make_lossless",
    "make_plain",
    "remembering",
    "takes_tokenizer",
]

NAME = "to_openai_style_logprobs"
LOSSLESS = "_lossless_token_text"
"""The 0.5.21+ helper the replacement calls for the texts it cannot pass."""
LOSSLESS_READS = ("_is_byte_level_tokenizer", "token_id_to_bytes")
"""The module's functions ``_lossless_token_text`` calls: with it, what a
remembered text rests on. Callee first (``token_id_to_bytes`` calls the
other), so a refusal names the innermost code that is not known: a
caller's fingerprint covers its callees'."""
PIECES = ("convert_ids_to_tokens", "get_vocab")
"""The tokenizer's methods those read."""
_FFFD = "\ufffd"
_RENDERED = PerTokenizer()
"""Per live tokenizer: ``(id, text) -> _lossless_token_text(tokenizer, id,
text)`` for the texts it was called for."""


def takes_tokenizer(fn) -> bool:
    """Whether ``fn``, the release's ``to_openai_style_logprobs``, is the
    form from 0.5.21 (it takes a tokenizer, and renders fragments)."""
    code = fn.__code__
    return "tokenizer" in code.co_varnames[: code.co_argcount]


def forget_rendered() -> None:
    """Drop every tokenizer's remembered fragment texts."""
    _RENDERED.clear()


def remembering(lossless: Callable, tokenizer, seen: dict) -> Callable:
    """``(id, text) -> lossless(tokenizer, id, text)``, each answer kept in
    ``seen`` (the tokenizer's, or the install check's own)."""

    def render(i, t):
        key = (i, t)
        found = seen.get(key)
        if found is None:
            found = seen[key] = lossless(tokenizer, i, t)
        return found

    return render


def _renderer(lossless: Callable, tokenizer) -> Callable:
    """:func:`remembering` through the tokenizer's own dict where its pieces
    are the library's (:data:`PIECES`: the answer is then a function of the
    id and the text alone); else ``lossless`` each time."""
    seen = None
    if tokenizer is not None and library_methods(tokenizer, PIECES):
        seen = _RENDERED.of(tokenizer)
    if seen is None:
        return lambda i, t: lossless(tokenizer, i, t)
    return remembering(lossless, tokenizer, seen)


def _filled(out, texts: list, values: list, tops: list, on_answer):
    """The release's fresh ``LogProbs()`` with its own four lists extended,
    as the release's loop leaves them."""
    out.tokens.extend(texts)
    out.token_logprobs.extend(values)
    out.text_offset.extend([-1] * len(values))
    out.top_logprobs.extend(tops)
    if on_answer is not None:
        on_answer()
    return out


def _lists(args: tuple) -> bool:
    return all(a is None or type(a) is list for a in args)


def make_plain(original: Callable, on_answer: Callable[[], None] | None = None) -> Callable:
    """The replacement of the release's ``to_openai_style_logprobs`` up to
    0.5.20 (no tokenizer: each text as it came). ``on_answer`` is called
    each time it answered itself (the install check's counter)."""
    scope = original.__globals__
    model = scope.get("LogProbs")

    @functools.wraps(original)
    def to_openai_style_logprobs(
        input_token_logprobs=None,
        output_token_logprobs=None,
        input_top_logprobs=None,
        output_top_logprobs=None,
    ):
        args = (
            input_token_logprobs,
            output_token_logprobs,
            input_top_logprobs,
            output_top_logprobs,
        )
        if scope.get("LogProbs") is not model or not _lists(args):
            return original(*args)
        try:
            texts, values, tops = [], [], []
            for seq in args[:2]:
                if seq is not None:
                    texts += [t for _, _, t in seq]
                    values += [v for v, _, _ in seq]
            for seq in args[2:]:
                if seq is not None:
                    tops += [
                        None if pos is None else {tok[2]: tok[0] for tok in pos} for pos in seq
                    ]
        except Exception:
            return original(*args)
        return _filled(model(), texts, values, tops, on_answer)

    to_openai_style_logprobs.__flatgather__ = NAME
    return to_openai_style_logprobs


def make_lossless(
    original: Callable,
    lossless: Callable,
    on_answer: Callable[[], None] | None = None,
    renderer: Callable[[Callable, object], Callable] = _renderer,
) -> Callable:
    """The replacement of the release's ``to_openai_style_logprobs`` from
    0.5.21 (texts through ``lossless``, the release's
    ``_lossless_token_text``, where they are ``None`` or hold U+FFFD, each
    worked out once per tokenizer by ``renderer``); ``on_answer`` as for
    :func:`make_plain`."""
    scope = original.__globals__
    model = scope.get("LogProbs")
    reads = {name: scope.get(name) for name in LOSSLESS_READS}

    @functools.wraps(original)
    def to_openai_style_logprobs(
        input_token_logprobs=None,
        output_token_logprobs=None,
        input_top_logprobs=None,
        output_top_logprobs=None,
        tokenizer=None,
    ):
        args = (
            input_token_logprobs,
            output_token_logprobs,
            input_top_logprobs,
            output_top_logprobs,
        )
        if (
            scope.get("LogProbs") is not model
            or scope.get(LOSSLESS) is not lossless
            or any(scope.get(name) is not fn for name, fn in reads.items())
            or not _lists(args)
        ):
            return original(*args, tokenizer)
        try:
            render = renderer(lossless, tokenizer)
            texts, values, tops = [], [], []
            for seq in args[:2]:
                if seq is not None:
                    texts += [
                        t if t is not None and _FFFD not in t else render(i, t) for _, i, t in seq
                    ]
                    values += [v for v, _, _ in seq]
            for seq in args[2:]:
                if seq is not None:
                    tops += [
                        None
                        if pos is None
                        else {
                            (t if t is not None and _FFFD not in t else render(i, t)): v
                            for v, i, t in pos
                        }
                        for pos in seq
                    ]
        except Exception:
            return original(*args, tokenizer)
        return _filled(model(), texts, values, tops, on_answer)

    to_openai_style_logprobs.__flatgather__ = NAME
    return to_openai_style_logprobs
