"""The replacement for ``LogitsProcessor._get_pruned_states``.

Only the branch "prefill with input logprobs" is replaced; decode, verify,
draft-extend-v2, prefill without logprobs, compiled code and CUDA-graph
capture run the release's own code. So does every batch the plan refuses (a
request of length 0, lengths and starts of different counts, a start past its
length, a negative or non-integer value, no request, a 0-d tensor), so the
answer, result or error, is the release's. ``hidden_states`` may have more
rows than the batch has tokens (CUDA-graph buckets, DP-attention padding):
those rows are never read. Fewer rows than tokens is a
:class:`flatgather.PlanError`, the one error of flatgather's own here: the
release's function returns states shorter than its ``sample_indices`` assume.

Where lazy aux pruning is on, the aux result it returns inside ``forward`` is
lazy (:mod:`~flatgather.sglang.patches.pruned_states.lazy_aux`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flatgather._core import PrunePlan
from flatgather._errors import PlanError
from flatgather._staging import stage
from flatgather.sglang.patches.pruned_states.lazy_aux import (
    LazyAuxPruned,
    LazyGate,
    copy_rows,
    lazy_pays,
)

__all__ = ["Contract", "make_pruned_states", "uses_release_code"]


@dataclass(frozen=True)
class Contract:
    """What the running release's ``_get_pruned_states`` returns in its
    logprob branch, as :mod:`flatgather.sglang.patches.pruned_states.probe` found it."""

    trailing_token_to_seq: bool
    """``token_to_seq_idx`` ends with the last request's index once more
    (releases before 0.5.16)."""
    packed_aux: bool
    """EAGLE3 aux hidden states may come as one packed tensor (0.5.17 on);
    otherwise a packed tensor is handed to the release's own code."""
    writes_cpu_indices: bool
    """The branch stores ``sample_indices_cpu`` and
    ``input_logprob_indices_cpu`` (lists) on the metadata (0.5.21 on)."""
    prunes_aux: bool
    """The branch prunes list aux layers (SGLang PR #21589). False means the
    release drops them (0.5.10): flatgather then prunes them, the backport
    ``aux-logprob-prune``."""

    @property
    def backports(self) -> tuple[str, ...]:
        return () if self.prunes_aux else ("aux-logprob-prune",)

    def describe(self) -> str:
        return (
            f"trailing token_to_seq entry: {'yes' if self.trailing_token_to_seq else 'no'}; "
            f"packed aux: {'yes' if self.packed_aux else 'no'}; "
            f"writes *_indices_cpu: {'yes' if self.writes_cpu_indices else 'no'}; "
            f"prunes aux: {'yes' if self.prunes_aux else 'no (backported)'}"
        )


# How each ForwardMode is routed, worked out once per mode: "release" (the
# decode / verify / draft-extend branch), "extend" (the release's branch
# without logprobs, or the logprob branch) or "logprob".
_routes: dict = {}


def _route(mode) -> str:
    key = (type(mode), mode)  # IntEnum members of different enums compare equal
    route = _routes.get(key)
    if route is None:
        if mode.is_decode_or_idle() or mode.is_target_verify() or mode.is_draft_extend_v2():
            route = "release"
        else:
            route = "extend" if mode.is_extend() else "logprob"
        _routes[key] = route
    return route


def uses_release_code(metadata) -> bool:
    """True where the release's other branches apply: the same tests, in the
    same order, as its ``_get_pruned_states`` (the probe checks this against
    every ``ForwardMode`` of the running release)."""
    route = _route(metadata.forward_mode)
    return route == "release" or (route == "extend" and not metadata.extend_return_logprob)


def _check_rows(hidden_states, hidden_states_before_norm, aux_hidden_states, tokens: int) -> None:
    """Raise :class:`PlanError` naming the first tensor with fewer rows than
    the batch has tokens."""
    named = [("hidden_states", hidden_states)]
    if hidden_states_before_norm is not None:
        named.append(("hidden_states_before_norm", hidden_states_before_norm))
    if isinstance(aux_hidden_states, torch.Tensor):
        named.append(("aux_hidden_states", aux_hidden_states))
    elif aux_hidden_states is not None:
        named += [(f"aux_hidden_states[{j}]", t) for j, t in enumerate(aux_hidden_states)]
    for name, tensor in named:
        rows = tensor.shape[0]
        if rows < tokens:
            raise PlanError(
                f"{name} has {rows} rows, but the batch has {tokens} tokens", "too_few_rows"
            )


def make_pruned_states(
    original: Callable,
    contract: Contract,
    gate: LazyGate | None = None,
    lazy_full: bool = False,
    store: Callable | None = None,
) -> Callable:
    """A ``_get_pruned_states`` that returns what ``original`` returns under
    ``contract``, with one plan, one host-to-device copy and one
    ``index_select`` per tensor in the logprob branch. With a ``gate``, aux
    layers are pruned lazily inside the forwards it counts, for a processor
    whose class's ``_get_hidden_states_to_store`` is ``store`` (the wrapper
    that resolves them); under FULL capture only with ``lazy_full`` (none of
    them is then gathered)."""

    def _plan(hidden_states, aux_hidden_states, logits_metadata):
        """The batch's plan, or None where the release's own code runs."""
        if torch.compiler.is_compiling() or uses_release_code(logits_metadata):
            return None
        if isinstance(aux_hidden_states, torch.Tensor) and not contract.packed_aux:
            return None  # a packed tensor this release does not know
        if hidden_states.is_cuda and torch.cuda.is_current_stream_capturing():
            # A CUDA graph must not capture a copy from our reused host buffers.
            return None
        try:
            return PrunePlan(
                logits_metadata.extend_seq_lens_cpu, logits_metadata.extend_logprob_start_lens_cpu
            )
        except PlanError:
            # Metadata outside the plan (a request with no token, as SGLang
            # pads batches with them; lengths and starts of different counts,
            # which the release zips; a start past its length, which fails
            # the release's own assert; ...): the release's code decides.
            return None

    @functools.wraps(original)
    def _get_pruned_states(
        self, hidden_states, hidden_states_before_norm, aux_hidden_states, logits_metadata
    ):
        plan = _plan(hidden_states, aux_hidden_states, logits_metadata)
        if plan is None:
            return original(
                self, hidden_states, hidden_states_before_norm, aux_hidden_states, logits_metadata
            )
        packed = isinstance(aux_hidden_states, torch.Tensor)
        tensors = [hidden_states]
        if hidden_states_before_norm is not None:
            tensors.append(hidden_states_before_norm)
        if packed:
            tensors.append(aux_hidden_states)
        elif aux_hidden_states is not None:
            tensors += aux_hidden_states
        tokens = plan.num_tokens
        for tensor in tensors:
            if tensor.dim() == 0 or tensor.shape[0] < tokens:
                # No rows to slice (the release's code fails its own way), or
                # too few: said in the order of the release's arguments.
                if any(t.dim() == 0 for t in tensors):
                    return original(
                        self,
                        hidden_states,
                        hidden_states_before_norm,
                        aux_hidden_states,
                        logits_metadata,
                    )
                _check_rows(hidden_states, hidden_states_before_norm, aux_hidden_states, tokens)
        device = hidden_states.device
        if plan.batch_size == 1:
            # One request keeps one run of rows: copied as the release copies
            # it, and its index sets (two ranges) made on the device, with no
            # host-to-device copy.
            rows = slice(plan.num_tokens - plan.num_pruned, plan.num_tokens)
            gather = None
            sample_indices = torch.arange(plan.num_pruned - 1, plan.num_pruned, device=device)
            input_logprob_indices = torch.arange(plan.num_input_logprob, device=device)

            def take(tensor):
                return copy_rows(tensor, rows)
        else:
            index = stage(
                plan.buffer_len(False), functools.partial(plan.fill, token_to_seq=False), device
            )
            gather, sample_indices, input_logprob_indices = index.split_with_sizes(
                (plan.num_pruned, plan.batch_size, plan.num_input_logprob)
            )

            def take(tensor):
                return tensor.index_select(0, gather)

        pruned_states = take(hidden_states)
        pruned_states_before_norm = (
            None if hidden_states_before_norm is None else take(hidden_states_before_norm)
        )
        if aux_hidden_states is None:
            aux_pruned_states = None
        elif (
            gate is not None
            and gate.current()
            # A subclass's own store would be handed the lazy object unresolved.
            and store is not None
            and getattr(type(self), "_get_hidden_states_to_store", None) is store
            and lazy_pays(logits_metadata, plan, lazy_full)
        ):
            aux_pruned_states = LazyAuxPruned(
                aux_hidden_states, gather, sample_indices, plan.num_tokens - 1
            )
        elif packed:
            aux_pruned_states = take(aux_hidden_states)
        else:
            aux_pruned_states = [take(layer) for layer in aux_hidden_states]

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
