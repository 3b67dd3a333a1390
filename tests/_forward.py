"""A CPU-sized ``LogitsProcessor`` of the release under test.

Nothing is loaded: ``ServerArgs(model_path="dummy")`` is published as the
process's server arguments, ``skip_all_gather=True`` keeps the processor off
``torch.distributed`` (with one rank there is nothing to gather), and the LM
head is a bare weight matrix, which is all the plain matmul path reads.
"""

from __future__ import annotations

import dataclasses
import types

import torch
from _sglang import CAPTURE_MODES, RELEASE, ForwardMode, LogitsMetadata, LogitsProcessor


def publish_server_args() -> None:
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy")
    if RELEASE == "0.5.23":
        from sglang.srt.runtime_context import SpawnRanks, publish, reset_context

        reset_context()
        publish(server_args, role="test", ranks=SpawnRanks(world_rank=0))
    else:
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(server_args)


def make_processor(vocab: int, hidden: int, seed: int = 0):
    publish_server_args()
    config = types.SimpleNamespace(vocab_size=vocab, hidden_size=hidden)
    processor = LogitsProcessor(config, skip_all_gather=True)
    gen = torch.Generator().manual_seed(seed)
    lm_head = types.SimpleNamespace(weight=torch.randn(vocab, hidden, generator=gen))
    return processor, lm_head


def forward_metadata(extend, start, capture, input_ids, top_logprobs_nums, token_ids_logprobs):
    """EXTEND metadata with input logprobs, as ``from_forward_batch`` builds it."""
    next_ids, pt = [], 0
    for e, s in zip(extend, start, strict=True):
        seq = [*input_ids[pt : pt + e].tolist(), 0]
        next_ids += seq[s + 1 : e + 1]
        pt += e
    return LogitsMetadata(
        forward_mode=ForwardMode.EXTEND,
        capture_hidden_mode=CAPTURE_MODES[capture],
        extend_return_logprob=True,
        extend_return_top_logprob=any(n > 0 for n in top_logprobs_nums),
        extend_token_ids_logprob=any(t is not None for t in token_ids_logprobs),
        extend_seq_lens=torch.tensor(extend, dtype=torch.int32),
        extend_seq_lens_cpu=list(extend),
        extend_logprob_start_lens_cpu=list(start),
        extend_logprob_pruned_lens_cpu=[e - s for e, s in zip(extend, start, strict=True)],
        top_logprobs_nums=list(top_logprobs_nums),
        token_ids_logprobs=list(token_ids_logprobs),
        extend_input_logprob_token_ids_gpu=torch.tensor(next_ids, dtype=torch.int64),
    )


def output_fields(output) -> dict:
    return {f.name: getattr(output, f.name) for f in dataclasses.fields(output)}
