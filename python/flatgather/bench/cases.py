"""Batches for the ``pruned-states`` and ``host-cost`` sections: shapes,
their inputs, and the reference ways of computing the same pruned states."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from flatgather.bench.batches import make_states

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


DTYPE_WORDS = {"bf16": "bf16", "fp32": "fp32"}


@dataclass(frozen=True)
class Shape:
    batch: int
    mean_extend: int
    hidden: int
    dtype: str
    layers: int
    aux: str
    """"none", "list" (one tensor per layer) or "packed" (one tensor)."""

    @property
    def aux_words(self) -> str:
        if self.aux == "none":
            return "no aux layers"
        return f"{self.layers} aux layers ({self.aux})"

    @property
    def series(self) -> str:
        """The shape less its batch size, in words (a plot legend)."""
        return (
            f"hidden {self.hidden}, {DTYPE_WORDS[self.dtype]}, "
            f"mean prompt {self.mean_extend} tokens, {self.aux_words}"
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    mean_extends: tuple[int, ...]
    hiddens: tuple[int, ...]
    dtypes: tuple[str, ...]
    aux: tuple[tuple[int, str], ...]
    max_tokens: int

    def shapes(self, packed_supported: bool) -> list[Shape]:
        aux = [a for a in self.aux if a[1] != "packed" or packed_supported]
        return [
            Shape(b, m, h, d, layers, kind)
            for (h, d, (layers, kind), m, b) in itertools.product(
                self.hiddens, self.dtypes, aux, self.mean_extends, self.batches
            )
        ]


MAX_INPUT_BYTES = 3 << 30
"""Token budgets are cut further so no shape holds more than this in inputs."""


def lengths(shape: Shape, max_tokens: int) -> tuple[list[int], list[int]]:
    """A serving-like batch: extend lengths uniform around the mean, a
    quarter of the requests chunked-prefill chunks (start == extend), a
    quarter scored from their first token, the rest from a random start.
    Scaled down to the token budget, as a scheduler's budget would."""
    rng = np.random.default_rng([shape.batch, shape.mean_extend])
    extend = rng.integers(1, 2 * shape.mean_extend, size=shape.batch, endpoint=False)
    row_bytes = shape.hidden * (1 + shape.layers) * torch.finfo(DTYPES[shape.dtype]).bits // 8
    budget = min(max_tokens, MAX_INPUT_BYTES // max(row_bytes, 1))
    if extend.sum() > budget:
        extend = np.maximum(1, (extend * (budget / extend.sum())).astype(np.int64))
    kind = rng.integers(0, 4, size=shape.batch)
    start = np.where(kind == 0, extend, np.where(kind == 1, 0, rng.integers(0, extend)))
    return extend.tolist(), start.tolist()


@dataclass
class Inputs:
    extend: list[int]
    start: list[int]
    hidden: torch.Tensor
    aux: list[torch.Tensor] | torch.Tensor | None

    @property
    def tokens(self) -> int:
        return sum(self.extend)


def make_inputs(shape: Shape, max_tokens: int, device: torch.device) -> Inputs:
    extend, start = lengths(shape, max_tokens)
    dtype = DTYPES[shape.dtype]
    hidden, _, aux = make_states(
        extend, shape.batch, dtype, shape.hidden, False, shape.aux, shape.layers, device=device
    )
    return Inputs(extend, start, hidden, aux)


def numpy_indices(extend, start) -> tuple[np.ndarray, int, int, np.ndarray]:
    """The anchor: every index set with vectorised NumPy (the way vLLM's v1
    worker builds batch metadata). Returns ``gather | sample |
    input_logprob`` in one array, the two lengths, and ``token_to_seq``."""
    e = np.asarray(extend, dtype=np.int64)
    s = np.asarray(start, dtype=np.int64)
    first = np.where(s == e, e - 1, s)
    kept = e - first
    pruned_end = np.cumsum(kept)
    n = int(pruned_end[-1])
    row_shift = np.repeat(np.cumsum(e) - e + first - (pruned_end - kept), kept)
    gather = row_shift + np.arange(n)
    sample = pruned_end - 1
    input_logprob = np.flatnonzero(np.repeat(s < e, kept))
    token_to_seq = np.repeat(np.arange(e.size), kept)
    return np.concatenate([gather, sample, input_logprob]), n, input_logprob.size, token_to_seq


def make_numpy_anchor(writes_cpu_indices: bool, trailing: bool) -> Callable:
    """A ``_get_pruned_states`` logprob branch built on :func:`numpy_indices`
    and one ``index_select`` per tensor, returning the release's 6-tuple."""

    def pruned_states(self, hidden, before_norm, aux, md):
        flat, n, m, token_to_seq = numpy_indices(
            md.extend_seq_lens_cpu, md.extend_logprob_start_lens_cpu
        )
        b = len(md.extend_seq_lens_cpu)
        index = torch.from_numpy(flat)
        if hidden.device.type != "cpu":
            index = index.pin_memory().to(hidden.device, non_blocking=True)
        gather, sample, input_logprob = index.split_with_sizes((n, b, m))
        pruned = hidden.index_select(0, gather)
        pruned_before = None if before_norm is None else before_norm.index_select(0, gather)
        if aux is None:
            aux_pruned = None
        elif isinstance(aux, torch.Tensor):
            aux_pruned = aux.index_select(0, gather)
        else:
            aux_pruned = [layer.index_select(0, gather) for layer in aux]
        if writes_cpu_indices:
            md.sample_indices_cpu = flat[n : n + b].tolist()
            md.input_logprob_indices_cpu = flat[n + b :].tolist()
        t2s = token_to_seq.tolist()
        if trailing:
            t2s.append(b - 1)
        return pruned, pruned_before, aux_pruned, sample, input_logprob, t2s

    return pruned_states


def gathered_tensors(inputs: Inputs) -> list[torch.Tensor]:
    """Every tensor the logprob branch gathers from (before-norm states aside)."""
    if isinstance(inputs.aux, torch.Tensor):
        return [inputs.hidden, inputs.aux]
    return [inputs.hidden, *(inputs.aux or ())]


def memcpy_bound(inputs: Inputs, num_pruned: int) -> Callable[[], object]:
    """The same bytes as the gather, copied contiguously into fresh tensors."""
    heads = [t[:num_pruned] for t in gathered_tensors(inputs)]

    def copy():
        return [t.clone() for t in heads]

    return copy


def gathered_bytes(inputs: Inputs, num_pruned: int) -> int:
    return sum(num_pruned * t.shape[1] * t.element_size() for t in gathered_tensors(inputs))
