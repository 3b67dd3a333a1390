"""What the rewritten ``EagleDraftWorker._draft_extend_for_prefill`` calls in
place of its per-request rotation loop, on every prefill step of the server:
:func:`takes` decides whether the lengths go to :func:`rotate` at all, and
:func:`rotate` gathers, or hands the batch back to the release's own loop.

How the method is rewritten to call these, and why, is told in
:mod:`flatgather.sglang.patches.draft_prefill`.
"""

from __future__ import annotations

import torch

from flatgather._core import RotationPlan
from flatgather._staging import stage

__all__ = ["rotate", "takes"]


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _as_list(lens):
    # A tensor of lengths is iterated element by element by the release (one
    # sync each on a GPU); one ``tolist`` reads them all.
    if isinstance(lens, torch.Tensor):
        return lens.tolist() if lens.dim() == 1 else None
    if isinstance(lens, (list, tuple)):
        return lens
    return None


def takes(lens) -> bool:
    """Whether :func:`rotate` may take lengths ``lens`` (a list or tuple, or
    a 1-D tensor, of two or more): the rewritten method evaluates the loop's
    other expressions for :func:`rotate` only then, when the release's loop
    too would evaluate them (it iterates at least once). Anything else goes
    to the release's loop, which evaluates what it evaluates."""
    if isinstance(lens, (list, tuple)):
        return len(lens) >= 2
    return isinstance(lens, torch.Tensor) and lens.dim() == 1 and lens.shape[0] >= 2


def rotate(src, lens, tails, dst, mm, mm_dst, pt) -> int | None:
    """Write the rotated ``src`` into ``dst`` and, when ``mm`` is given, the
    rotated ``mm`` into ``mm_dst``, as the release's loop does, and return the
    loop's final ``pt``; or return None, having touched nothing, for any input
    this does not reproduce exactly (the release's loop then runs).

    Row ``j`` of request ``i`` takes row ``j + 1`` of its request, and its last
    row takes ``tails[i]`` (cast to ``src``'s dtype, as the release's copy
    casts it). ``dst`` may be ``src`` itself (the releases that rotate in
    place). The last row of each request of ``mm_dst`` is left to whatever the
    gather puts there: the release leaves it unwritten.
    """
    if torch.compiler.is_compiling():
        return None  # compiled code traces the release's loop: no graph break
    if type(pt) is not int or pt != 0:
        return None
    if isinstance(lens, (list, tuple)) and len(lens) < 2:
        # One request: the release's loop is a slice, a cat and a copy, which
        # the plan, its copy and the gather cannot beat. Decided first, so
        # that handing it back costs next to nothing.
        return None
    if not (
        isinstance(src, torch.Tensor)
        and isinstance(tails, torch.Tensor)
        and isinstance(dst, torch.Tensor)
    ):
        return None
    if src.dim() != 1 or tails.dim() != 1 or dst.shape != src.shape or dst.dtype != src.dtype:
        return None
    if tails.dtype != src.dtype and not (_integer(tails.dtype) and _integer(src.dtype)):
        return None  # a cast the release's cat + copy might do differently
    device = src.device
    if tails.device != device or dst.device != device or not dst.is_contiguous():
        return None
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # A CUDA graph must not capture a copy from our reused host buffers.
        return None
    if dst is not src and _shares_memory(dst, src):
        return None
    if mm is not None:
        if not (isinstance(mm, torch.Tensor) and isinstance(mm_dst, torch.Tensor)):
            return None
        if mm.dim() == 0 or mm.shape[0] != src.shape[0] or mm_dst.shape != mm.shape:
            return None
        if mm_dst.dtype != mm.dtype or mm.device != device or mm_dst.device != device:
            return None
        if not mm_dst.is_contiguous() or _shares_memory(mm_dst, mm):
            return None
        if torch.is_grad_enabled() and (mm.requires_grad or mm_dst.requires_grad):
            return None  # out= refuses autograd
    values = _as_list(lens)
    if values is None:
        return None
    try:
        plan = RotationPlan(values, src.shape[0])
    except Exception:  # zero, negative or non-integer lengths, a wrong total: the release's loop
        return None
    if plan.batch_size < 2 or tails.shape[0] != plan.batch_size:
        return None  # one request (lengths in a tensor), or a tail per request missing
    n = plan.num_tokens
    with_mm = mm is not None
    index = stage(plan.buffer_len(with_mm), lambda out: plan.fill(out, with_mm), device)
    if tails.dtype != src.dtype:
        tails = tails.to(src.dtype)
    torch.index_select(torch.cat((src, tails)), 0, index[:n] if with_mm else index, out=dst)
    if with_mm:
        torch.index_select(mm, 0, index[n:], out=mm_dst)
    return pt + n
