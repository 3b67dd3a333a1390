"""SGLang 0.5.10 predates PR #21589; install() backports both of its fixes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from unittest import mock

import flatgather.sglang
import pytest
import torch
from _sglang import (
    RELEASE,
    ForwardMode,
    assert_same,
    fixed_aux_oracle,
    hidden_to_store,
    install_sgl_kernel_stand_in,
    metadata,
    pruned_states,
    stock_pruned_states,
)

pytestmark = pytest.mark.skipif(RELEASE != "0.5.10", reason="0.5.10 backports")

EXTEND, START = [4, 5, 6], [0, 5, 3]


def inputs():
    gen = torch.Generator().manual_seed(7)
    h = torch.randn(15, 8, generator=gen)
    aux = [torch.randn(15, 8, generator=gen) for _ in range(3)]
    return h, aux


def test_stock_crashes_on_last_capture_with_aux_layers():
    h, aux = inputs()
    md = metadata(EXTEND, START, "LAST")
    result = stock_pruned_states(h, None, aux, md)
    assert result[2] is None  # the aux layers were dropped ...
    with pytest.raises(TypeError):  # ... and torch.cat(None) fails
        hidden_to_store(h, None, aux, result, md)


def test_installed_prunes_aux_as_fixed_releases_do():
    h, aux = inputs()
    flatgather.sglang.install()
    md = metadata(EXTEND, START, "LAST")
    result = pruned_states(h, None, aux, md)
    expected_aux = fixed_aux_oracle(aux, lambda: metadata(EXTEND, START))
    assert_same(result[2], expected_aux)
    stored = hidden_to_store(h, None, aux, result, md)
    # LAST capture: the sampled row of each request, aux layers side by side.
    rows = [3, 8, 14]
    assert_same(stored, torch.cat([layer[rows] for layer in aux], dim=-1))


def draft_worker_v2():
    install_sgl_kernel_stand_in()
    from sglang.srt.speculative import eagle_worker_v2

    return eagle_worker_v2


def run_draft_extend_for_prefill(module):
    """Drive the release's own _draft_extend_for_prefill with a stand-in
    batch and draft runner (no model on CPU), recording the forward batch's
    return_logprob as the draft model would see it."""
    seen = {}

    def init_new(batch, runner):
        return types.SimpleNamespace(return_logprob=batch.return_logprob, mm_input_embeds=None)

    def forward(forward_batch):
        seen["return_logprob"] = forward_batch.return_logprob
        logits = torch.randn(2, 16)
        out = types.SimpleNamespace(next_token_logits=logits, hidden_states=torch.randn(2, 4))
        return types.SimpleNamespace(logits_output=out)

    worker = types.SimpleNamespace(draft_runner=types.SimpleNamespace(forward=forward), topk=1)
    batch = types.SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        extend_seq_lens=[2, 3],
        input_ids=torch.arange(5),
        seq_lens=torch.tensor([2, 3]),
        return_logprob=True,
        spec_info=None,
    )
    real = (
        module.ForwardBatch.__wrapped__
        if hasattr(module.ForwardBatch, "__wrapped__")
        else (module.ForwardBatch)
    )
    with mock.patch.object(real, "init_new", staticmethod(init_new)):
        module.EagleDraftWorker._draft_extend_for_prefill(
            worker, batch, torch.randn(5, 4), torch.tensor([7, 9])
        )
        outside = module.ForwardBatch.init_new(batch, None).return_logprob
    return seen["return_logprob"], batch.return_logprob, outside


def test_draft_prefill_forward_keeps_logprob_without_install():
    module = draft_worker_v2()
    in_draft, _, _ = run_draft_extend_for_prefill(module)
    assert in_draft is True  # the bug: the draft forward asks for logprobs


def test_draft_prefill_forward_runs_without_logprob_once_installed():
    module = draft_worker_v2()
    original_fb = module.ForwardBatch
    original_fn = vars(module.EagleDraftWorker)["_draft_extend_for_prefill"]
    report = flatgather.sglang.install()
    assert report.pending == ()
    assert set(report.patched) >= {
        "sglang.srt.speculative.eagle_worker_v2.ForwardBatch",
        "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill",
    }
    in_draft, target, outside = run_draft_extend_for_prefill(module)
    assert in_draft is False
    assert target is True  # the target batch keeps its logprobs
    assert outside is True  # init_new outside the draft prefill is untouched
    flatgather.sglang.uninstall()
    assert module.ForwardBatch is original_fb
    assert vars(module.EagleDraftWorker)["_draft_extend_for_prefill"] is original_fn


def test_fix_applies_when_the_module_is_imported_after_install():
    """install() must not import eagle_worker_v2 (it needs sgl_kernel); the
    fix lands the moment something imports it."""
    code = textwrap.dedent(
        """
        import sys
        import flatgather.sglang as fs
        import _sglang
        report = fs.install()
        name = "sglang.srt.speculative.eagle_worker_v2"
        assert name not in sys.modules, "install() imported the worker module"
        assert report.pending == (name,), report
        _sglang.install_sgl_kernel_stand_in()
        import sglang.srt.speculative.eagle_worker_v2 as w
        import test_release_0_5_10 as t
        in_draft, target, outside = t.run_draft_extend_for_prefill(w)
        assert (in_draft, target, outside) == (False, True, True)
        assert fs.installed_report().pending == ()
        print("lazy-ok")
        """
    )
    tests = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tests), os.environ["PYTHONPATH"]]))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "lazy-ok" in out.stdout


def test_forward_crash_reproduced_and_gone_with_install():
    from _forward import output_fields
    from test_forward import HIDDEN, run_forward

    args = ([4, 5, 6], [0, 5, 3], "LAST", "list", 5, [0, 0, 0], [None] * 3, False)
    with pytest.raises(TypeError):
        run_forward(*args)
    flatgather.sglang.install()
    out = output_fields(run_forward(*args))
    assert out["hidden_states"].shape == (3, 3 * HIDDEN)
    assert out["input_token_logprobs"].shape == (7,)
