"""The names of what the #36938 patch patches, shared by its parts."""

from __future__ import annotations

MODULES = (
    "sglang.srt.managers.scheduler_output_processor_mixin",  # 0.5.10 to 0.5.12
    "sglang.srt.managers.scheduler_components.batch_result_processor",  # 0.5.13 on
)
METHOD = "process_batch_result_prefill"
FIX = "prefill-skip-logprob-pt"
"""The skip branch advances the input-logprob cursor (SGLang issue #36938)."""

LOGITS_PROCESSOR = "sglang.srt.layers.logits_processor"
COUNT = "calculate_num_input_logprobs"
"""The release's count of a request's input logprobs: the cursor's step."""
