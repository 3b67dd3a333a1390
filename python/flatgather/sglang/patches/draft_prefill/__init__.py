"""The V2 draft worker's prefill: ``EagleDraftWorker._draft_extend_for_prefill``
with its per-request rotation loop replaced by one plan and one gather.

Before the draft model's prefill forward, the method shifts each request's
``input_ids`` left by one and appends the request's tail token (the token the
target sampled or, for a chunk of a chunked prefill, the next prompt token),
one request at a time: a slice, a ``torch.cat`` and a copy per request, two
kernel launches each on a GPU. Since 0.5.20 it rotates ``mm_input_embeds``
the same way. flatgather builds the whole rotation index in Rust
(:class:`flatgather._core.RotationPlan`), stages it with one host-to-device
copy and gathers with one ``index_select`` over ``cat(input_ids, tails)``
(and one over ``mm_input_embeds``), whatever the batch size.

How the method is changed, and why this way
-------------------------------------------
The loop sits in the middle of a long method whose other lines differ from
release to release (spec-info classes, capture modes, KV-slot plans, canary
contexts, DSA seeding, ...). Copying the method into flatgather would freeze
one release's version of all of them. Instead :class:`DraftPrefill` rewrites the
installed function's own syntax tree:

1. :func:`flatgather.sglang.source.parse_method` reads the method's source and
   proves that it compiles to the very code object that runs.
2. A small structural matcher (:mod:`~flatgather.sglang.patches.draft_prefill.match`) finds
   the rotation loop, in whichever of the shapes the releases use (in place
   into ``batch.input_ids``; into a new tensor the release allocated; with
   or without the ``mm_input_embeds`` rotation), binding each placeholder
   (the lengths, the source, the destination, the tails, the loop's names)
   consistently. Any other shape, or a loop whose own names are read
   elsewhere in the method, leaves the rotation stock, with a note saying
   why.
3. Only that ``for`` statement is replaced
   (:mod:`~flatgather.sglang.patches.draft_prefill.rewrite`)::

       lens = LENS
       end = flatgather_rotate(src=SRC, ..., lens=lens, pt=pt) if flatgather_takes(lens) else None
       if end is None:
           <the release's for statement, iterating ``lens``>
       else:
           pt = end

   The lengths are evaluated once, as the release's ``for`` evaluates them;
   the source, tails and destinations only where the release's loop would
   iterate at least once (:func:`~flatgather.sglang.patches.draft_prefill.runtime.takes`: two
   requests or more), in the order its first iteration evaluates them.

   :func:`~flatgather.sglang.patches.draft_prefill.runtime.rotate` takes only inputs it
   reproduces exactly (positive lengths that sum to the rows of
   ``input_ids``, one tail per request, one device, and so on); for anything
   else it returns None before touching a tensor and the release's own loop
   runs; so it does under ``torch.compile`` and while a CUDA stream is
   capturing a graph. Every other line of the method, the tail tokens of
   ``_eagle_prefill_tail_tokens`` included, runs as shipped, with the
   release's line numbers in tracebacks.
4. Before anything is patched (:mod:`~flatgather.sglang.patches.draft_prefill.check`), the
   release's block (the statements of the method up to the one holding the
   loop) and the rewritten block are compiled on their own and run side by
   side on small CPU batches (one request, lengths of one, several
   requests, a chunked request, padding and zero lengths that must fall
   back, an idle batch, with and without ``mm_input_embeds``). A difference
   in the ids, in the ``mm_input_embeds`` rows the release defines, or in
   which tensor object ends up where (in place or new) leaves the rotation
   stock, with a note naming it; so does a case where the gather should
   apply and does not. It costs a few milliseconds.

The same rewrite carries the second fix of SGLang PR #21589 to releases that
lack it (0.5.10): when no ``<fb>.return_logprob = False`` follows
``<fb> = ForwardBatch.init_new(...)``, that statement is inserted right after
it, so the draft forward does not compute logprobs the target batch asked
for. Either change can be refused on its own; both go into one rebuilt
function, one :class:`~flatgather.sglang.patching.Swap`.

Where each part lives
---------------------
- this module: the names of what is patched, and :class:`DraftPrefill`,
  the patch, whose steps (:class:`~flatgather.sglang.patching.Patch`) are
  the ones above;
- :mod:`~flatgather.sglang.patches.draft_prefill.runtime`: what runs in the server on each
  prefill step (``rotate`` and ``takes``), the only part the patched method
  calls;
- :mod:`~flatgather.sglang.patches.draft_prefill.match`: the matcher (step 2);
- :mod:`~flatgather.sglang.patches.draft_prefill.rewrite`: the new syntax tree (step 3 and
  the backport);
- :mod:`~flatgather.sglang.patches.draft_prefill.check`: the check against the release's
  own block (step 4);
- :func:`flatgather.sglang.source.parse_method` and
  :func:`~flatgather.sglang.source.build_method`: reading the release's
  method and compiling the rewritten one (step 1, and the patch).
"""

from __future__ import annotations

import copy

from flatgather.sglang import source
from flatgather.sglang.patches.draft_prefill import check as draft_check
from flatgather.sglang.patches.draft_prefill import match as draft_match
from flatgather.sglang.patches.draft_prefill import rewrite as draft_rewrite
from flatgather.sglang.patches.draft_prefill.runtime import rotate, takes
from flatgather.sglang.patching import Candidate, Patch, Refused, Swap, Target

__all__ = [
    "BACKPORT",
    "METHOD",
    "MODULE",
    "OWNER",
    "PATCH",
    "ROTATION",
    "WHERE",
    "DraftPrefill",
    "rotate",
    "takes",
]

MODULE = "sglang.srt.speculative.eagle_worker_v2"
"""The module of the V2 draft worker; the patch is prepared when it is imported."""
OWNER = "EagleDraftWorker"
METHOD = "_draft_extend_for_prefill"
WHERE = f"{OWNER}.{METHOD}"

ROTATION = "draft-prefill-rotation"
"""The per-request loop replaced by one plan and one gather."""
BACKPORT = "draft-prefill-no-logprob"
"""SGLang PR #21589's second fix: the draft forward without logprobs."""


class DraftPrefill(Patch[source.Method, draft_check.Rewritten]):
    """``EagleDraftWorker._draft_extend_for_prefill``: the rotation gather
    and, where the method lacks it, the ``return_logprob`` backport, each
    verified or refused on its own."""

    name = ROTATION
    modules = (MODULE,)
    answers = "flat-path"  # the rotation's gather, or the release's loop where it declines

    def locate(self, module):
        owner = getattr(module, OWNER, None)
        if not isinstance(owner, type):
            raise Refused(f"{MODULE} has no class {OWNER}: nothing patched there")
        return [Target(owner, METHOD)]

    def prove(self, target):
        try:
            return source.parse_undecorated_method(target.owner, METHOD)
        except source.SourceMismatch as exc:
            raise Refused(str(exc)) from None

    def build(self, target, method):
        """The rotation gather with the backport, then the backport alone."""
        notes = []
        names = draft_rewrite.Names.fresh(method)
        tree = copy.deepcopy(method.tree)
        loop = draft_match.find_loop(method, tree)
        if isinstance(loop, str):
            notes.append(f"{WHERE}: the rotation loop left stock: {loop}")
        else:
            k = draft_match.top_index(tree, loop.node)
            branch = draft_rewrite.replace_loop(tree, loop, names)
            gather = {names.rotate: rotate, names.takes: takes}
            # The check compares the release's block with the rewritten one
            # up to the gather, the backport in it where it comes before.
            yield self._candidate(
                method,
                tree,
                gather,
                [ROTATION],
                gives_up="the rotation loop left stock",
                detail=draft_check.Rewritten(loop, tree, k, branch, names, gather),
            )
        yield self._candidate(method, copy.deepcopy(method.tree), {}, [], notes=notes)

    @staticmethod
    def _candidate(method, tree, closure, applied, notes=(), **more) -> Candidate:
        notes = list(notes)
        backport = draft_rewrite.add_no_logprob(tree)
        if isinstance(backport, str):
            notes.append(f"{WHERE}: the return_logprob backport not applied: {backport}")
        elif backport:
            applied.append(BACKPORT)
        if not applied:
            return Candidate(notes=tuple(notes))
        function = source.build_method(method, tree, closure)
        return Candidate(
            swaps=(Swap(method.owner, METHOD, function),),
            applied=tuple(applied),
            backports=(BACKPORT,) if BACKPORT in applied else (),
            notes=tuple(notes),
            **more,
        )

    def check(self, target, method, candidate):
        if candidate.detail is None:
            return None  # the backport alone: the release's lines and one assignment
        problem = draft_check.verify(method, candidate.detail)
        return problem and f"checked against the release's own loop, {problem}"


PATCH = DraftPrefill()
