"""The logprobs' token texts in the server's front end, one decode per batch.

The tokenizer manager (the process that answers the client) turns the
logprob values it receives into ``(logprob, token id, text)`` tuples:

* ``detokenize_logprob_tokens(vals, ids, decode_to_text)``: one position
  each, the texts (``decode_to_text``, asked for by ``return_text_in_logprobs``
  and by every OpenAI endpoint) decoded by one ``tokenizer.batch_decode``
  of the ids, each id on its own;
* ``detokenize_top_logprobs_tokens(vals, ids, decode_to_text)``: a list of
  positions (top-k, token-id logprobs), each position handed to the first,
  so one ``batch_decode`` per position (SGLang's own comment there says the
  positions should be batched).

An echo-scoring request of 300 prompt tokens with the top 5 costs 301
tokenizer calls. Their replacements decode the ids of every position of the
call in one ``batch_decode``, and only the ids the tokenizer has not decoded
before: a token's text is a function of its id alone for the ``transformers``
tokenizers whose ``decode`` and ``batch_decode`` are the library's own (each
sequence decoded by itself), so each text is decoded once per tokenizer
(:func:`texts_of`). Without texts, each position's tuples are made by one
``zip``.

What the replacements return is what the release's functions return:
the same tuples of the same values, the same ``None`` for a position without
values, the same exception where the release's raises. Anything else goes to
the release's own function, untouched: a tokenizer of another kind (a custom
``decode``, SGLang's wrappers, none at all), ids that are not ``int``,
arguments that are not lists or whose lengths differ, a subclass or instance
that replaced ``detokenize_logprob_tokens`` (the top function calls it, and
that call is kept). Which functions are replaced, and that they match the
release's, is decided at install by
:mod:`flatgather.sglang.patches.front_end`.
"""

from __future__ import annotations

import functools
import itertools
import sys
from collections.abc import Callable

from flatgather.sglang.tokenizers import PerTokenizer

__all__ = ["ONE", "TOP", "Texts", "forget_texts", "make_one", "make_top", "texts_of"]

ONE = "detokenize_logprob_tokens"
TOP = "detokenize_top_logprobs_tokens"

Texts = Callable[[object], "Callable[[list], list | None] | None"]
"""Given a tokenizer: a function from a list of ids to their texts (None
where it cannot answer them), or None where that tokenizer's texts must come
from the release's own code."""

_TEXTS = PerTokenizer()
"""Per live tokenizer: the texts of the ids it has decoded."""


def _library_decodes(tokenizer) -> bool:
    """Whether ``tokenizer`` is a ``transformers`` tokenizer whose
    ``batch_decode`` decodes each sequence by itself with the library's own
    ``decode`` (its texts then depend on the id alone)."""
    module = sys.modules.get("transformers.tokenization_utils_base")
    base = getattr(module, "PreTrainedTokenizerBase", None)
    if base is None or not isinstance(tokenizer, base):
        return False
    cls = type(tokenizer)
    if cls.batch_decode is not base.batch_decode or cls.decode is not base.decode:
        return False
    # An instance attribute would shadow the class's method.
    own = getattr(tokenizer, "__dict__", {})
    return not ({"batch_decode", "decode", "_decode"} & own.keys())


def cached_texts(tokenizer, cache: dict) -> Callable[[list], list | None]:
    """The texts of a list of ids through ``cache`` (filled by one
    ``tokenizer.batch_decode`` of the ids it lacks, each id its own
    sequence, as the release decodes them); None when an id is not an
    ``int``. The tokenizer's exception, where it raises, goes through."""

    def texts(ids: list) -> list | None:
        if not set(map(type, ids)) <= {int}:
            return None
        missing = [i for i in dict.fromkeys(ids) if i not in cache]
        if missing:
            decoded = tokenizer.batch_decode([[i] for i in missing])
            if type(decoded) is not list or len(decoded) != len(missing):
                return None
            cache.update(zip(missing, decoded, strict=True))
        return [cache[i] for i in ids]

    return texts


def texts_of(tokenizer) -> Callable[[list], list | None] | None:
    """The ids-to-texts function of ``tokenizer`` in service (a
    :data:`Texts`): cached per tokenizer object for the ``transformers``
    tokenizers that decode each id by itself; None for any other kind."""
    if tokenizer is None or not _library_decodes(tokenizer):
        return None
    cache = _TEXTS.of(tokenizer)
    return None if cache is None else cached_texts(tokenizer, cache)


def forget_texts() -> None:
    """Drop every tokenizer's decoded texts (they are decoded again when
    next asked for)."""
    _TEXTS.clear()


def _without_texts(vals, ids) -> list:
    return list(zip(vals, ids, itertools.repeat(None)))


def make_one(
    original: Callable, texts_for: Texts = texts_of, on_answer: Callable[[], None] | None = None
) -> Callable:
    """``detokenize_logprob_tokens`` with its texts through ``texts_for``;
    ``on_answer`` (the install check's counter) is called each time the
    replacement answered itself."""

    @functools.wraps(original)
    def detokenize_logprob_tokens(self, token_logprobs_val, token_logprobs_idx, decode_to_text):
        vals, ids = token_logprobs_val, token_logprobs_idx
        if type(ids) is not list:
            return original(self, vals, ids, decode_to_text)
        if not decode_to_text:
            out = _without_texts(vals, ids)
        else:
            texts = texts_for(getattr(self, "tokenizer", None))
            found = texts(ids) if texts is not None else None
            if found is None:
                return original(self, vals, ids, decode_to_text)
            out = list(zip(vals, ids, found, strict=False))
        if on_answer is not None:
            on_answer()
        return out

    detokenize_logprob_tokens.__flatgather__ = ONE
    return detokenize_logprob_tokens


def make_top(
    original: Callable,
    release_one: Callable,
    texts_for: Texts = texts_of,
    on_answer: Callable[[], None] | None = None,
) -> Callable:
    """``detokenize_top_logprobs_tokens`` with the texts of every position
    decoded in one go; ``release_one`` is the release's
    ``detokenize_logprob_tokens``, the function the release's top function
    calls per position (this one answers only where that is what
    ``self.detokenize_logprob_tokens`` is, under flatgather's replacement
    or not); ``texts_for`` and ``on_answer`` as for :func:`make_one`."""

    def calls_the_release(self) -> bool:
        if ONE in getattr(self, "__dict__", {}):
            return False
        fn = getattr(type(self), ONE, None)
        while getattr(fn, "__flatgather__", None) == ONE:
            fn = fn.__wrapped__
        return fn is release_one

    @functools.wraps(original)
    def detokenize_top_logprobs_tokens(
        self, token_logprobs_val, token_logprobs_idx, decode_to_text
    ):
        vals, ids = token_logprobs_val, token_logprobs_idx
        if not (type(vals) is list and type(ids) is list and len(vals) == len(ids)):
            return original(self, vals, ids, decode_to_text)
        if not calls_the_release(self):
            return original(self, vals, ids, decode_to_text)
        if not decode_to_text:
            out = [_without_texts(v, i) if v else None for v, i in zip(vals, ids, strict=False)]
        else:
            kept = [(v, i) for v, i in zip(vals, ids, strict=False) if v]
            if not kept:
                out = [None] * len(vals)
            else:
                if not all(type(i) is list for _, i in kept):
                    return original(self, vals, ids, decode_to_text)
                texts = texts_for(getattr(self, "tokenizer", None))
                found = texts([t for _, i in kept for t in i]) if texts is not None else None
                if found is None:
                    return original(self, vals, ids, decode_to_text)
                out, at = [], 0
                for v, i in zip(vals, ids, strict=False):
                    if v:
                        out.append(list(zip(v, i, found[at : at + len(i)], strict=False)))
                        at += len(i)
                    else:
                        out.append(None)
        if on_answer is not None:
            on_answer()
        return out

    detokenize_top_logprobs_tokens.__flatgather__ = TOP
    return detokenize_top_logprobs_tokens
