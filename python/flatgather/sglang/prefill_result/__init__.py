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
As :mod:`flatgather.sglang.draft_prefill` does, :func:`prepare` rewrites the
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
"""

from __future__ import annotations

import copy
import importlib
import types

from flatgather.sglang import source
from flatgather.sglang.patching import Patch, Prepared, never_raises
from flatgather.sglang.prefill_result.harness import (
    Harness,
    Raised,
    Request,
    _Record,
    compare_without_skipped,
    skip_advances,
)
from flatgather.sglang.prefill_result.match import _find_shape
from flatgather.sglang.prefill_result.names import FIX, METHOD, MODULES
from flatgather.sglang.prefill_result.rewrite import _rewrite

__all__ = [
    "FIX",
    "METHOD",
    "MODULES",
    "Harness",
    "Raised",
    "Request",
    "_Record",
    "compare_without_skipped",
    "owner_of",
    "prepare",
    "release_module",
    "skip_advances",
]

_r = Request

# --- the check and prepare --------------------------------------------------------------------


# (requests, batch.return_logprob): every request that is not skipped must
# get what the release's method gives it without the skipped ones.
_CASES: tuple[tuple[tuple[Request, ...], bool], ...] = (
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


def _verify(harness: Harness, ours, stock) -> str | None:
    for specs, return_logprob in _CASES:
        problem = compare_without_skipped(harness, ours, stock, specs, return_logprob)
        if problem:
            return problem
    return None


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


@never_raises(lambda module: f"{module.__name__}.{METHOD}")
def prepare(module) -> Prepared:
    """The patch of ``module``'s ``process_batch_result_prefill`` (the mixin's
    or the batch result processor's): its skip branch advances the input
    logprob cursor, verified against the release's own method; nothing where
    the release already advances it. Never raises: whatever cannot be done
    is a note, and the method stays as shipped."""
    return _prepare(module)


def _prepare(module) -> Prepared:
    owner = owner_of(module)
    if isinstance(owner, str):
        return Prepared.refused(owner)
    where = f"{owner.__name__}.{METHOD}"
    stock = vars(owner)[METHOD]
    if not isinstance(stock, types.FunctionType):
        return Prepared.refused(f"{where} left stock: it is not a plain function")
    harness = Harness(owner, module)
    verdict = skip_advances(harness, stock)
    if verdict is True:
        return Prepared()  # the release advances the cursor itself: left as shipped
    if isinstance(verdict, str):
        return Prepared.refused(f"{where} left stock: {verdict}")
    try:
        method = source.parse_undecorated_method(owner, METHOD)
    except source.SourceMismatch as exc:
        return Prepared.refused(f"{where} left stock (SGLang issue #36938 unfixed): {exc}")
    tree = copy.deepcopy(method.tree)
    shape = _find_shape(owner, tree)
    if isinstance(shape, str):
        return Prepared.refused(f"{where} left stock (SGLang issue #36938 unfixed): {shape}")
    _rewrite(shape)
    patched = source.build_method(method, tree, {})
    problem = _verify(harness, patched, stock)
    if problem:
        return Prepared.refused(
            f"{where} left stock (SGLang issue #36938 unfixed): checked against the "
            f"release's own method, {problem}"
        )
    return Prepared(patches=[Patch(owner, METHOD, patched)], applied=(FIX,), backports=(FIX,))
