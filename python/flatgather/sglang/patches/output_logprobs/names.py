"""Where the output-logprob chain lives in the releases, and the names of
its two patches."""

from __future__ import annotations

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

FIELDS = frozenset(
    {
        "next_token_top_logprobs_val",
        "next_token_top_logprobs_idx",
        "next_token_token_ids_logprobs_val",
    }
)
TO_HOST = "__flatgather_rows_to_host__"
TOLIST = "__flatgather_rows_tolist__"
