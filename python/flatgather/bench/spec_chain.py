"""The running release's output-logprob chain of one speculative verify
step, driven on the CPU: the bench's ``spec-logprobs`` section and the
tests run it stock and patched, side by side.

One :class:`Step` is a verify step of ``B`` requests with ``A`` scored
positions each (``steps + 1``): its logits, the predicted tokens, each
request's top-logprob number, token-id list and accept length. :func:`run`
drives the release's three stages on it, as the scheduler does:

1. the release's spec logprob function (``compute_spec_logprobs`` from
   0.5.18, ``compute_spec_v2_logprobs`` from 0.5.11,
   ``EAGLEWorkerV2._compute_spec_v2_logprobs`` in 0.5.10), which calls the
   producers it looks up in its module;
2. ``GenerationBatchResult.copy_to_cpu(return_logprob=True)``;
3. the scheduler's ``_normalize_decode_outputs`` (0.5.13 on) and then its
   ``_apply_decode_logprobs`` for every request, with its accept length:
   what the scheduler finally puts on each request. Up to 0.5.12 both are
   inline in ``process_batch_result_decode``, a method of the whole
   scheduler: here stage 3 is its comprehensions, ``[v.tolist() for v in
   ...]``, run through the same helper as the rewritten method, and the
   requests get their rows as that method indexes them
   (``tests/test_spec_logprobs.py`` drives the rewritten method itself
   against the release's, on stand-ins for the scheduler).

Each stage is whatever the class or module holds when it runs (patched or
not); ``stock=True`` runs the release's own objects, taken before any
install. On a CPU the release's host copy returns the row itself; with
``emulate_copies`` (0.5.15 on, where the copy is the module's
``_async_d2h``), every copy allocates a host tensor and copies into it, as
the CUDA branch does, and is counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import sys
import types
from collections.abc import Iterator

import torch

from flatgather import testing
from flatgather.sglang.patches.output_logprobs import runtime as flat_logprobs

SPEC_FUNCTIONS = (
    ("sglang.srt.layers.logprob_processor", "compute_spec_logprobs"),
    ("sglang.srt.layers.logprob_processor", "compute_spec_v2_logprobs"),
    ("sglang.srt.layers.utils.logprob", "compute_spec_v2_logprobs"),
)
UTILS = "sglang.srt.managers.utils"
PROCESSOR = "sglang.srt.managers.scheduler_components.batch_result_processor"
WORKER = "sglang.srt.speculative.eagle_worker_v2"


@dataclasses.dataclass
class Step:
    """One verify step: ``B`` requests, ``A`` positions each."""

    logits: torch.Tensor
    """``[B * A, vocab]``, the verify's next-token logits."""
    predict: torch.Tensor
    top: list[int]
    ids: list
    accept: list[int]
    """Accepted positions per request, 1 to A."""
    A: int

    @property
    def B(self) -> int:
        return len(self.top)


def make_step(B, A, top, ids, accept=None, vocab=64, dtype=torch.float32, seed=0) -> Step:
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B * A, vocab, generator=gen) * 3).to(dtype)
    predict = torch.randint(0, vocab, (B * A,), generator=gen)
    if accept is None:
        accept = torch.randint(1, A + 1, (B,), generator=gen).tolist()
    return Step(logits, predict, list(top), list(ids), list(accept), A)


class _Event:
    """``copy_done`` on a CPU: what the release calls on it."""

    def record(self, *args) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


@dataclasses.dataclass
class Chain:
    """The running release's chain: its stage functions, as found now."""

    spec: types.FunctionType
    spec_kind: str
    result_cls: type
    processor: type | None
    stock: dict
    """The release's own stage objects, taken by :func:`find` (call it before
    any install)."""


_found: Chain | None = None


def _raw_function(fn):
    """The release's object under flatgather's replacement, if any."""
    while getattr(fn, "__flatgather__", None) is not None:
        fn = getattr(fn, "__flatgather_original__", None) or fn.__wrapped__
    return fn


def _raw(owner, name):
    return _raw_function(vars(owner)[name])


def find() -> Chain:
    """The release's chain; the first call takes its stock stage objects."""
    global _found
    if _found is not None:
        return _found
    spec = kind = None
    for module_name, name in SPEC_FUNCTIONS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if isinstance(vars(module).get(name), types.FunctionType):
            spec, kind = vars(module)[name], name
            break
    if spec is None:  # 0.5.10: a method of the worker (its module needs sgl_kernel)
        from flatgather.testing import install_sgl_kernel_stand_in

        # What imports sgl_kernel only if it is there must find it missing.
        importlib.import_module("sglang.srt.layers.logits_processor")
        install_sgl_kernel_stand_in()
        worker = importlib.import_module(WORKER).EAGLEWorkerV2
        spec, kind = _raw(worker, "_compute_spec_v2_logprobs"), "method"
    utils = importlib.import_module(UTILS)
    cls = utils.GenerationBatchResult
    try:
        processor = importlib.import_module(PROCESSOR).SchedulerBatchResultProcessor
    except ImportError:
        processor = None
    stock = {"copy_to_cpu": _raw(cls, "copy_to_cpu")}
    if processor is not None:
        stock["normalize"] = _raw(processor, "_normalize_decode_outputs")
    _found = Chain(spec, kind, cls, processor, stock)
    return _found


def _batch(step: Step, spec: bool):
    is_none = not spec
    return types.SimpleNamespace(
        seq_lens=torch.zeros(step.B, dtype=torch.int64),
        top_logprobs_nums=step.top,
        token_ids_logprobs=step.ids,
        sampling_info=types.SimpleNamespace(is_all_greedy=True),
        return_logprob=True,
        spec_algorithm=types.SimpleNamespace(is_none=lambda: is_none),
        is_spec_v2=spec,
    )


def _stage1(chain: Chain, step: Step, output) -> None:
    batch = _batch(step, True)
    accept_index = torch.arange(step.B * step.A, device=step.logits.device).view(step.B, step.A)
    if chain.spec_kind == "compute_spec_logprobs":
        chain.spec(batch, output, step.predict, accept_index=accept_index)
    elif chain.spec_kind == "compute_spec_v2_logprobs":
        chain.spec(batch, output, step.predict, accept_index, step.A - 1)
    else:
        worker = types.SimpleNamespace(speculative_num_steps=step.A - 1)
        chain.spec(worker, batch, output, step.predict, accept_index)


def _inline_tolist(output) -> None:
    """Stage 3 up to 0.5.12, as the rewritten ``process_batch_result_decode``
    runs it (the stock method runs the same comprehensions)."""
    for name in ("next_token_top_logprobs_val", "next_token_top_logprobs_idx"):
        if output.next_token_top_logprobs_val:
            setattr(
                output, name, flat_logprobs.rows_tolist(getattr(output, name), lambda v: v.tolist())
            )
    if output.next_token_token_ids_logprobs_val:
        output.next_token_token_ids_logprobs_val = flat_logprobs.rows_tolist(
            output.next_token_token_ids_logprobs_val, lambda v: v.tolist()
        )


def _requests(chain: Chain, step: Step, output, logprobs) -> list:
    """What the scheduler appends to each request: the release's own
    ``_apply_decode_logprobs`` where it has one."""
    reqs = []
    spec_batch = _batch(step, True)
    for i in range(step.B):
        logprob = types.SimpleNamespace(
            output_token_logprobs_val=[],
            output_token_logprobs_idx=[],
            output_top_logprobs_val=[],
            output_top_logprobs_idx=[],
            output_token_ids_logprobs_val=[],
            output_token_ids_logprobs_idx=[],
            top_logprobs_num=step.top[i],
            token_ids_logprob=step.ids[i],
        )
        req = types.SimpleNamespace(logprob=logprob)
        accepted = step.predict[i * step.A : i * step.A + step.accept[i]].tolist()
        if chain.processor is not None:
            chain.processor._apply_decode_logprobs(
                None,
                req=req,
                i=i,
                batch=spec_batch,
                next_token_id=accepted,
                next_token_logprobs=logprobs,
                logits_output=output,
            )
        else:
            for j, tok in enumerate(accepted):
                flat = i * step.A + j
                logprob.output_token_logprobs_val.append(logprobs[i][j])
                logprob.output_token_logprobs_idx.append(tok)
                if step.top[i] > 0:
                    logprob.output_top_logprobs_val.append(output.next_token_top_logprobs_val[flat])
                    logprob.output_top_logprobs_idx.append(output.next_token_top_logprobs_idx[flat])
                if step.ids[i] is not None:
                    logprob.output_token_ids_logprobs_val.append(
                        output.next_token_token_ids_logprobs_val[flat]
                    )
                    logprob.output_token_ids_logprobs_idx.append(
                        output.next_token_token_ids_logprobs_idx[flat]
                    )
        reqs.append(vars(logprob))
    return reqs


@contextlib.contextmanager
def _stock_objects(chain: Chain) -> Iterator[None]:

    with testing.module_functions_as_shipped():
        yield


def stages(chain: Chain, step: Step, stock: bool = False):
    """The three stages as three calls on fresh objects of ``step``, for
    timing each: ``(stage1, stage2, stage3)`` closures sharing one result.
    Each runs in inference mode, as the scheduler's event loops run
    (``DynamicGradMode``)."""
    state = {}

    @torch.inference_mode()
    def one():
        lo = _logits_output(step)
        if stock:
            with _stock_objects(chain):
                _stage1(chain, step, lo)
        else:
            _stage1(chain, step, lo)
        state["result"] = chain.result_cls(logits_output=lo, next_token_ids=step.predict)
        state["result"].copy_done = _Event()

    @torch.inference_mode()
    def two():
        copy = chain.stock["copy_to_cpu"] if stock else chain.result_cls.copy_to_cpu
        copy(state["result"], return_logprob=True)

    @torch.inference_mode()
    def three():
        result = state["result"]
        lo = result.logits_output
        if chain.processor is None:
            if stock:
                for name in ("next_token_top_logprobs_val", "next_token_top_logprobs_idx"):
                    if lo.next_token_top_logprobs_val:
                        setattr(lo, name, [v.tolist() for v in getattr(lo, name)])
                if lo.next_token_token_ids_logprobs_val:
                    lo.next_token_token_ids_logprobs_val = [
                        v.tolist() for v in lo.next_token_token_ids_logprobs_val
                    ]
            else:
                _inline_tolist(lo)
            result.next_token_ids.tolist()
            logprobs = lo.next_token_logprobs.tolist()
        else:
            normalize = (
                chain.stock["normalize"] if stock else chain.processor._normalize_decode_outputs
            )
            _, logprobs = normalize(
                None,
                batch=_batch(step, False),
                result=result,
                logits_output=lo,
                next_token_ids=result.next_token_ids,
            )
        state["logprobs"] = logprobs
        return logprobs

    return one, two, three, state


def _logits_output(step: Step):
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    return LogitsProcessorOutput(next_token_logits=step.logits)


def run(step: Step, stock: bool = False, copy: bool = True) -> dict:
    """The chain on ``step``: every list the scheduler holds after stage 3,
    and what it appends to each request. ``copy=False`` skips
    ``copy_to_cpu`` (the non-overlap path)."""
    chain = find()
    one, two, three, state = stages(chain, step, stock)
    one()
    if copy:
        two()
    logprobs = three()
    lo = state["result"].logits_output
    return {
        "top_val": lo.next_token_top_logprobs_val,
        "top_idx": lo.next_token_top_logprobs_idx,
        "ids_val": lo.next_token_token_ids_logprobs_val,
        "ids_idx": lo.next_token_token_ids_logprobs_idx,
        "logprobs": logprobs,
        "requests": _requests(chain, step, lo, logprobs),
    }


@contextlib.contextmanager
def emulated_copies(counter: list | None = None) -> Iterator[bool]:
    """Within it, the release's per-tensor host copy (its module's
    ``_async_d2h``, 0.5.15 on) does on the CPU what its CUDA branch does: a
    fresh host tensor and a copy into it; each call appends to ``counter``.
    Yields whether the release has such a function."""
    utils = sys.modules.get(UTILS) or importlib.import_module(UTILS)
    name = "_async_d2h" if "_async_d2h" in vars(utils) else None
    if name is None:
        yield False
        return
    original = vars(utils)[name]

    def _async_d2h(t):
        if counter is not None:
            counter.append(1)
        host = torch.empty(t.shape, dtype=t.dtype)
        host.copy_(t, non_blocking=True)
        return host

    setattr(utils, name, _async_d2h)
    try:
        yield True
    finally:
        setattr(utils, name, original)
