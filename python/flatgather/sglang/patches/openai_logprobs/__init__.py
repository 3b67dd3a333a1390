"""The OpenAI ``logprobs`` object in one pass: ``to_openai_style_logprobs``
of ``sglang.srt.entrypoints.openai.utils``, replaced whole
(:mod:`~flatgather.sglang.patches.openai_logprobs.runtime`: what runs) where
its replacement answers as the release's function does on the check's cases
(:mod:`~flatgather.sglang.patches.openai_logprobs.check`) and the release's
function is code the test matrix runs (its fingerprint is known; from
0.5.21, those of ``_lossless_token_text`` and the two functions it calls
too, on which the texts it remembers rest).

The releases have two of it: up to 0.5.20 each text as it came, from 0.5.21
with a tokenizer and the byte-level fragments rendered losslessly. The
serving modules import the name (``from ... import``), so each module that
holds the release's function is a target, and one verdict per function
serves them all in one installation; a module that imported flatgather's
replacement gets the release's own back at ``uninstall()``
(:class:`~flatgather.sglang.patching.Rebind`).

Like the front end's patch, it runs in the process that answers the client,
and what it returns stays there: a server whose OpenAI layer is stock
answers the same.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from types import MappingProxyType

from flatgather.sglang.check import Answered
from flatgather.sglang.patches.openai_logprobs.check import verify
from flatgather.sglang.patches.openai_logprobs.runtime import (
    LOSSLESS,
    LOSSLESS_READS,
    NAME,
    make_lossless,
    make_plain,
    remembering,
    takes_tokenizer,
)
from flatgather.sglang.patching import (
    Candidate,
    Known,
    Option,
    Patch,
    Rebind,
    Refused,
    Target,
    known_code,
    release_function,
    verified_once,
)

__all__ = ["MODULES", "OPENAI", "PATCH", "OpenAILogprobs"]

DEFINED_IN = ("sglang.srt.entrypoints.openai.utils",)
MODULES = (
    *DEFINED_IN,
    "sglang.srt.entrypoints.openai.serving_completions",
    "sglang.srt.entrypoints.openai.serving_chat",
    "sglang.srt.entrypoints.openai.serving_responses",
)
"""The module that defines it, then those that import it in some release."""

OPENAI = "openai-logprobs"
"""The name of this patch in the install report."""


class OpenAILogprobs(Patch[types.FunctionType, tuple[Callable, Answered]]):
    """``to_openai_style_logprobs`` in each module of :data:`MODULES` that
    holds the release's function, verified once per function."""

    name = OPENAI
    modules = MODULES
    what = "the OpenAI logprobs object"
    options = MappingProxyType(
        {"openai_logprobs": Option("build the OpenAI logprobs object in one pass")}
    )
    serves = "front"
    known = tuple(Known(fn, DEFINED_IN, fn) for fn in (NAME, LOSSLESS, *LOSSLESS_READS))

    def locate(self, module):
        if release_function(module, NAME) is None:
            return []
        return [Target(module, NAME, module)]

    def prove(self, target):
        # Replaced whole, behind its check: what it is, :meth:`vouch` says.
        # Under flatgather's replacement where the module imported the name
        # after the defining module was patched: the release's own is
        # checked, and restored by uninstall().
        return release_function(target.owner, target.name)

    def _lossless(self, original):
        if not takes_tokenizer(original):
            return None
        lossless = original.__globals__.get(LOSSLESS)
        if not isinstance(lossless, types.FunctionType):
            raise Refused(f"{NAME} takes a tokenizer, and its module has no function {LOSSLESS}")
        return lossless

    def build(self, target, original):
        """One candidate: the replacement that goes into service counts
        nothing; the one checked counts its answers."""
        lossless = self._lossless(original)
        answers, seen = Answered(), {}
        if lossless is None:
            live, checked = make_plain(original), make_plain(original, answers)
        else:
            # The one checked remembers its fragments' texts in a dict of
            # its own, whatever the stand-in tokenizer is.
            live = make_lossless(original, lossless)
            checked = make_lossless(
                original, lossless, answers, lambda fn, tok: remembering(fn, tok, seen)
            )
        yield Candidate(
            swaps=(Rebind(target.owner, target.name, live, release=original),),
            applied=(OPENAI,),
            detail=(checked, answers, seen),
        )

    def check(self, target, original, candidate):
        checked, answers, seen = candidate.detail
        return verify(original, checked, answers, takes_tokenizer(original), seen)

    def pick(self, target, original):
        """Once per release function in an installation, whichever module
        holds it: the replacement verified, or why there is none."""
        found = verified_once(self, target, original, (OPENAI, original))
        swap = Rebind(target.owner, target.name, found, release=original)
        return Candidate(swaps=(swap,), applied=(OPENAI,))

    def vouch(self, target, original):
        # Callees before callers: a caller's fingerprint covers its
        # callees', and the refusal names the function that changed.
        lossless = self._lossless(original)
        if lossless is not None:
            for name in LOSSLESS_READS:
                fn = original.__globals__.get(name)
                if not isinstance(fn, types.FunctionType):
                    raise Refused(f"{LOSSLESS} calls {name}, not a plain function of its module")
                known_code(name, None, fn)
            known_code(LOSSLESS, None, lossless)
        known_code(NAME, None, original)
        return ()


PATCH = OpenAILogprobs()
