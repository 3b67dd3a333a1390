"""The output logprobs of decode and speculative verify steps, handed from
the device to the scheduler flat (what runs:
:mod:`~flatgather.sglang.patches.output_logprobs.runtime`), where the
running release keeps them, and the proof, before anything is patched, that
flatgather's chain gives exactly the release's answer.

Two patches, each prepared when its module is imported:

* **producers** (:class:`~.producers.Producers`): ``get_top_logprobs`` and
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
* **the chain** (:class:`~.consumers.Chain`): ``GenerationBatchResult.copy_to_cpu``
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
"""

from __future__ import annotations

from flatgather.sglang.patches.output_logprobs.consumers import (
    COPY_HELPERS,
    Chain,
    methods_with_loops,
    unknown_copy,
)
from flatgather.sglang.patches.output_logprobs.consumers import PATCH as CHAIN
from flatgather.sglang.patches.output_logprobs.loops import Rewrite, rewrite
from flatgather.sglang.patches.output_logprobs.names import (
    CONSUMER_CLASSES,
    CONSUMERS,
    FIELDS,
    PRODUCER_MODULES,
    PRODUCERS,
    TO_HOST,
    TOLIST,
)
from flatgather.sglang.patches.output_logprobs.producers import PATCH as PRODUCER
from flatgather.sglang.patches.output_logprobs.producers import (
    Producers,
    difference,
    producer,
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
