"""The replacement for ``LogitsProcessor._get_pruned_states``, and the lazy
aux pruning that rides on it.

Only the branch "prefill with input logprobs" is replaced; decode, verify,
draft-extend-v2 and prefill without logprobs run the release's own code.

Lazy aux pruning: in that branch SGLang gathers every logprob row of every
EAGLE3 aux layer, yet ``forward`` only hands them to
``_get_hidden_states_to_store``, which under LAST capture keeps the B sampled
rows and under NULL capture none. Inside ``LogitsProcessor.forward`` (marked
by a context variable that the wrapped ``forward`` sets) the aux result is
therefore a :class:`LazyAuxPruned` that ``_get_hidden_states_to_store``
resolves to exactly the rows it reads. Anywhere else, and under FULL capture,
the aux layers are pruned in full as the release does.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable

import torch

from flatgather._core import Plan, PlanError
from flatgather._staging import stage
from flatgather.sglang._contracts import Contract


def _check_rows(name: str, tensor: torch.Tensor, rows: int) -> None:
    if tensor.dim() == 0 or tensor.shape[0] != rows:
        raise PlanError(
            f"{name} has shape {tuple(tensor.shape)}, but hidden_states has {rows} rows"
        )


def _uses_release_code(metadata) -> bool:
    """True where the release's own branches apply (the same tests, in the
    same order, as its ``_get_pruned_states``)."""
    mode = metadata.forward_mode
    if mode.is_decode_or_idle() or mode.is_target_verify() or mode.is_draft_extend_v2():
        return True
    return mode.is_extend() and not metadata.extend_return_logprob


_in_forward: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "flatgather_in_logits_forward", default=False
)


def _gather_aux(aux, index: torch.Tensor):
    if isinstance(aux, torch.Tensor):
        return aux.index_select(0, index)
    return [layer.index_select(0, index) for layer in aux]


class LazyAuxPruned:
    """``aux_pruned_states`` not gathered yet: the aux layers and the plan's
    device indices, to gather from once it is known which rows are read."""

    __slots__ = ("aux", "gather", "sample")

    def __init__(self, aux, gather: torch.Tensor, sample: torch.Tensor) -> None:
        self.aux, self.gather, self.sample = aux, gather, sample

    def resolve(self, capture_hidden_mode, sample_indices):
        """The ``(aux_pruned_states, sample_indices)`` to hand to the
        release's ``_get_hidden_states_to_store`` so that it stores what it
        would have stored from the full result."""
        if not capture_hidden_mode.need_capture():
            return None, sample_indices  # never read
        if capture_hidden_mode.is_last():
            # pack(aux[gather])[sample] == pack(aux[gather[sample]]): gather
            # the B sampled rows only, already in order, so no re-indexing.
            return _gather_aux(self.aux, self.gather.index_select(0, self.sample)), None
        return _gather_aux(self.aux, self.gather), sample_indices


def make_forward(original: Callable) -> Callable:
    """``forward`` marking its extent, so lazy aux pruning applies there alone."""

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        token = _in_forward.set(True)
        try:
            return original(self, *args, **kwargs)
        finally:
            _in_forward.reset(token)

    return forward


def make_hidden_states_to_store(original: Callable) -> Callable:
    """``_get_hidden_states_to_store`` that resolves a :class:`LazyAuxPruned`."""

    @functools.wraps(original)
    def _get_hidden_states_to_store(
        self,
        hidden_states,
        hidden_states_before_norm,
        aux_hidden_states,
        pruned_states,
        pruned_states_before_norm,
        aux_pruned_states,
        sample_indices,
        logits_metadata,
    ):
        if isinstance(aux_pruned_states, LazyAuxPruned):
            aux_pruned_states, sample_indices = aux_pruned_states.resolve(
                logits_metadata.capture_hidden_mode, sample_indices
            )
        return original(
            self,
            hidden_states,
            hidden_states_before_norm,
            aux_hidden_states,
            pruned_states,
            pruned_states_before_norm,
            aux_pruned_states,
            sample_indices,
            logits_metadata,
        )

    return _get_hidden_states_to_store


def make_pruned_states(original: Callable, contract: Contract, lazy_aux: bool = False) -> Callable:
    """A ``_get_pruned_states`` that returns what ``original`` returns under
    ``contract``, with one plan, one host-to-device copy and one
    ``index_select`` per tensor in the logprob branch."""
    # Every contract prunes the aux layers here: 0.5.15 and 0.5.23 do, and on
    # 0.5.10 that is the backported fix (it returned None, and LAST capture
    # then crashed in torch.cat(None)).

    @functools.wraps(original)
    def _get_pruned_states(
        self, hidden_states, hidden_states_before_norm, aux_hidden_states, logits_metadata
    ):
        packed = isinstance(aux_hidden_states, torch.Tensor)
        if _uses_release_code(logits_metadata) or (packed and not contract.packed_aux):
            return original(
                self, hidden_states, hidden_states_before_norm, aux_hidden_states, logits_metadata
            )
        rows = hidden_states.shape[0]
        plan = Plan(
            logits_metadata.extend_seq_lens_cpu,
            logits_metadata.extend_logprob_start_lens_cpu,
            rows,
        )
        if hidden_states_before_norm is not None:
            _check_rows("hidden_states_before_norm", hidden_states_before_norm, rows)
        if aux_hidden_states is not None:
            if packed:
                _check_rows("aux_hidden_states", aux_hidden_states, rows)
            else:
                for j, layer in enumerate(aux_hidden_states):
                    _check_rows(f"aux_hidden_states[{j}]", layer, rows)

        index = stage(plan, hidden_states.device)
        gather, sample_indices, input_logprob_indices = index.split_with_sizes(
            (plan.num_pruned, plan.batch_size, plan.num_input_logprob)
        )
        pruned_states = hidden_states.index_select(0, gather)
        pruned_states_before_norm = (
            None
            if hidden_states_before_norm is None
            else hidden_states_before_norm.index_select(0, gather)
        )
        if aux_hidden_states is None:
            aux_pruned_states = None
        elif lazy_aux and _in_forward.get() and not logits_metadata.capture_hidden_mode.is_full():
            aux_pruned_states = LazyAuxPruned(aux_hidden_states, gather, sample_indices)
        else:
            aux_pruned_states = _gather_aux(aux_hidden_states, gather)

        if contract.writes_cpu_indices:
            logits_metadata.sample_indices_cpu = plan.sample_list()
            logits_metadata.input_logprob_indices_cpu = plan.input_logprob_list()
        token_to_seq_idx = plan.token_to_seq_list(contract.trailing_token_to_seq)
        return (
            pruned_states,
            pruned_states_before_norm,
            aux_pruned_states,
            sample_indices,
            input_logprob_indices,
            token_to_seq_idx,
        )

    _get_pruned_states.__flatgather__ = contract
    return _get_pruned_states
