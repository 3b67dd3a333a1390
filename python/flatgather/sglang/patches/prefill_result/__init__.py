"""The scheduler's prefill results: ``process_batch_result_prefill`` with the
input-logprob cursor advanced over the requests it skips (SGLang issue
#36938).

``logits_output.input_token_logprobs`` holds one block of rows per request of
the batch, in batch order, whether or not that request asked for logprobs.
The method walks it with a cursor, ``logprob_pt``, which each request's
branch advances by the release's own count
(``calculate_num_input_logprobs``). The branch that skips a request that
finished in a mixed batch or was retracted ``continue``\\ s before the cursor
moves, so every later request of the batch is served another request's input
logprobs. Nothing raises.

Where it lives: ``SchedulerOutputProcessorMixin`` (0.5.10 to 0.5.12, which
``Scheduler`` inherits) and ``SchedulerBatchResultProcessor`` (0.5.13 on, an
instance of which the scheduler holds as ``batch_result_processor``). Both
are patched on the class, which is what the scheduler calls.

How, and why this way
---------------------
As :mod:`flatgather.sglang.patches.draft_prefill` does, :class:`PrefillResult` rewrites the
release's own syntax tree and changes one thing:

1. The release's method is driven first, with stand-ins for everything it
   hands its requests to (see :class:`Harness`), on a batch with a retracted
   and a batch with a finished request in the middle: when the request after
   it gets what it gets from the same batch without the skipped one, the
   release advances the cursor itself and its method is left as it is.
2. :func:`flatgather.sglang.source.parse_method` proves that the parsed
   source is the code that runs.
3. A matcher finds the generation loop (``for i, (req, ...) in
   enumerate(zip(batch.reqs, ...))``), its skip branch (an ``if`` reading
   ``req.is_retracted`` whose body is ``continue``) and, in the branch that
   finishes a prefill, the release's own advance: ``num =
   <count>(req, lens[i], starts[i])`` then ``pt += num``, inline or in a
   helper method that returns the cursor (``_apply_prefill_logprobs``), and
   the conditions it runs under (``batch.return_logprob``).
4. Only the skip branch changes: before its ``continue``::

       if <those conditions> and <lens> is not None and <starts> is not None:
           <pt> += <count>(req, <lens>[i], <starts>[i])

   The chunked branch's guard (``start < extend``) is not repeated: with the
   start never past the extend, as SGLang builds the batch, it changes
   nothing the count gives.
5. Before anything is patched, the rewritten method and the release's run on
   small stand-in batches (a skipped request first, in the middle, last, two
   in a row, a retracted middle chunk, non-logprob and chunked requests, a
   batch without logprobs): every request that is not skipped must get
   exactly what the release's method gives it in the same batch without the
   skipped ones, a skipped one what the release leaves on it, and a batch
   with no skipped request must come out exactly as from the release. Any
   difference, any shape the matcher does not know, a source that is not the
   running code: the method stays as shipped, with a note saying why.

The stand-ins
-------------
The check must not depend on a scheduler's runtime context (a scheduler
process may import this before it has one), so the release's method runs on
stand-ins: requests and batches that hold what the logprob code reads;
``self`` with the class's own logprob methods (every method whose name says
``logprob`` that the method calls, and what those call), the logprob
processor of 0.5.13 on likewise, and an inert object for any other
collaborator (KV cache, metrics, streaming). The module-level functions that
the method and those logprob methods call (``release_kv_cache``,
``get_memory``, and ``get_exec``, which the count of 0.5.17 to 0.5.20 reads
first) are inert too: each runs as its own code object over an overlaid
globals dict. The loop, the skip branch and the logprob consumers are the
release's own code. Each request's rows carry values of its own, so a
shifted block shows; the first probe also checks that a request receives its
own rows at all, or the check could not see a shift. Which requests the
release skips is told by running it on each alone (a finished middle chunk is
skipped up to 0.5.13 and drained from 0.5.14). The whole check takes about
4 ms.

The room
--------
The patch and its names are here; ``harness.py`` (the stand-ins),
``match.py``, ``rewrite.py`` and ``check.py`` are its steps, and each keeps
the release's names it alone reads (the count the matcher looks for, the
logprob processor's module). The stand-ins also need :data:`METHOD`: as
this module imports them, they read it when a :class:`Harness` is built,
not when they are imported (an import cycle).
"""

from __future__ import annotations

import ast
import copy
import importlib
import types
from dataclasses import dataclass

from flatgather.sglang import source
from flatgather.sglang.patches.prefill_result.check import verify
from flatgather.sglang.patches.prefill_result.harness import (
    Harness,
    Raised,
    Record,
    Request,
    compare_without_skipped,
    skip_advances,
)
from flatgather.sglang.patches.prefill_result.match import find_shape
from flatgather.sglang.patches.prefill_result.rewrite import advance_in_skip
from flatgather.sglang.patching import Candidate, Patch, Refused, Swap, Target, Unneeded

__all__ = [
    "FIX",
    "METHOD",
    "MODULES",
    "PATCH",
    "Harness",
    "PrefillResult",
    "Raised",
    "Record",
    "Request",
    "compare_without_skipped",
    "owner_of",
    "release_module",
    "skip_advances",
]


MODULES = (
    "sglang.srt.managers.scheduler_output_processor_mixin",  # 0.5.10 to 0.5.12
    "sglang.srt.managers.scheduler_components.batch_result_processor",  # 0.5.13 on
)
METHOD = "process_batch_result_prefill"
FIX = "prefill-skip-logprob-pt"
"""The skip branch advances the input-logprob cursor (SGLang issue #36938)."""


def release_module() -> types.ModuleType:
    """The running release's module of :data:`MODULES` (imported): the one
    that holds the method."""
    for name in MODULES:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    raise ModuleNotFoundError(f"none of {MODULES}")


def owner_of(module) -> type | str:
    """The class of ``module`` that defines the method, or why there is not one."""
    owners = [
        c
        for c in vars(module).values()
        if isinstance(c, type) and c.__module__ == module.__name__ and METHOD in vars(c)
    ]
    if len(owners) != 1:
        return f"{module.__name__} defines {METHOD} in {len(owners)} classes, not one"
    return owners[0]


@dataclass(frozen=True)
class Found:
    """What :meth:`PrefillResult.prove` found: the stand-ins the release's
    method ran on, that method, its proven source and a copy of its tree
    with the loop's shape matched in it."""

    harness: Harness
    stock: types.FunctionType
    method: source.Method
    tree: ast.FunctionDef
    shape: object


class PrefillResult(Patch[Found, None]):
    """``process_batch_result_prefill`` (the mixin's or the batch result
    processor's): its skip branch advances the input logprob cursor,
    verified against the release's own method; nothing where the release
    already advances it."""

    name = FIX
    modules = MODULES
    unfixed = "SGLang issue #36938 unfixed"
    answers = "returned"  # no path of the release's is left in the method

    def locate(self, module):
        owner = owner_of(module)
        if isinstance(owner, str):
            raise Refused(owner)
        return [Target(owner, METHOD, module)]

    def prove(self, target):
        """The release's method, driven on stand-ins: it does not advance
        the cursor over a skipped request (else :class:`Unneeded`); its
        source, proven, and the shape of its loop, matched."""
        owner = target.owner
        stock = vars(owner)[METHOD]
        if not isinstance(stock, types.FunctionType):
            raise Refused("it is not a plain function")
        harness = Harness(owner, target.module)
        verdict = skip_advances(harness, stock)
        if verdict is True:
            raise Unneeded  # the release advances the cursor itself
        if isinstance(verdict, str):
            raise Refused(verdict)
        try:
            method = source.parse_undecorated_method(owner, METHOD)
        except source.SourceMismatch as exc:
            raise Refused(str(exc)) from None
        tree = copy.deepcopy(method.tree)
        shape = find_shape(owner, tree)
        if isinstance(shape, str):
            raise Refused(shape)
        return Found(harness, stock, method, tree, shape)

    def build(self, target, found):
        advance_in_skip(found.shape)
        patched = source.build_method(found.method, found.tree, {})
        yield Candidate(
            swaps=(Swap(target.owner, METHOD, patched),), applied=(FIX,), backports=(FIX,)
        )

    def check(self, target, found, candidate):
        problem = verify(found.harness, candidate.swaps[0].new, found.stock)
        return problem and f"checked against the release's own method, {problem}"


PATCH = PrefillResult()
