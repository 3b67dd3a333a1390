"""Batches of the SGLang release on ``sys.path``, built the way the release
builds them: what the bench's sections and the test suite both drive the
release's ``LogitsProcessor`` with.

Nothing is loaded: ``ServerArgs(model_path="dummy")`` is published as the
process's server arguments, ``skip_all_gather=True`` keeps a processor off
``torch.distributed`` (with one rank there is nothing to gather), and the LM
head is a bare weight matrix, which is all the plain matmul path reads.

SGLang is imported on first use, not with this module.
"""

from __future__ import annotations

import dataclasses
import types

import torch


def publish_server_args() -> None:
    """Publish dummy server arguments as the scheduler does, through the
    call every release of the table has: ``set_global_server_args_for_scheduler``
    (from 0.5.17 on a front to ``runtime_context.publish(role="scheduler")``).

    NOTE: no ``SpawnRanks`` (0.5.21 on): the processor reads a rank only
    under DP attention, which these batches never use."""
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))


def new_processor(cls, vocab: int, hidden: int):
    """A ``cls`` (the release's ``LogitsProcessor`` or a subclass) for a
    model of ``vocab`` tokens and ``hidden`` features, on one rank. Server
    arguments must be published first."""
    config = types.SimpleNamespace(vocab_size=vocab, hidden_size=hidden)
    return cls(config, skip_all_gather=True)


def lm_head(weight: torch.Tensor) -> types.SimpleNamespace:
    """An LM head of ``weight`` (``[vocab, hidden]``): all the matmul path reads."""
    return types.SimpleNamespace(weight=weight)


def next_token_ids(extend: list[int], start: list[int], input_ids: torch.Tensor) -> list[int]:
    """The ids whose input logprobs are asked for, as the scheduler lists them."""
    ids = input_ids.tolist()
    out, pt = [], 0
    for e, s in zip(extend, start, strict=True):
        seq = [*ids[pt : pt + e], 0]
        out += seq[s + 1 : e + 1]
        pt += e
    return out


def metadata(extend, start, capture: str = "NULL", mode=None, device=None, **extra):
    """``LogitsMetadata`` of a batch asking for input logprobs (EXTEND, or
    ``mode``), under capture mode ``capture`` (a ``CaptureHiddenMode`` name),
    with the lengths ``from_forward_batch`` fills in; ``extra`` fields on top."""
    from sglang.srt.layers.logits_processor import LogitsMetadata
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    return LogitsMetadata(
        forward_mode=ForwardMode.EXTEND if mode is None else mode,
        capture_hidden_mode=getattr(CaptureHiddenMode, capture),
        extend_return_logprob=True,
        extend_seq_lens=torch.tensor(extend, dtype=torch.int32, device=device),
        extend_seq_lens_cpu=list(extend),
        extend_logprob_start_lens_cpu=list(start),
        extend_logprob_pruned_lens_cpu=[e - s for e, s in zip(extend, start, strict=True)],
        **extra,
    )


def forward_metadata(
    extend, start, capture, input_ids, top_logprobs_nums, token_ids_logprobs, device=None
):
    """:func:`metadata` of a whole forward: each request's top-k
    (``top_logprobs_nums``) and token ids (``token_ids_logprobs``, None where
    it asks for none), and the ids whose input logprobs are asked for."""
    return metadata(
        extend,
        start,
        capture,
        device=device,
        extend_return_top_logprob=any(n > 0 for n in top_logprobs_nums),
        extend_token_ids_logprob=any(t is not None for t in token_ids_logprobs),
        top_logprobs_nums=list(top_logprobs_nums),
        token_ids_logprobs=list(token_ids_logprobs),
        extend_input_logprob_token_ids_gpu=torch.tensor(
            next_token_ids(extend, start, input_ids), dtype=torch.int64, device=device
        ),
    )


def make_states(extend, seed, dtype, hidden, before_norm, aux_kind, layers, pad=0, device=None):
    """``hidden_states``, the before-norm states (or None) and the aux layers
    of a batch: ``aux_kind`` "none" (None), "empty-list", "list" (``layers``
    tensors) or "packed" (one tensor ``layers`` times as wide). ``pad``
    padding rows past the tokens are full of NaN: a read of them shows.
    ``seed``: an int, or a ``torch.Generator`` to draw on."""
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    tokens = sum(extend)

    def tensor(width):
        t = torch.randn(tokens + pad, width, generator=gen)
        t[tokens:] = float("nan")
        return t.to(dtype=dtype, device=device)

    h = tensor(hidden)
    b = tensor(hidden) if before_norm else None
    if aux_kind == "none":
        aux = None
    elif aux_kind == "empty-list":
        aux = []
    elif aux_kind == "list":
        aux = [tensor(hidden) for _ in range(layers)]
    elif aux_kind == "packed":
        aux = tensor(hidden * layers)
    else:
        raise ValueError(f"unknown aux kind {aux_kind!r}")
    return h, b, aux


def make_forward_inputs(
    extend, seed, vocab, dtype, hidden, before_norm, aux_kind, layers, pad=0, device=None
):
    """``input_ids`` (on the host, one per token, below ``vocab``), then
    :func:`make_states`, drawn in that order from one generator."""
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (sum(extend),), generator=gen)
    states = make_states(extend, gen, dtype, hidden, before_norm, aux_kind, layers, pad, device)
    return (input_ids, *states)


def output_fields(output) -> dict:
    """Every field of a ``LogitsProcessorOutput``, by name."""
    return {f.name: getattr(output, f.name) for f in dataclasses.fields(output)}
