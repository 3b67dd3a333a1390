"""Checks that need a CUDA device (skipped without one; ``.ci/gpu`` runs
them): the pinned staging buffers under reuse, and padded logprob batches
through the patched ``forward`` on the GPU."""

from __future__ import annotations

import random

import flatgather
import flatgather.sglang
import numpy as np
import pytest
import torch
from _forward import forward_metadata, make_processor, output_fields
from _sglang import assert_same, make_inputs, metadata, pruned_states
from flatgather._staging import stage

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
    h, b, aux = make_inputs(extend, 0, torch.bfloat16, 16, True, aux_kind, 3, pad=11)
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
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 64, (15,), generator=gen)
    hidden = torch.randn(32, 16, generator=gen)
    hidden[15:] = float("nan")
    layers = [torch.randn(32, 16, generator=gen) for _ in range(3)]
    for layer in layers:
        layer[15:] = float("nan")

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
