"""The logprobs' tuples in the server's front end: the tokenizer manager's
``detokenize_logprob_tokens`` and ``detokenize_top_logprobs_tokens``, each
replaced whole by one pass over the call's positions with one tokenizer call
(:mod:`~flatgather.sglang.patches.front_end.runtime`: what runs), where its
replacement answers as the release's function does on the check's cases
(:mod:`~flatgather.sglang.patches.front_end.check`) and the release's
function is code the test matrix runs (its fingerprint is known).

Both functions are the same in every release of the table (0.5.10 to
0.5.23). They run in the process that answers the client (the one that
runs ``Engine`` or ``launch_server``), and what they return stays there: the
other processes of the server see nothing of this patch, so a server whose
front end leaves it stock answers the same.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from types import MappingProxyType

from flatgather.sglang.check import Answered
from flatgather.sglang.patches.front_end.check import verify
from flatgather.sglang.patches.front_end.runtime import (
    ONE,
    TOP,
    cached_texts,
    make_one,
    make_top,
)
from flatgather.sglang.patching import (
    Candidate,
    Known,
    Option,
    Patch,
    Refused,
    Swap,
    Target,
    known_code,
    release_function,
)

__all__ = ["FRONT_END", "MODULES", "PATCH", "FrontEnd"]

MODULES = ("sglang.srt.managers.tokenizer_manager",)
OWNER = "TokenizerManager"

FRONT_END = "front-end-logprobs"
"""The name of this patch in the install report."""


class FrontEnd(Patch[types.FunctionType, tuple[Callable, Answered, dict, Callable]]):
    """``TokenizerManager.detokenize_logprob_tokens`` and
    ``detokenize_top_logprobs_tokens``, each verified on its own."""

    name = FRONT_END
    modules = MODULES
    what = "the front end's logprob texts"
    options = MappingProxyType(
        {"front_end": Option("decode the logprobs' token texts of a call in one go")}
    )
    serves = "front"
    known = tuple(Known(f"{OWNER}.{fn}", MODULES, fn, OWNER) for fn in (ONE, TOP))

    def locate(self, module):
        owner = getattr(module, OWNER, None)
        if not isinstance(owner, type):
            raise Refused(f"{module.__name__} has no class {OWNER}")
        return [
            Target(owner, fn, module)
            for fn in (ONE, TOP)
            if isinstance(vars(owner).get(fn), types.FunctionType)
        ]

    def prove(self, target):
        # Replaced whole, behind its check: what it is, :meth:`vouch` says.
        return release_function(target.owner, target.name)

    def build(self, target, original):
        """One candidate: the service's replacement, and one built alike for
        the check, counting its answers and reading the check's cache."""
        answered, cache = Answered(), {}
        # The release's one-position function: what the top function calls
        # per position, and what the check's stand-in manager holds.
        one = original if target.name == ONE else release_function(target.owner, ONE)
        if one is None:
            raise Refused(f"{target.where}: {OWNER}.{ONE} is not a plain function")

        def check_texts(tokenizer):
            return cached_texts(tokenizer, cache) if tokenizer is not None else None

        if target.name == ONE:
            live = make_one(original)
            checked = make_one(original, check_texts, answered)
        else:
            live = make_top(original, one)
            checked = make_top(original, one, check_texts, answered)
        yield Candidate(
            swaps=(Swap(target.owner, target.name, live),),
            applied=(FRONT_END,),
            detail=(checked, answered, cache, one),
        )

    def check(self, target, original, candidate):
        checked, answered, cache, one = candidate.detail
        return verify(original, checked, one, answered, target.name == TOP, cache)

    def vouch(self, target, original):
        # The top function's replacement stands for the release's calls of
        # the one-position function too: both must be known.
        for fn in (ONE, TOP) if target.name == TOP else (ONE,):
            known_code(f"{OWNER}.{fn}", target.owner, fn)
        return ()


PATCH = FrontEnd()
