"""``prune_plan``: the index sets of one batch as CPU tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flatgather._core import Plan, PlanError

_FIELDS = ("extend_seq_lens", "extend_logprob_start_lens")


@dataclass(frozen=True, slots=True)
class PrunePlan:
    """The pruned rows of a batch and the indices SGLang derives from them.

    All four tensors are 1-D ``int64`` CPU tensors, views of one buffer (pinned
    when CUDA is available), so moving them to a device is a single copy of
    ``buffer``.
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


def _as_lengths(value: Any, field: str) -> Sequence[int]:
    """Lists and tuples go to Rust as they are; 1-D integer tensors and arrays
    are turned into lists first. Anything else is refused with PlanError."""
    if isinstance(value, (list, tuple)):
        return value
    if isinstance(value, torch.Tensor):
        if value.dim() != 1:
            raise PlanError(f"{field} must be 1-D, got a tensor of shape {tuple(value.shape)}")
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise PlanError(f"{field} must hold integers, got a tensor of dtype {value.dtype}")
        return value.tolist()
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise PlanError(f"{field} must be 1-D, got an array of shape {value.shape}")
        if value.dtype.kind not in "iu":
            raise PlanError(f"{field} must hold integers, got an array of dtype {value.dtype}")
        return value.tolist()
    raise PlanError(
        f"{field} must be a list, tuple, 1-D integer tensor or array, got {type(value).__name__}"
    )


def _pin_default() -> bool:
    return torch.cuda.is_available()


def prune_plan(
    extend_seq_lens: Any,
    extend_logprob_start_lens: Any,
    *,
    num_rows: int | None = None,
    pin_memory: bool | None = None,
) -> PrunePlan:
    """Build the gather plan of one prefill batch.

    ``extend_seq_lens[i]`` is the number of new tokens of request ``i`` and
    ``extend_logprob_start_lens[i]`` where its input logprobs start, as in
    SGLang's ``LogitsMetadata`` (``extend_seq_lens_cpu`` and
    ``extend_logprob_start_lens_cpu``): lists of ints, or 1-D integer tensors
    or arrays. ``num_rows``, when given, must be ``sum(extend_seq_lens)`` (the
    rows of ``hidden_states``). The buffer is pinned when ``pin_memory`` is
    true; by default, when CUDA is available.

    Raises :class:`flatgather.PlanError` (a ``ValueError``) naming the request
    and the values when the metadata is inconsistent.

    >>> plan = prune_plan([4, 5, 6], [0, 5, 3])
    >>> plan.input_logprob.tolist()
    [0, 1, 2, 3, 5, 6, 7]
    >>> plan.token_to_seq.tolist()
    [0, 0, 0, 0, 1, 2, 2, 2]
    """
    plan = Plan(
        _as_lengths(extend_seq_lens, _FIELDS[0]),
        _as_lengths(extend_logprob_start_lens, _FIELDS[1]),
        num_rows,
    )
    pin = _pin_default() if pin_memory is None else pin_memory
    buffer = torch.empty(plan.buffer_len(True), dtype=torch.int64, pin_memory=pin)
    plan.fill(buffer.numpy())
    n, b = plan.num_pruned, plan.batch_size
    gather, sample, input_logprob, token_to_seq = buffer.split_with_sizes(
        (n, b, plan.num_input_logprob, n)
    )
    return PrunePlan(gather, sample, input_logprob, token_to_seq, n, buffer)
