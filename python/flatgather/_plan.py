"""``prune_plan`` and ``rotation_plan``: the index sets of one batch as CPU
tensors, for use outside SGLang (the SGLang patches stage them directly)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from flatgather._core import PrunePlan as _PrunePlan
from flatgather._core import RotationPlan as _RotationPlan
from flatgather._errors import PlanError

__all__ = ["PrunePlan", "RotationPlan", "prune_plan", "rotation_plan"]


@dataclass(frozen=True, slots=True)
class PrunePlan:
    """The kept rows of a batch and the indices SGLang derives from them.

    All four tensors are 1-D ``int64`` CPU tensors, views of one buffer, so
    moving them to a device is a single copy of ``buffer``.
    """

    gather: torch.Tensor
    """Flat row index, into ``hidden_states``, of every kept row."""
    sample: torch.Tensor
    """Per request, the position of its sampled (last kept) row in the kept rows."""
    input_logprob: torch.Tensor
    """Positions, in the kept rows, of the rows that carry an input logprob."""
    token_to_seq: torch.Tensor
    """Request index of every kept row."""
    num_pruned: int
    """Number of kept rows: ``len(gather)``."""
    buffer: torch.Tensor
    """The whole buffer: ``gather | sample | input_logprob | token_to_seq``."""


@dataclass(frozen=True, slots=True)
class RotationPlan:
    """The draft-prefill rotation of a batch: indices into
    ``cat(input_ids, tail_tokens)``, views of one ``int64`` CPU buffer."""

    ids: torch.Tensor
    """Row ``j`` of request ``i`` reads the next row of the request; its last
    row reads ``num_tokens + i``, the request's tail token."""
    embeds: torch.Tensor | None
    """With ``embeds=True``: the same rows for ``mm_input_embeds`` (which has
    no tails), each request's last row reading itself."""
    num_tokens: int
    """``sum(extend_lens)``."""
    buffer: torch.Tensor


def _flag(value: Any, name: str, optional: bool = False) -> bool | None:
    if value is None and optional:
        return None
    if type(value) is not bool:
        allowed = "True, False or None" if optional else "True or False"
        raise PlanError(f"{name} must be {allowed}, got {type(value).__name__}", "bad_argument")
    return value


def _host_buffer(n: int, pin_memory: bool | None) -> torch.Tensor:
    """An ``int64`` CPU tensor of ``n`` values. Pinned when asked, or by
    default when this process has already initialised CUDA: asking
    ``torch.cuda.is_available()`` here would create a CUDA context as a side
    effect (and fails in a forked child of a CUDA parent)."""
    pin = torch.cuda.is_initialized() if pin_memory is None else pin_memory
    if pin and not torch.cuda.is_available():
        raise PlanError("pin_memory=True needs CUDA, which is not available", "bad_argument")
    return torch.empty(n, dtype=torch.int64, pin_memory=pin)


def prune_plan(
    extend_seq_lens: Any,
    extend_logprob_start_lens: Any,
    *,
    num_rows: int | None = None,
    exact_rows: bool = False,
    pin_memory: bool | None = None,
) -> PrunePlan:
    """Build the pruning plan of one prefill batch.

    ``extend_seq_lens[i]`` is the number of new tokens of request ``i`` and
    ``extend_logprob_start_lens[i]`` where its input logprobs start, as in
    SGLang's ``LogitsMetadata`` (``extend_seq_lens_cpu`` and
    ``extend_logprob_start_lens_cpu``): lists or tuples of ints, or 1-D integer
    tensors or arrays.

    ``num_rows``, when given, is the number of rows of ``hidden_states``. It
    must be at least ``sum(extend_seq_lens)``: rows past the tokens (CUDA-graph
    or DP-attention padding) are never read. With ``exact_rows=True`` it must
    be exactly that.

    The buffer is pinned when ``pin_memory`` is true; by default, only when
    this process has already initialised CUDA.

    Raises :class:`flatgather.PlanError` (a ``ValueError``, with ``.kind`` and
    ``.request``) naming the request and the values when the metadata is
    inconsistent. An exception raised by an argument's own ``__index__``
    propagates as itself.

    >>> plan = prune_plan([4, 5, 6], [0, 5, 3], num_rows=16)  # one padding row
    >>> plan.input_logprob.tolist()
    [0, 1, 2, 3, 5, 6, 7]
    >>> plan.token_to_seq.tolist()
    [0, 0, 0, 0, 1, 2, 2, 2]
    """
    exact = _flag(exact_rows, "exact_rows")
    pin = _flag(pin_memory, "pin_memory", optional=True)
    plan = _PrunePlan(
        extend_seq_lens,
        extend_logprob_start_lens,
        num_rows,
        exact,
    )
    buffer = _host_buffer(plan.buffer_len(True), pin)
    plan.fill(buffer.numpy())
    n, b = plan.num_pruned, plan.batch_size
    gather, sample, input_logprob, token_to_seq = buffer.split_with_sizes(
        (n, b, plan.num_input_logprob, n)
    )
    return PrunePlan(gather, sample, input_logprob, token_to_seq, n, buffer)


def rotation_plan(
    extend_lens: Any,
    *,
    num_rows: int | None = None,
    embeds: bool = False,
    pin_memory: bool | None = None,
) -> RotationPlan:
    """Build the draft-prefill rotation of one batch.

    ``extend_lens[i]`` is the number of tokens of request ``i`` (SGLang's
    ``batch.extend_lens``). ``num_rows``, when given, is the number of rows
    of ``input_ids`` and must equal ``sum(extend_lens)``. Then
    ``torch.cat((input_ids, tail_tokens)).index_select(0, plan.ids)`` is the
    draft model's ``input_ids``.

    >>> plan = rotation_plan([3, 1, 2], embeds=True)
    >>> plan.ids.tolist()
    [1, 2, 6, 7, 5, 8]
    >>> plan.embeds.tolist()
    [1, 2, 2, 3, 5, 5]
    """
    with_embeds = _flag(embeds, "embeds")
    pin = _flag(pin_memory, "pin_memory", optional=True)
    plan = _RotationPlan(extend_lens, num_rows)
    buffer = _host_buffer(plan.buffer_len(with_embeds), pin)
    plan.fill(buffer.numpy(), with_embeds)
    n = plan.num_tokens
    ids = buffer[:n]
    return RotationPlan(ids, buffer[n:] if with_embeds else None, n, buffer)
