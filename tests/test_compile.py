"""Under ``torch.compile`` every flatgather wrapper is transparent: SGLang
compiles its decode forwards (``--enable-torch-compile``), and those include
``LogitsProcessor.forward``. Dynamo must see the release's code alone: no
graph break, ``fullgraph=True`` works, outputs unchanged."""

from __future__ import annotations

import flatgather.sglang
import pytest
import torch
from _forward import make_processor
from _sglang import CAPTURE_MODES, ForwardMode, LogitsMetadata, assert_same
from flatgather.bench.batches import metadata

VOCAB, HIDDEN = 48, 8


class DecodeTail(torch.nn.Module):
    """A module whose forward calls the LogitsProcessor in decode mode, as a
    compiled SGLang model forward does."""

    def __init__(self, capture: str, aux: bool) -> None:
        super().__init__()
        self.processor, self.lm_head = make_processor(VOCAB, HIDDEN)
        self.metadata = LogitsMetadata(
            forward_mode=ForwardMode.DECODE, capture_hidden_mode=CAPTURE_MODES[capture]
        )
        self.aux = aux

    def forward(self, input_ids, hidden):
        aux = [hidden * 2, hidden * 3] if self.aux else None
        out = self.processor(input_ids, hidden, self.lm_head, self.metadata, aux_hidden_states=aux)
        return out.next_token_logits, out.hidden_states


@pytest.mark.matrix
@pytest.mark.parametrize("capture", ["NULL", "LAST", "FULL"])
@pytest.mark.parametrize("aux", [False, True])
def test_fullgraph_compile_of_the_patched_decode_forward(capture, aux):
    torch._dynamo.reset()
    module = DecodeTail(capture, aux)
    ids, hidden = torch.randint(0, VOCAB, (4,)), torch.randn(4, HIDDEN)
    expected = module(ids, hidden)
    flatgather.sglang.install()
    assert vars(type(module.processor))["forward"].__wrapped__ is not None  # patched
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    assert_same(compiled(ids, hidden), expected)
    explained = torch._dynamo.explain(module)(ids, hidden)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_compiled_code_never_builds_a_plan(monkeypatch):
    """Even in the logprob branch, compiled code runs the release's code."""
    from flatgather.sglang.patches.pruned_states import runtime as gather

    def refuse(*args, **kwargs):
        raise AssertionError("a plan was built under torch.compile")

    flatgather.sglang.install()
    monkeypatch.setattr(gather, "PrunePlan", refuse)
    extend, start = [3, 2], [0, 1]
    md = metadata(extend, start)
    from _sglang import LogitsProcessor

    def prune(hidden):
        return LogitsProcessor._get_pruned_states(None, hidden, None, None, md)[0]

    hidden = torch.randn(5, HIDDEN)
    torch._dynamo.reset()
    out = torch.compile(prune, backend="eager")(hidden)
    assert torch.equal(out, hidden[[0, 1, 2, 4]])
