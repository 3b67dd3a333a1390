"""What the front end's patches remember of a tokenizer, and which
tokenizers they remember it for.

A token's text (``decode`` of the id by itself) and its raw piece
(``convert_ids_to_tokens``) are functions of the id alone for a
``transformers`` tokenizer whose methods are the library's own, with its
vocabulary as loaded (a server never adds tokens while it serves). For
those, :class:`PerTokenizer` keeps one dict per live tokenizer object
(dropped with the object), so each id's text is worked out once. Any other
tokenizer (a method of its own, on its class or on the instance) is not
remembered for, and the patches hand its calls to the release's code.
"""

from __future__ import annotations

import sys
import weakref

__all__ = ["PerTokenizer", "library_methods"]


def library_methods(tokenizer, names: tuple[str, ...]) -> bool:
    """Whether ``tokenizer`` is a ``transformers`` tokenizer whose methods
    ``names`` are the library's own (defined in a ``transformers`` module,
    not overridden on the instance)."""
    module = sys.modules.get("transformers.tokenization_utils_base")
    base = getattr(module, "PreTrainedTokenizerBase", None)
    if base is None or not isinstance(tokenizer, base):
        return False
    cls = type(tokenizer)
    for name in names:
        method = getattr(cls, name, None)
        if not (getattr(method, "__module__", None) or "").startswith("transformers."):
            return False
    own = getattr(tokenizer, "__dict__", {})
    return not (set(names) & own.keys())


class PerTokenizer:
    """One dict per live tokenizer object (by ``id``, checked against a weak
    reference, so a new object at a reused address starts empty)."""

    def __init__(self) -> None:
        self._caches: dict[int, tuple[weakref.ref, dict]] = {}

    def of(self, tokenizer) -> dict | None:
        """``tokenizer``'s dict; None where it cannot be weakly referenced."""
        key = id(tokenizer)
        entry = self._caches.get(key)
        if entry is None or entry[0]() is not tokenizer:
            caches = self._caches
            try:
                ref = weakref.ref(tokenizer, lambda _, key=key: caches.pop(key, None))
            except TypeError:
                return None
            entry = (ref, {})
            caches[key] = entry
        return entry[1]

    def clear(self) -> None:
        """Forget every tokenizer's entries."""
        self._caches.clear()
