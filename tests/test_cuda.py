"""Checks that need a CUDA device (skipped without one; ``.ci/gpu`` runs
them): the pinned staging buffers under reuse, padded logprob batches
through the patched ``forward`` on the GPU, and the output-logprob chain of
verify steps with its host copies lagging behind a busy stream."""

from __future__ import annotations

import random

import flatgather
import flatgather.sglang
import flatgather.testing
import numpy as np
import pytest
import torch
from _forward import make_processor
from _sglang import assert_same, pruned_states
from flatgather._staging import stage
from flatgather.bench.batches import (
    forward_metadata,
    make_forward_inputs,
    make_states,
    metadata,
    output_fields,
)

pytestmark = pytest.mark.cuda


def test_staging_reuse_under_a_busy_stream():
    """Many back-to-back plans staged on a side stream while the GPU is kept
    busy, so that copies lag far behind the host: a host buffer rewritten
    before its copy ran would show as a wrong index."""
    device = torch.device("cuda")
    rng = random.Random(0)
    big = torch.randn(4096, 4096, device=device)
    side = torch.cuda.Stream()
    staged, expected = [], []
    with torch.cuda.stream(side):
        for i in range(400):
            if i % 20 == 0:
                big = big @ big  # keep the stream busy
                big /= big.norm()
            n = rng.randrange(1, 64)
            extend = [rng.randrange(1, 40) for _ in range(n)]
            start = [rng.randrange(0, e + 1) for e in extend]
            plan = flatgather._core.PrunePlan(extend, start)
            size = plan.buffer_len(False)
            staged.append(stage(size, lambda out, p=plan: p.fill(out, token_to_seq=False), device))
            host = np.empty(size, dtype=np.int64)
            plan.fill(host, token_to_seq=False)
            expected.append(host)
    torch.cuda.synchronize()
    for got, want in zip(staged, expected, strict=True):
        assert np.array_equal(got.cpu().numpy(), want)


@pytest.mark.parametrize("aux_kind", ["none", "list"])
@pytest.mark.parametrize("capture", ["NULL", "LAST", "FULL"])
def test_padded_pruned_states_on_cuda(aux_kind, capture):
    extend, start = [4, 5, 6, 1, 9], [0, 5, 3, 0, 9]
    h, b, aux = make_states(extend, 0, torch.bfloat16, 16, True, aux_kind, 3, pad=11)
    to = lambda t: None if t is None else t.cuda()  # noqa: E731
    h, b = to(h), to(b)
    aux = None if aux is None else [to(x) for x in aux]
    md = metadata(extend, start, capture)
    md.extend_seq_lens = md.extend_seq_lens.cuda()
    expected = pruned_states(h, b, aux, md)
    flatgather.sglang.install()
    actual = pruned_states(h, b, aux, metadata(extend, start, capture))
    torch.cuda.synchronize()
    assert_same(actual[:5], expected[:5])
    assert actual[5] == expected[5]


@pytest.mark.parametrize("capture", ["NULL", "LAST", "FULL"])
def test_padded_forward_on_cuda_equals_stock(capture):
    processor, lm_head = make_processor(64, 16)
    lm_head.weight = lm_head.weight.cuda()
    extend, start = [4, 5, 6], [0, 5, 3]
    input_ids, hidden, _, layers = make_forward_inputs(
        extend, 1, 64, torch.float32, 16, False, "list", 3, pad=17
    )

    def run():
        md = forward_metadata(extend, start, capture, input_ids, [1, 0, 2], [None] * 3)
        md.extend_seq_lens = md.extend_seq_lens.cuda()
        md.extend_input_logprob_token_ids_gpu = md.extend_input_logprob_token_ids_gpu.cuda()
        out = processor.forward(
            input_ids.cuda(),
            hidden.cuda(),
            lm_head,
            md,
            aux_hidden_states=[x.cuda() for x in layers],
        )
        torch.cuda.synchronize()
        return output_fields(out)

    expected = run()
    flatgather.sglang.install()
    actual = run()
    assert_same(actual, expected)
    assert not actual["input_token_logprobs"].isnan().any()


def _spec_step_on_cuda(chain, step, stock: bool, side, busy):
    """One verify step's output-logprob chain with the stages where the
    scheduler runs them: stages 1 and 2 on a side stream kept busy (so the
    device-to-host copies lag far behind the host), stage 3 on the host
    after the copy's event."""
    from flatgather.bench import spec_chain as sc

    lo = sc._logits_output(step)
    with torch.cuda.stream(side):
        busy @ busy
        if stock:
            with flatgather.testing.module_functions_as_shipped():
                sc._stage1(chain, step, lo)
        else:
            sc._stage1(chain, step, lo)
        result = chain.result_cls(logits_output=lo, next_token_ids=step.predict)
        result.copy_done = torch.cuda.Event()
        copy = chain.stock["copy_to_cpu"] if stock else chain.result_cls.copy_to_cpu
        copy(result, return_logprob=True)
        result.copy_done.record()
    result.copy_done.synchronize()
    lists = {}
    if chain.processor is not None:
        normalize = chain.stock["normalize"] if stock else chain.processor._normalize_decode_outputs
        _, lists["logprobs"] = normalize(
            None,
            batch=sc._batch(step, False),
            result=result,
            logits_output=lo,
            next_token_ids=result.next_token_ids,
        )
    for name in ("next_token_top_logprobs_val", "next_token_top_logprobs_idx"):
        value = getattr(lo, name)
        if chain.processor is None and value:
            value = [v.tolist() for v in value]
        lists[name] = value
    return lists


def test_spec_logprob_chain_on_cuda_reads_host_copies_only_after_their_event():
    """The output-logprob chain of verify steps on the GPU (pinned copies,
    record_stream, the staging buffers of the token ids reused step after
    step) against the release's own, run the same way."""
    from flatgather.bench import spec_chain as sc
    from flatgather.sglang.patches.output_logprobs import difference

    chain = sc.find()
    raw = sc._raw_function(chain.spec.__globals__["get_token_ids_logprobs"])
    none_as_tensor = "new_empty" in raw.__globals__["get_token_ids_logprobs_raw"].__code__.co_names
    side = torch.cuda.Stream()
    busy = torch.randn(2048, 2048, device="cuda")
    rng = random.Random(0)
    steps = []
    for seed in range(24):
        B, A = rng.choice([1, 3, 16, 64]), rng.choice([1, 4, 8])
        top = [rng.choice([0, 1, 5, 20]) for _ in range(B)]
        ids = [rng.choice([None, [], [3, 7], [1, -1, 60, 2]]) for _ in range(B)]
        if not none_as_tensor:  # the release fails on None mixed with ids
            ids = [i if i is not None else [5] for i in ids]
        step = sc.make_step(B, A, top, ids, vocab=64, dtype=torch.bfloat16, seed=seed)
        step.logits, step.predict = step.logits.cuda(), step.predict.cuda()
        steps.append(step)
    expected = [_spec_step_on_cuda(chain, s, True, side, busy) for s in steps]
    flatgather.sglang.install()
    actual = [_spec_step_on_cuda(chain, s, False, side, busy) for s in steps]
    assert difference(actual, expected, "steps") is None
