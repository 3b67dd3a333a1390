"""Drive a release's own ``EagleDraftWorker._draft_extend_for_prefill`` on the
CPU, up to the draft forward, for the tests and the benchmark.

The method needs a model runner and a batch that only a GPU server has, but
everything it does before ``ForwardBatch.init_new`` (the rotation of
``input_ids`` and ``mm_input_embeds``, the spec info) runs on small stand-ins.
:func:`run` builds a batch by hand, replaces ``ForwardBatch.init_new`` on the
release's own class by a stand-in that records what the draft forward would
get (``batch.input_ids``, the tensor object and its values), and stops the
method at its first step past that: the first read of the forward batch or
of a worker attribute, or the draft runner's ``forward``. By then the method
has set ``return_logprob`` (where it does) and ``mm_input_embeds`` on the
forward batch, and those are recorded too.

>>> inputs = make_inputs([3, 1, 2], seed=0)                # doctest: +SKIP
>>> seen = run(eagle_worker_v2, inputs)                   # doctest: +SKIP
>>> seen.input_ids_values.tolist(), seen.return_logprob   # doctest: +SKIP
([...], False)

Nothing here imports the tests; SGLang is imported on first use.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from flatgather.sglang.patches.draft_prefill import METHOD, OWNER
from flatgather.sglang.patching import Swap

__all__ = ["DraftInputs", "Driver", "Seen", "count_ops", "harness", "make_inputs", "run"]

HIDDEN = 4


class _Stop(Exception):
    """The method went past ``ForwardBatch.init_new``: stop there."""


@dataclass(frozen=True)
class DraftInputs:
    """One call's inputs; :func:`run` hands the method fresh copies."""

    lens: tuple[int, ...]
    """The extend lengths (``extend_lens``, ``extend_seq_lens`` before 0.5.13)."""
    input_ids: torch.Tensor
    next_token_ids: torch.Tensor
    mm_input_embeds: torch.Tensor | None = None
    chunked: int | None = None
    """The request that is the chunked one (``batch.chunked_req``); an index
    past the batch stands for a chunked request not in this batch."""
    next_prompt_token: int | None = None
    """``batch.chunked_req_next_prompt_token``."""
    idle: bool = False


def make_inputs(
    lens,
    *,
    seed: int = 0,
    mm_width: int | None = None,
    chunked: int | None = None,
    next_prompt_token: int | None = None,
    idle: bool = False,
    ids_dtype: torch.dtype = torch.int64,
    tails_dtype: torch.dtype = torch.int64,
    rows: int | None = None,
    device: torch.device | str = "cpu",
) -> DraftInputs:
    """Random ids (below 50 000) and tails (50 000 and up, so a tail in the
    result shows), and ``mm_input_embeds`` of ``mm_width`` columns, on
    ``device``. ``rows`` (``sum(lens)`` by default) makes a batch whose ids do
    not add up."""
    lens = tuple(lens)
    gen = torch.Generator().manual_seed(seed)
    n = sum(lens) if rows is None else rows
    ids = torch.randint(0, 50_000, (n,), generator=gen).to(ids_dtype)
    tails = torch.randint(50_000, 60_000, (len(lens),), generator=gen).to(tails_dtype)
    mm = None if mm_width is None else torch.randn(n, mm_width, generator=gen).to(device)
    return DraftInputs(lens, ids.to(device), tails.to(device), mm, chunked, next_prompt_token, idle)


@dataclass
class Seen:
    """What the draft forward would have got, and how."""

    input_ids: torch.Tensor
    """The tensor object ``batch.input_ids`` was at ``ForwardBatch.init_new``."""
    input_ids_values: torch.Tensor
    """Its values when the method stopped (a copy)."""
    ids_in_place: bool
    """``input_ids`` is the batch's original tensor (rotated in place)."""
    mm_input_embeds: torch.Tensor | None
    """What the method set on the forward batch (a copy), if anything."""
    mm_in_place: bool
    """That is the very tensor passed in."""
    return_logprob: bool
    """The forward batch's ``return_logprob`` as the draft forward sees it."""
    target_return_logprob: bool
    """The batch's own ``return_logprob`` afterwards."""
    stopped_at: str
    ops: list[str] = field(default_factory=list)
    """Non-view aten ops of the call, with ``count=True``."""


class _ForwardBatch:
    """What ``init_new`` returns: records what is set on it; any read stops."""

    def __init__(self, batch) -> None:
        object.__setattr__(self, "fields", {"return_logprob": batch.return_logprob})

    def __setattr__(self, name, value) -> None:
        self.fields[name] = value

    def __getattr__(self, name):
        raise _Stop(f"read forward_batch.{name}")


class _Stopping:
    """A stand-in whose unknown attributes stop the method."""

    def __init__(self, what: str, **known) -> None:
        object.__setattr__(self, "what", what)
        for name, value in known.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        raise _Stop(f"read {self.what}.{name}")


def _draft_runner_forward(*args, **kwargs):
    raise _Stop("draft_runner.forward")


def _worker() -> _Stopping:
    algorithm = types.SimpleNamespace(is_standalone=lambda: False)
    runner = _Stopping("self.draft_runner", forward=_draft_runner_forward)
    return _Stopping("self", draft_runner=runner, speculative_algorithm=algorithm)


def _batch(inputs: DraftInputs):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    ids = inputs.input_ids.clone()
    reqs = [object() for _ in inputs.lens]
    chunked = None
    if inputs.chunked is not None:
        chunked = reqs[inputs.chunked] if inputs.chunked < len(reqs) else object()
    return types.SimpleNamespace(
        forward_mode=ForwardMode.IDLE if inputs.idle else ForwardMode.EXTEND,
        input_ids=ids,
        original_input_ids=ids,
        extend_lens=list(inputs.lens),
        extend_seq_lens=list(inputs.lens),
        seq_lens=torch.tensor(inputs.lens, dtype=torch.int64),
        reqs=reqs,
        chunked_req=chunked,
        chunked_req_next_prompt_token=inputs.next_prompt_token,
        return_logprob=True,
        spec_info=None,
        capture_hidden_mode=None,
    )


class count_ops(TorchDispatchMode):
    """The non-view aten ops dispatched inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class Driver:
    """Calls of the method with ``ForwardBatch.init_new`` replaced, inside
    :func:`harness`."""

    def __init__(self, module) -> None:
        self.module = module
        self._seen: dict = {}

    def _init_new(self, cls, batch, *args, **kwargs):
        self._seen["input_ids"] = batch.input_ids  # copied after the call: not counted
        self._seen["forward_batch"] = fb = _ForwardBatch(batch)
        return fb

    def _call(self, inputs: DraftInputs, method, counter: count_ops | None):
        fn = method if method is not None else getattr(getattr(self.module, OWNER), METHOD)
        batch = _batch(inputs)
        tails = inputs.next_token_ids.clone()
        mm = None if inputs.mm_input_embeds is None else inputs.mm_input_embeds.clone()
        hidden = torch.zeros(len(inputs.lens), HIDDEN)
        kwargs = {} if mm is None else {"mm_input_embeds": mm}
        self._seen.clear()
        try:
            if counter is None:
                fn(_worker(), batch, hidden, tails, **kwargs)
            else:
                with counter:
                    fn(_worker(), batch, hidden, tails, **kwargs)
        except _Stop as stop:
            stopped_at = str(stop)
        else:
            stopped_at = "returned"
        if "forward_batch" not in self._seen:
            raise RuntimeError(f"the method stopped before ForwardBatch.init_new ({stopped_at})")
        return batch, mm, stopped_at

    def call(self, inputs: DraftInputs, method=None) -> None:
        """One call on a fresh batch, recording nothing: what a benchmark times."""
        self._call(inputs, method, None)

    def run(self, inputs: DraftInputs, method=None, count: bool = False) -> Seen:
        """One call on a fresh batch, and what the draft forward would get."""
        counter = count_ops() if count else None
        batch, mm_in, stopped_at = self._call(inputs, method, counter)
        fields = self._seen["forward_batch"].fields
        ids = self._seen["input_ids"]
        mm_out = fields.get("mm_input_embeds")
        return Seen(
            input_ids=ids,
            input_ids_values=ids.clone(),
            ids_in_place=ids is batch.original_input_ids,
            mm_input_embeds=None if mm_out is None else mm_out.clone(),
            mm_in_place=mm_out is not None and mm_out is mm_in,
            return_logprob=fields["return_logprob"],
            target_return_logprob=batch.return_logprob,
            stopped_at=stopped_at,
            ops=[] if counter is None else counter.ops,
        )


@contextlib.contextmanager
def harness(module) -> Iterator[Driver]:
    """``module.ForwardBatch.init_new`` (the release's own class) replaced
    for the extent of the block, and the very attribute that was there put
    back after it (a :class:`~flatgather.sglang.patching.Swap`)."""
    driver = Driver(module)
    init_new = Swap(module.ForwardBatch, "init_new", classmethod(driver._init_new))
    init_new.apply()
    try:
        yield driver
    finally:
        init_new.revert()


def run(module, inputs: DraftInputs, method=None, count: bool = False) -> Seen:
    """Call ``method`` (by default whatever ``module.EagleDraftWorker`` holds
    now) on a fresh batch made of ``inputs``, up to the draft forward, with
    ``count`` its non-view aten ops. Exceptions the method raises before
    ``ForwardBatch.init_new`` propagate."""
    with harness(module) as driver:
        return driver.run(inputs, method, count)
