"""The replacement for ``LogitsProcessor._get_pruned_states``.

Only the branch "prefill with input logprobs" is replaced; decode, verify,
draft-extend-v2 and prefill without logprobs run the release's own code.
"""

from __future__ import annotations

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


def make_pruned_states(original: Callable, contract: Contract) -> Callable:
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
        elif packed:
            aux_pruned_states = aux_hidden_states.index_select(0, gather)
        else:
            aux_pruned_states = [layer.index_select(0, gather) for layer in aux_hidden_states]

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
