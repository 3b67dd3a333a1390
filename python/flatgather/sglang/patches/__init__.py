"""The places of SGLang flatgather patches, one room each, every one a
:class:`flatgather.sglang.patching.Patch`; the installer walks
:func:`patches` in order and knows none of them by name.

- :mod:`~flatgather.sglang.patches.pruned_states`: ``LogitsProcessor._get_pruned_states``
  (and lazy aux pruning); its refusal refuses the release;
- :mod:`~flatgather.sglang.patches.input_logprobs`: the token-id input logprobs;
- :mod:`~flatgather.sglang.patches.draft_prefill`: the V2 draft worker's prefill;
- :mod:`~flatgather.sglang.patches.prefill_result`: the scheduler's prefill results
  (SGLang issue #36938);
- :mod:`~flatgather.sglang.patches.output_logprobs`: the output logprobs' producers and
  the chain that hands them to the scheduler;
- :mod:`~flatgather.sglang.patches.front_end`: the logprobs' token texts in the
  process that answers the client;
- :mod:`~flatgather.sglang.patches.openai_logprobs`: the OpenAI ``logprobs``
  object, in the same process.

A new patch is a new room and a line here.
"""

from __future__ import annotations

from flatgather.sglang.patching import Patch

__all__ = ["patches"]


def patches() -> tuple[Patch, ...]:
    """Every patch, in install order (imported on first call: each room
    imports torch)."""
    from flatgather.sglang.patches import (
        draft_prefill,
        front_end,
        input_logprobs,
        openai_logprobs,
        output_logprobs,
        prefill_result,
        pruned_states,
    )

    return (
        pruned_states.PATCH,
        input_logprobs.PATCH,
        draft_prefill.PATCH,
        prefill_result.PATCH,
        output_logprobs.PRODUCER,
        output_logprobs.CHAIN,
        front_end.PATCH,
        openai_logprobs.PATCH,
    )
