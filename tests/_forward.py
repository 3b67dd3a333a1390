"""A CPU-sized ``LogitsProcessor`` of the release under test, and batches
built the way the release builds them (the builders the bench shares live
in :mod:`flatgather.bench.batches`)."""

from __future__ import annotations

import dataclasses

import torch
from _sglang import (
    CAPTURE_MODES,
    PRUNES_AUX,
    ForwardMode,
    LogitsProcessor,
    StockLogitsProcessor,
    expected_pruned_states,
    hidden_to_store,
    oracle_context,
)
from flatgather.bench.batches import (
    lm_head,
    metadata,
    new_processor,
    next_token_ids,
    output_fields,
    publish_server_args,
)


def make_processor(vocab: int, hidden: int, seed: int = 0, stock: bool = False, cls=None):
    """A processor (of ``cls``, a subclass, when given) and its LM head;
    ``stock=True`` gives one that runs the release's own code even while
    flatgather is installed."""
    publish_server_args()
    cls = cls or (StockLogitsProcessor if stock else LogitsProcessor)
    gen = torch.Generator().manual_seed(seed)
    return new_processor(cls, vocab, hidden), lm_head(torch.randn(vocab, hidden, generator=gen))


class _ModelRunner:
    """What ``ForwardBatch._pad_inputs_to_size`` reads of its model runner."""

    class attn_backend:
        @staticmethod
        def get_cuda_graph_seq_len_fill_value():
            return 1

        @staticmethod
        def get_cpu_graph_seq_len_fill_value():
            return 1


def padded_forward_batch(extend, start, capture, input_ids, top, token_ids, padded_tokens):
    """A real ``ForwardBatch`` of the release, EXTEND with input logprobs,
    padded to ``padded_tokens`` by the release's own ``_pad_inputs_to_size``
    (as DP attention and attention-TP scatter pad it): the token tensors grow,
    ``extend_seq_lens_cpu`` does not."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    bs, tokens = len(extend), sum(extend)
    fields = {f.name for f in dataclasses.fields(ForwardBatch)}
    values = dict(
        forward_mode=ForwardMode.EXTEND,
        batch_size=bs,
        input_ids=input_ids.clone(),
        req_pool_indices=torch.arange(bs),
        seq_lens=torch.tensor(extend),
        seq_lens_cpu=torch.tensor(extend),
        out_cache_loc=torch.arange(tokens),
        seq_lens_sum=tokens,
        positions=torch.cat([torch.arange(e) for e in extend]),
        return_logprob=True,
        extend_num_tokens=tokens,
        extend_seq_lens=torch.tensor(extend, dtype=torch.int32),
        extend_prefix_lens=torch.zeros(bs, dtype=torch.int32),
        extend_seq_lens_cpu=list(extend),
        extend_prefix_lens_cpu=[0] * bs,
        extend_logprob_start_lens_cpu=list(start),
        top_logprobs_nums=list(top),
        token_ids_logprobs=list(token_ids),
        extend_input_logprob_token_ids_gpu=torch.tensor(
            next_token_ids(extend, start, input_ids), dtype=torch.int64
        ),
        capture_hidden_mode=CAPTURE_MODES[capture],
        lora_ids=[None] * bs,
    )
    batch = ForwardBatch(**{k: v for k, v in values.items() if k in fields})
    with oracle_context():
        batch._pad_inputs_to_size(_ModelRunner, padded_tokens, bs)
    return batch


def release_outputs(run, extend, start, capture, hidden, before_norm, aux) -> dict:
    """The release's own outputs of a forward; ``run(capture)`` runs the
    release's ``forward`` on the batch under that capture mode.

    Where the release crashes (LAST capture with list aux layers before
    SGLang PR #21589: ``torch.cat(None)``), still the release's own code: its
    run under NULL capture for everything but the stored hidden states, and
    for those its own ``_get_hidden_states_to_store`` (LAST) of its own
    pruning of each aux layer as if it were ``hidden_states``."""
    try:
        return output_fields(run(capture))
    except TypeError:
        if PRUNES_AUX or capture != "LAST" or not isinstance(aux, list):
            raise
    outputs = output_fields(run("NULL"))
    assert outputs["hidden_states"] is None
    pruned = expected_pruned_states(
        extend, start, hidden, before_norm, aux, metadata(extend, start)
    )
    stored_md = metadata(extend, start, "LAST")
    outputs["hidden_states"] = hidden_to_store(hidden, before_norm, aux, pruned, stored_md)
    return outputs


def pruning_gate():
    """Lazy aux pruning's gate of the installation in place (None where lazy
    aux pruning is off)."""
    from flatgather.sglang import installer
    from flatgather.sglang.patches.pruned_states import Pruning

    (pruning,) = [s for s in installer.in_service() if isinstance(s, Pruning)]
    return pruning.gate
