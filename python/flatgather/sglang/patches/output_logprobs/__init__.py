"""The output logprobs of decode and speculative verify steps, handed from
the device to the scheduler flat (what runs:
:mod:`~flatgather.sglang.patches.output_logprobs.runtime`), where the
running release keeps them, and the proof, before anything is patched, that
flatgather's chain gives exactly the release's answer.

Two patches, each prepared when its module is imported:

* **producers** (:class:`Producers`, :data:`PRODUCER`): ``get_top_logprobs`` and
  ``get_token_ids_logprobs`` are replaced in the module globals where their
  callers look them up (``logprob_processor`` from 0.5.16 on,
  ``layers/utils/logprob`` and ``sampler`` before, and 0.5.10's
  ``eagle_worker_v2``, whose spec logprobs are a method). Each replacement
  and the release's own function run side by side on small CPU batches (top
  numbers 0, 1 and 20 mixed, all equal, one row, padding rows past the
  lists, a number past the vocabulary; id lists None, empty, ragged and
  negative, all None, an id outside the vocabulary; float32 and bfloat16),
  and everything is compared: what each returns or raises, types, dtypes,
  shapes, strides, bytes, the id lists themselves, and what the rest of the
  chain (a host copy and ``.tolist()`` per row) makes of it. The two ways
  the releases fill a row without ids (an empty list up to 0.5.20, an empty
  tensor since) are both tried; the one that matches is used.
* **the chain** (:class:`Chain`, :data:`CHAIN`): ``GenerationBatchResult.copy_to_cpu``
  and the scheduler methods that call ``.tolist()`` per row are rebuilt from
  the release's own source, proven to be the running code
  (:func:`flatgather.sglang.source.parse_method`), with only the per-row
  comprehensions over the three logprob lists replaced, each by a call that
  takes the release's own element expression as a lambda. The rebuilt tree,
  with each call turned back into the comprehension its own list, lambda and
  kind make, must be the release's tree; each element
  expression, compiled on its own in the release's globals, is then run
  through flatgather's helper and through the release's comprehension on the
  lists both producers make, and the results (and the next stage's
  ``.tolist()`` of them) compared. A comprehension over those lists of any
  other shape leaves the method stock, with a note.

  The host copy of ``copy_to_cpu`` is checked before that, by what it is:
  on a CPU every release's copy returns its input (or a plain copy), so the
  comparison never reaches the branch a server runs (a pinned host tensor,
  the copy, ``record_stream``). It must be ``v.to("cpu", non_blocking=True)``
  (up to 0.5.14) or a call of a helper whose fingerprint
  (:func:`flatgather.sglang.shapes.fingerprint`: its proven source and what
  its globals are bound to) is one of :data:`COPY_HELPERS`, the releases'
  ``_async_d2h`` / ``async_d2h``; any other one-argument call leaves the
  method stock, with a note. ``tests/test_spec_logprobs.py`` compares the
  pinned branch itself where a CUDA device is present.

The room
--------
Both patches are here, with their names. What runs in a patched release is
:mod:`~flatgather.sglang.patches.output_logprobs.runtime`; the producers'
check is :mod:`~flatgather.sglang.patches.output_logprobs.producers`, the
chain's :mod:`~flatgather.sglang.patches.output_logprobs.consumers`, and the
rewrite of the chain's loops
:mod:`~flatgather.sglang.patches.output_logprobs.loops`. The names of the
rewrite itself (:data:`FIELDS`, the helper names :data:`TO_HOST` and
:data:`TOLIST`) are defined in ``loops`` and read here: the rewrite and the
chain's check use them, and this module imports both (defined here, they
would make an import cycle).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable

from flatgather.sglang import shapes, source
from flatgather.sglang.check import Answered
from flatgather.sglang.patches.output_logprobs import consumers as chain_check
from flatgather.sglang.patches.output_logprobs import runtime as flat_logprobs
from flatgather.sglang.patches.output_logprobs.consumers import (
    COPY_HELPERS,
    methods_with_loops,
    unknown_copy,
)
from flatgather.sglang.patches.output_logprobs.loops import (
    FIELDS,
    TO_HOST,
    TOLIST,
    Rewrite,
    rewrite,
)
from flatgather.sglang.patches.output_logprobs.producers import difference, verify_producer
from flatgather.sglang.patching import (
    Candidate,
    Known,
    Option,
    Patch,
    Rebind,
    Refused,
    Service,
    Swap,
    Target,
    Unneeded,
    known_code,
    release_function,
    verified_once,
)

__all__ = [
    "CHAIN",
    "CONSUMERS",
    "CONSUMER_CLASSES",
    "COPY_HELPERS",
    "FIELDS",
    "PRODUCER",
    "PRODUCERS",
    "PRODUCER_MODULES",
    "TOLIST",
    "TO_HOST",
    "Chain",
    "Producers",
    "Rewrite",
    "difference",
    "methods_with_loops",
    "producer",
    "rewrite",
    "unknown_copy",
]

PRODUCER_MODULES = (
    "sglang.srt.layers.logprob_processor",
    "sglang.srt.layers.utils.logprob",
    "sglang.srt.layers.sampler",
    "sglang.srt.speculative.eagle_worker_v2",
)
"""Modules whose code calls the two functions through its own globals."""

CONSUMER_CLASSES = {
    "sglang.srt.managers.utils": "GenerationBatchResult",
    "sglang.srt.managers.scheduler_components.batch_result_processor": (
        "SchedulerBatchResultProcessor"
    ),
    "sglang.srt.managers.scheduler_output_processor_mixin": "SchedulerOutputProcessorMixin",
}
"""The classes whose methods copy the logprob lists row by row (0.5.13 on,
the scheduler's part is ``SchedulerBatchResultProcessor``; before, the
mixin, inline in ``process_batch_result_decode`` and ``_prefill``)."""

PRODUCERS = "output-logprobs"
CONSUMERS = "output-logprobs-chain"
"""The names of the two patches in the install report."""


class Registry(Service):
    """The flat lists the producers hand on, registered for the chain
    (:mod:`~flatgather.sglang.patches.output_logprobs.runtime`): once
    the producers are reverted, lists registered before are read by the
    release's own loops, and are dropped."""

    def reverted(self):
        flat_logprobs.clear()


REGISTRY = Registry()

OPTION = {
    "output_logprobs": Option(
        "hand the output logprobs of decode and verify steps from the device to the scheduler flat"
    )
}
"""The ``install()`` keyword of the output logprobs' two patches."""

DEFINED_IN = (
    "sglang.srt.layers.logprob_processor",
    "sglang.srt.layers.utils.logprob",
    "sglang.srt.layers.logits_processor",
)
"""Where a release defines the producers (their fingerprints are read there)."""


class Producers(Patch[types.FunctionType, tuple[Callable, Answered]]):
    """``get_top_logprobs`` and ``get_token_ids_logprobs`` in the globals of
    each module of :data:`PRODUCER_MODULES` that calls them, each verified
    on its own."""

    name = PRODUCERS
    modules = PRODUCER_MODULES
    what = "the output logprobs"
    options = OPTION
    known = (
        Known(flat_logprobs.TOP, DEFINED_IN, flat_logprobs.TOP),
        Known(flat_logprobs.TOKEN_IDS, DEFINED_IN, flat_logprobs.TOKEN_IDS),
    )

    def locate(self, module):
        targets = []
        for name in (flat_logprobs.TOP, flat_logprobs.TOKEN_IDS):
            if release_function(module, name) is not None:
                targets.append(Target(module, name, module))
        return targets

    def prove(self, target):
        # Replaced whole, behind its check: what it is, :meth:`vouch` says.
        # Under flatgather's replacement where the module imported the name
        # from one flatgather had patched (0.5.10's worker, the sampler,
        # imported after install()): the release's own is checked, and
        # restored by uninstall() (:class:`~flatgather.sglang.patching.Rebind`).
        return release_function(target.owner, target.name)

    def build(self, target, original):
        """One candidate per walk: the one checked counts its answers; the
        one that goes into service counts nothing."""
        if target.name == flat_logprobs.TOP:
            ways = [(flat_logprobs.make_top_logprobs, ())]
        else:
            ways = [(flat_logprobs.make_token_ids_logprobs, (walk,)) for walk in (True, False)]
        for make, args in ways:
            answers = Answered()
            yield Candidate(
                swaps=(Swap(target.owner, target.name, make(original, *args)),),
                applied=(PRODUCERS,),
                detail=(make(original, *args, on_answer=answers), answers),
            )

    def check(self, target, original, candidate):
        counted, answers = candidate.detail
        return verify_producer(original, counted, answers, target.name)

    def pick(self, target, original):
        """Once per release function in an installation, whichever module
        holds it (the same function sits in several modules' globals): the
        replacement verified, or why there is none, is remembered for that
        installation alone (:meth:`~flatgather.sglang.patching.Patch.memo`),
        so the next one judges the code it finds."""
        found = verified_once(self, target, original, original)
        swap = Rebind(target.owner, target.name, found, release=original)
        return Candidate(swaps=(swap,), applied=(PRODUCERS,), service=REGISTRY)

    def vouch(self, target, original):
        known_code(target.name, None, original)
        return ()


PRODUCER = Producers()
"""The producers' patch."""


def producer(
    original: Callable, name: str, memo: dict | None = None
) -> tuple[Callable | None, str | None]:
    """flatgather's replacement of the release's ``original`` (``name``),
    verified against it, or None and the first difference; with ``memo`` (an
    installation's, :meth:`~flatgather.sglang.patching.Patch.memo`) the
    verdict the producers' patch reached in it, or reached now and kept
    there."""
    patch = Producers().configure({}, memo)
    try:
        return patch.pick(Target(None, name), original).swaps[0].new, None
    except Refused as exc:
        return None, str(exc)


class Chain(Patch[tuple[source.Build, Rewrite], None]):
    """The methods of each class of :data:`CONSUMER_CLASSES` that copy the
    logprob lists row by row, rebuilt with those comprehensions replaced,
    each method verified on its own. Its answer is told apart by the flat
    path its helpers take (:attr:`~flatgather.sglang.patching.Patch.answers`)."""

    name = CONSUMERS
    modules = tuple(CONSUMER_CLASSES)
    what = "the logprob chain"
    options = OPTION
    answers = "flat-path"
    known = (
        Known(shapes.COPY_HELPER, ("sglang.srt.managers.utils",), "_async_d2h", imported=True),
    )

    def locate(self, module):
        owner = getattr(module, CONSUMER_CLASSES.get(module.__name__, ""), None)
        if not isinstance(owner, type):
            return []
        return [Target(owner, name, module) for name in methods_with_loops(owner)]

    def prove(self, target):
        """The method's source, proven, and its comprehensions over the
        logprob lists, found (none: :class:`Unneeded`)."""
        try:
            build = source.to_rewrite(target.owner, target.name, decorated=True)
        except source.SourceMismatch as exc:
            raise Refused(str(exc)) from None
        code = build.method.function.__code__
        if {TO_HOST, TOLIST} & {*code.co_names, *code.co_varnames, *build.closure}:
            raise Refused("it uses flatgather's names")
        result = rewrite(build.tree)
        if result is None:
            raise Unneeded
        if isinstance(result, str):
            raise Refused(result)
        return build, result

    def build(self, target, proof):
        build, result = proof
        method = build.method
        built = source.build_method(method, result.tree, {**build.closure, **chain_check.HELPERS})
        built.__flatgather__ = CONSUMERS
        # The attribute as shipped (a decorated method's wrapper, not the
        # function under it): what the bench and the tests call as stock.
        shipped = vars(target.owner)[target.name]
        if hasattr(shipped, "__flatgather_build__"):
            # Over another fix, which takes undecorated methods only.
            shipped = method.function
        built.__flatgather_original__ = shipped
        yield Candidate(swaps=(Swap(target.owner, target.name, built),), applied=(CONSUMERS,))

    def check(self, target, proof, candidate):
        """The host copy by what it is, then each comprehension by what it
        gives."""
        build, result = proof
        problem = unknown_copy(build.method, result, build.closure)
        if problem:
            return problem
        problem = chain_check.verify_chain(
            build.method, result, functools.partial(producer, memo=self.memo())
        )
        return problem and f"checked against the release's loop, {problem}"


CHAIN = Chain()
"""The chain's patch."""
