"""The token-id input logprobs, each function replaced by one gather
(:mod:`~flatgather.sglang.patches.input_logprobs.runtime`: what runs) where
its replacement is verified against it
(:mod:`~flatgather.sglang.patches.input_logprobs.check`: the cases).

The functions are looked up where their callers look them up: the module
globals of ``logits_processor`` and, from 0.5.16 on, ``logprob_processor``.
The older releases (0.5.10 to 0.5.15) append nothing for a request that gets
no values, and nothing at all for an empty chunk: both walks are tried, and
the one that matches on every case is used. A function that neither matches,
or whose code the test matrix has not run, is left stock, with a note naming
why.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from types import MappingProxyType

from flatgather.sglang.check import Answered
from flatgather.sglang.patches.input_logprobs.check import CASES, WHOLE_CASES, verify
from flatgather.sglang.patches.input_logprobs.runtime import (
    CHUNK,
    PREFILL,
    Walk,
    make_chunk,
    make_prefill,
)
from flatgather.sglang.patching import Candidate, Known, Option, Patch, Swap, Target, known_code

__all__ = ["CHUNK", "MODULES", "PATCH", "PREFILL", "TOKEN_IDS", "InputLogprobs"]

MODULES = ("sglang.srt.layers.logits_processor", "sglang.srt.layers.logprob_processor")
"""Where the callers of the functions look them up."""

TOKEN_IDS = "input-token-ids-logprobs"
"""The name of this patch in the install report."""


_DEFINED_IN = (
    "sglang.srt.layers.logprob_processor",
    "sglang.srt.layers.utils.logprob",
    "sglang.srt.layers.logits_processor",
)
"""Where a release defines the functions (the fingerprints are read there)."""


class InputLogprobs(Patch[types.FunctionType, tuple[Callable, Answered]]):
    """``get_token_ids_logprobs_chunk`` and ``get_token_ids_logprobs_prefill``
    in each module of :data:`MODULES` that has them, each verified on its
    own."""

    name = TOKEN_IDS
    modules = MODULES
    what = "the token-id input logprobs"
    options = MappingProxyType(
        {"input_logprobs": Option("gather the token-id input logprobs in one go")}
    )
    known = (Known(CHUNK, _DEFINED_IN, CHUNK), Known(PREFILL, _DEFINED_IN, PREFILL))

    def locate(self, module):
        return [
            Target(module, name, module)
            for name in (CHUNK, PREFILL)
            if isinstance(vars(module).get(name), types.FunctionType)
        ]

    def prove(self, target):
        # Replaced whole, behind its check: what it is, :meth:`vouch` says.
        return vars(target.owner)[target.name]

    def build(self, target, original):
        """One candidate per walk: the one checked counts its gathers; the
        one that goes into service counts nothing."""
        if target.name == PREFILL:
            gathers = Answered()
            yield Candidate(
                swaps=(Swap(target.owner, PREFILL, make_prefill(original)),),
                applied=(TOKEN_IDS,),
                detail=(make_prefill(original, gathers), gathers),
            )
            return
        to_host = original.__globals__.get("async_d2h")
        for skip in (False, True):
            gathers, walk = Answered(), Walk(skip_empty=skip)
            yield Candidate(
                swaps=(Swap(target.owner, CHUNK, make_chunk(original, walk, to_host)),),
                applied=(TOKEN_IDS,),
                detail=(make_chunk(original, walk, to_host, gathers), gathers),
            )

    def check(self, target, original, candidate):
        chunk = target.name == CHUNK
        counted, gathers = candidate.detail
        return verify(original, counted, gathers, CASES if chunk else WHOLE_CASES, chunk)

    def vouch(self, target, original):
        known_code(target.name, None, original)
        return ()


PATCH = InputLogprobs()
