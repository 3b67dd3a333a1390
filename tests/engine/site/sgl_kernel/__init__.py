"""A stand-in for the ``sgl_kernel`` ops SGLang's CPU engine imports, for
flatgather's engine tests only.

The PyPI ``sgl-kernel`` wheels are CUDA builds, so a CPU engine cannot load
them. Both sides of every comparison load this package alike (it is put on the
engine's ``PYTHONPATH`` by ``tests/engine``); ``flatgather.sglang.install()``
never does. The index-writing ops are written here in plain torch and each is
checked against the release's own Triton kernel of the same name (run by
Triton's interpreter) in ``tests/test_engine.py``. The two tree ops
call the release's own Triton implementations (those its XPU path uses), so
they need ``TRITON_INTERPRET=1``, as the speculative engine does anyway.

Any other name fails loudly: the import raises, and the name is written to
stderr, so an engine that needs an op nobody checked stops instead of running
something unknown.
"""

from __future__ import annotations

import ctypes
import sys

import torch

__version__ = "0.0.0+flatgather-engine-tests"

OPS = (
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
)
"""Every op this stand-in has."""


def _runs(start_offset: torch.Tensor, end_offset: torch.Tensor):
    """(request, start, end, offset of its run in the packed output)."""
    taken = 0
    for i, (start, end) in enumerate(zip(start_offset.tolist(), end_offset.tolist(), strict=True)):
        yield i, start, end, taken
        taken += max(end - start, 0)


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
) -> None:
    """Scatter: request i's run of ``out_cache_loc`` (runs packed in request
    order) goes to its row of ``req_to_token``, columns ``start:end``."""
    del pool_len  # the row width, which the tensor knows
    rows = req_pool_indices.tolist()
    for i, start, end, at in _runs(start_offset, end_offset):
        if end > start:
            req_to_token[rows[i], start:end] = out_cache_loc[at : at + end - start]


def assign_extend_cache_locs_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
) -> None:
    """Gather, the inverse of :func:`assign_req_to_token_pool_cpu`: request
    i's columns ``start:end`` of its row, packed into ``out_cache_loc``."""
    del pool_len
    rows = req_pool_indices.tolist()
    for i, start, end, at in _runs(start_offset, end_offset):
        if end > start:
            out_cache_loc[at : at + end - start] = req_to_token[rows[i], start:end]


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_steps
) -> None:
    """Request i's ``topk * num_steps`` slots from its ``seq_len`` on, into
    block i of ``out_cache_loc``."""
    del pool_len
    n = topk * num_steps
    for i, (row, start) in enumerate(
        zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ):
        out_cache_loc[i * n : (i + 1) * n] = req_to_token[row, start : start + n]


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc) -> None:
    """In every buffer (a raw address and a row width in bytes), copy rows
    ``src_loc`` to rows ``tgt_loc``; all rows are read before any is
    written, so overlapping copies are safe."""
    src, tgt = src_loc.tolist(), tgt_loc.tolist()
    if not src:
        return
    rows = max(max(src), max(tgt)) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(address)
        view = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        view[tgt] = view[src].clone()


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc) -> None:
    """The cache slots of the accepted tokens, in order, skipping ``-1``."""
    kept = accept_index[accept_index != -1]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept]


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride) -> None:
    """Row i's last accepted token (``accept_lens`` counts the bonus)."""
    flat = accept_tokens.reshape(-1)
    rows = torch.arange(accept_lens.numel(), dtype=torch.int64)
    bonus_tokens.copy_(flat[rows * accept_stride + accept_lens.long() - 1].to(bonus_tokens.dtype))


TREE_MODULES = ("sglang.kernels.ops.speculative.spec_tree", "sglang.srt.speculative.eagle_utils")
"""Where releases keep their Triton tree ops (0.5.23; up to 0.5.22)."""


def release_object(name: str, modules: tuple[str, ...]):
    """The running release's ``name`` from the first of ``modules`` that has
    it (releases move their kernels between modules), or None."""
    import importlib

    for module in modules:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found
    return None


def _release_op(name: str):
    found = release_object(name, TREE_MODULES)
    if found is None:
        raise AttributeError(f"this SGLang release has no {name} in {TREE_MODULES}")
    return found


def build_tree_kernel_efficient_cpu(*args) -> None:
    """The release's own Triton tree builder (needs ``TRITON_INTERPRET=1``)."""
    _release_op("sgl_build_tree_kernel_triton")(*args)


def verify_tree_greedy_cpu(**kwargs) -> None:
    """The release's own Triton greedy verify (needs ``TRITON_INTERPRET=1``);
    the CPU call site spells the retrieve arguments ``retrive_*``."""
    renamed = {k.replace("retrive_", "retrieve_"): v for k, v in kwargs.items()}
    _release_op("verify_tree_greedy_triton")(**renamed)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    print(f"sgl_kernel stand-in: the engine asked for {name!r}, which it lacks", file=sys.stderr)
    raise AttributeError(f"flatgather's sgl_kernel stand-in has no op {name!r} (it has {OPS})")
