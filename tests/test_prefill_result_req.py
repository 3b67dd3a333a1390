"""SGLang issue #36938 with the release's own requests: the scheduler's
``process_batch_result_prefill`` (the release's, and the one flatgather
installs) run on batches of ``sglang.srt.managers.schedule_batch.Req``
objects, one of them retracted by the release's own
``Req.reset_for_retract()``.

``tests/test_prefill_result.py`` drives the method with stand-in requests
(:class:`flatgather.sglang.patches.prefill_result.Harness`), which hold what the
logprob code reads and nothing else. Here every request is the release's:
its constructor, its logprob state (on the request up to 0.5.12, on
``req.logprob`` from 0.5.13), its ``check_finished``, its retraction. The
scheduler around the method is still the harness's stand-in ``self`` (its
own logprob methods; KV cache, metrics and streaming inert), the result the
release's own ``GenerationBatchResult``, the batch a record of what the
method reads of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import flatgather.sglang
import pytest
import torch
from _sglang import ROW
from flatgather.bench.batches import publish_server_args
from flatgather.sglang.compare import first_difference
from flatgather.sglang.patches import prefill_result
from flatgather.sglang.patches.prefill_result import FIX, METHOD, Harness
from flatgather.testing import install_sgl_kernel_stand_in

# The mixin of 0.5.10 to 0.5.12 imports modules that need sgl_kernel; the
# stand-in goes in after logits_processor (imported by _sglang).
install_sgl_kernel_stand_in()
# Req reads the server arguments the scheduler publishes.
publish_server_args()

from sglang.srt.layers.logits_processor import LogitsProcessorOutput  # noqa: E402
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

OWNER = prefill_result.owner_of(prefill_result.release_module())
STOCK = vars(OWNER)[METHOD]  # the release's own, before any test patches it
HARNESS = Harness(OWNER)
VOCAB = 1 << 20


@dataclass(frozen=True)
class Spec:
    """One request of a prefill batch: its prompt length (all of it in this
    batch), its ``logprob_start_len``, its top-k and whether it asks for
    token ids."""

    extend: int
    start: int
    top: int = 0
    token_ids: bool = False

    @property
    def rows(self) -> int:
        return self.extend - self.start


def _request(k: int, spec: Spec, retracted: bool) -> Req:
    """The release's own request ``k`` (its prompt, its logprob settings),
    retracted by its own ``reset_for_retract`` where asked."""
    params = SamplingParams(max_new_tokens=8)
    params.normalize(None)  # as the tokenizer manager does: stop strings set
    req = Req(
        f"req{k}",
        "",
        [100 + (7 * k + j) % 50 for j in range(spec.extend)],
        params,
        return_logprob=True,
        top_logprobs_num=spec.top,
        token_ids_logprob=[3, 4] if spec.token_ids else None,
        vocab_size=VOCAB,
    )
    req.logprob_start_len = spec.start
    req.extend_input_len = spec.extend
    if retracted:
        req.reset_for_retract()
        assert req.is_retracted
    return req


def _output(batch: list[tuple[int, Spec]]) -> LogitsProcessorOutput:
    """The model's output for ``batch`` (index, spec): one block of input
    logprob rows per request, in batch order, with values of the request's
    own (``1000 * (k + 1) + row``), so that a block served to another shows."""
    required = {
        f.name: None
        for f in dataclasses.fields(LogitsProcessorOutput)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    out = LogitsProcessorOutput(**required)

    def rows(k, spec, frac, width):
        return [[1000.0 * (k + 1) + j + frac] * width for j in range(spec.rows)]

    out.next_token_logprobs = torch.tensor([-(k + 0.25) for k, _ in batch])
    out.input_token_logprobs = torch.tensor(
        [1000.0 * (k + 1) + j + 0.5 for k, s in batch for j in range(s.rows)]
    )
    out.next_token_top_logprobs_val = [torch.full((s.top,), -(k + 0.75)) for k, s in batch]
    out.next_token_top_logprobs_idx = [torch.arange(s.top) + 10 * k for k, s in batch]
    out.input_top_logprobs_val = [rows(k, s, 0.125, s.top) if s.top else [] for k, s in batch]
    out.input_top_logprobs_idx = [[[k] * s.top] * s.rows if s.top else [] for k, s in batch]
    out.next_token_token_ids_logprobs_val = [
        torch.tensor([-(k + 0.5), -(k + 1.5)]) for k, _ in batch
    ]
    out.next_token_token_ids_logprobs_idx = [[3, 4] for _ in batch]
    out.input_token_ids_logprobs_val = [
        rows(k, s, 0.375, 2) if s.token_ids else [] for k, s in batch
    ]
    out.input_token_ids_logprobs_idx = [[[3, 4]] * s.rows if s.token_ids else [] for k, s in batch]
    return out


def _received(req: Req) -> dict:
    """What the method left on a request: its output ids and its whole
    logprob state (on the request up to 0.5.12, on ``req.logprob`` after)."""
    holder = getattr(req, "logprob", None) or req
    names = set(getattr(holder, "__dict__", ()))
    for klass in type(holder).__mro__:  # req.logprob has slots
        slots = vars(klass).get("__slots__", ())
        names.update([slots] if isinstance(slots, str) else slots)
    state = {k: getattr(holder, k, None) for k in sorted(names) if "logprob" in k}
    return {"output_ids": list(req.output_ids), "finished": req.finished(), **state}


def run(function, specs: list[Spec], keep: list[int], retracted=()) -> dict[int, dict]:
    """``function`` on the batch of the requests ``keep`` of ``specs`` (the
    release's own ``Req`` objects, made afresh; those in ``retracted``
    retracted): what each request holds afterwards, by its index."""
    batch = [(k, specs[k]) for k in keep]
    reqs = {k: _request(k, spec, k in retracted) for k, spec in batch}
    result = GenerationBatchResult(
        logits_output=_output(batch),
        next_token_ids=torch.tensor([20000 + k for k in keep], dtype=torch.int64),
    )
    result.extend_input_len_per_req = [s.extend for _, s in batch]
    result.extend_logprob_start_len_per_req = [s.start for _, s in batch]
    schedule_batch = prefill_result.Record(
        reqs=list(reqs.values()), return_logprob=True, decoding_reqs=None
    )
    HARNESS.overlays.function(function)(HARNESS.scheduler, schedule_batch, result)
    return {k: _received(req) for k, req in reqs.items()}


A, B, C, D = Spec(4, 1, top=2, token_ids=True), Spec(3, 0), Spec(5, 2, top=1), Spec(3, 0, top=3)
BATCHES = {
    "retracted in the middle": ([A, B, C, D], {1}),
    "retracted first": ([B, A, C], {0}),
    "retracted last": ([A, C, D], {2}),
    "two in a row retracted": ([A, C, B, D, Spec(6, 4, token_ids=True)], {1, 2}),
}


@pytest.mark.matrix
@pytest.mark.parametrize("name", list(BATCHES))
def test_each_kept_release_request_gets_what_the_release_gives_it_without_the_retracted(name):
    specs, retracted = BATCHES[name]
    everyone = list(range(len(specs)))
    kept = [k for k in everyone if k not in retracted]
    alone = run(STOCK, specs, kept)  # the release, without the retracted requests
    whole = run(STOCK, specs, everyone, retracted)
    for k in kept:  # each request received input logprobs of its own there
        values = {v for v in alone[k]["input_token_logprobs_val"] or () if v is not None}
        own = {1000.0 * (k + 1) + j + 0.5 for j in range(specs[k].rows)}
        assert values and values <= own, (k, alone[k])
    after = [k for k in kept if k > min(retracted)]
    shifted = [k for k in after if whole[k] != alone[k]]
    if after:  # issue #36938 with the release's own requests, where its row says so
        assert bool(shifted) is not ROW.skip_advances_logprob_pt, (shifted, ROW)

    report = flatgather.sglang.install()
    assert (FIX in report.backports) is not ROW.skip_advances_logprob_pt, report
    ours = run(vars(OWNER)[METHOD], specs, everyone, retracted)
    for k in kept:
        found = first_difference(ours[k], alone[k], f"request {k}")
        assert found is None, found
    for k in retracted:  # left as the release leaves it
        found = first_difference(ours[k], whole[k], f"retracted request {k}")
        assert found is None, found
