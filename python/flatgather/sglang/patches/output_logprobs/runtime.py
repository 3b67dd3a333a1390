"""The output logprobs of a decode or verify step, flat from the device to
the scheduler.

When requests ask for top logprobs or token-id logprobs, every decode step
(in EAGLE spec v2, every verify step, with ``A = steps + 1`` rows per
request) hands the scheduler one entry per row, built by a chain of three
per-row loops:

1. ``get_top_logprobs`` / ``get_token_ids_logprobs`` (called with
   ``no_copy_to_cpu=True`` by the release's spec logprob function and by its
   plain decode sampler) make a view per row of the top-k tensor, or a
   host-to-device copy of the ids and an index per row;
2. ``GenerationBatchResult.copy_to_cpu`` copies each row to the host (a
   pinned tensor, a copy and a ``record_stream`` per row);
3. the scheduler (``_normalize_decode_outputs``, ``move_logprobs_to_cpu``, or
   inline before 0.5.13) calls ``.tolist()`` on each row.

Here each stage does one thing per tensor instead, and still hands the next
stage exactly what the release's next stage accepts: a plain ``list`` of
per-row tensors (views of one flat tensor, cut by one ``split`` or
``unbind``). Alongside, the list is registered with the flat tensor it was
cut from and its :class:`flatgather._core.SpecLogprobsPlan`; the next stage
of flatgather's finds it by identity and works on the flat tensor. Any stage
that is the release's own, or any list that is not the one registered, just
sees per-row tensors, so every mix of patched and stock stages gives the
release's answer (a partial install, an uninstall between two stages).

Stages 2 and 3 are the release's own methods with only their per-row
comprehensions replaced (:mod:`flatgather.sglang.patches.output_logprobs`): each
``[elt(v) for v in rows]`` becomes ``rows_to_host(rows, lambda v: elt)`` or
``rows_tolist(rows, lambda v: elt)``, which apply the release's own ``elt``
to the flat tensor once (its pinned copy with ``record_stream``, its
``.tolist()``), at the very place the loop was, so the copy is issued on the
same stream before the same ``copy_done`` event, and the host copy is read
only where the release reads it, after that event.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable

import torch

from flatgather._core import SpecLogprobsPlan
from flatgather._errors import PlanError
from flatgather._staging import stage

__all__ = [
    "TOKEN_IDS",
    "TOP",
    "clear",
    "make_token_ids_logprobs",
    "make_top_logprobs",
    "registered",
    "rows_to_host",
    "rows_tolist",
    "take",
]

TOP = "get_top_logprobs"
TOKEN_IDS = "get_token_ids_logprobs"

MIN_ROWS = 2
"""Below this many rows the release's own function runs (and so its chain):
one row is as cheap there."""

_LIVE_MAX = 64
"""Registered lists kept at most. An overlapped step keeps about six alive;
a list that no stage of flatgather's consumes (a path that reads it another
way) is forgotten after this many, and with it the tensor it held."""


def _views(plan: SpecLogprobsPlan, flat: torch.Tensor) -> list:
    """The per-row tensors of ``plan``, cut from ``flat`` (the flat tensor,
    or its host copy) as the release's rows lie in it: one C++ call."""
    if plan.width is None:
        return list(flat.split(plan.split_sizes()))
    if plan.uniform:
        return list(flat.unbind(0))
    return list(flat.view(-1).split(plan.split_sizes())[::2])


class _Flat:
    """A registered list of per-row tensors and the flat tensor they were
    cut from: ``[rows, max_k]`` for top logprobs (flattened when the rows
    keep different numbers), 1-D for token ids."""

    __slots__ = ("first", "flat", "last", "n", "plan", "rows")

    def __init__(self, rows: list, flat: torch.Tensor, plan: SpecLogprobsPlan) -> None:
        self.rows = rows
        self.n = len(rows)
        self.first = rows[0]
        self.last = rows[-1]
        self.flat = flat
        self.plan = plan

    def tolist(self, elt: Callable) -> list:
        """Every row as a list: ``elt`` (the release's ``v.tolist()``) once on
        the flat tensor, then cut."""
        plan = self.plan
        if plan.uniform:
            return elt(self.flat)
        flat = self.flat if plan.width is None else self.flat.view(-1)
        return plan.rows_of(elt(flat))


_lock = threading.Lock()
_live: OrderedDict[int, _Flat] = OrderedDict()


def _register(entry: _Flat) -> list:
    with _lock:
        _live[id(entry.rows)] = entry
        while len(_live) > _LIVE_MAX:
            _live.popitem(last=False)
    return entry.rows


def take(rows) -> _Flat | None:
    """The entry of ``rows`` if it is a registered list, unchanged; it is
    forgotten either way (each list is consumed once). Each helper asks it
    once per call, and takes its flat path exactly when it answers an entry
    (what a trace of the helpers watches)."""
    if type(rows) is not list or not rows:
        return None
    with _lock:
        entry = _live.pop(id(rows), None)
    # The entry holds the list, so its id cannot have been reused; a list
    # that was changed since is left to the release's loop.
    if (
        entry is None
        or entry.rows is not rows
        or len(rows) != entry.n
        or rows[0] is not entry.first
        or rows[-1] is not entry.last
    ):
        return None
    return entry


def clear() -> None:
    """Forget every registered list (``uninstall()``)."""
    with _lock:
        _live.clear()


def registered(rows) -> bool:
    """Whether ``rows`` is a list registered with its flat tensor."""
    with _lock:
        entry = _live.get(id(rows))
    return entry is not None and entry.rows is rows


def rows_to_host(rows, elt: Callable) -> list:
    """``[elt(v) for v in rows]``, where ``elt`` is the release's per-row
    copy to the host (``copy_to_cpu``): for a registered list, ``elt`` once
    on the flat tensor, and the rows as views of that one host copy,
    registered in turn."""
    entry = take(rows)
    if entry is None:
        return [elt(v) for v in rows]
    host = elt(entry.flat)
    out = _views(entry.plan, host)
    return _register(_Flat(out, host, entry.plan))


def rows_tolist(rows, elt: Callable) -> list:
    """``[elt(v) for v in rows]``, where ``elt`` is the release's
    ``v.tolist()``: for a registered list, one ``.tolist()`` of the flat
    tensor, cut into the rows' lists."""
    entry = take(rows)
    if entry is None:
        return [elt(v) for v in rows]
    return entry.tolist(elt)


def _eligible(logprobs, rows_list, no_copy_to_cpu) -> bool:
    if no_copy_to_cpu is not True or type(rows_list) is not list:
        return False
    if len(rows_list) < MIN_ROWS or torch.compiler.is_compiling():
        return False
    if not (isinstance(logprobs, torch.Tensor) and logprobs.dim() == 2):
        return False
    # A graph must not capture a copy from reused host buffers, nor the
    # registration (host state) of tensors it would overwrite on replay.
    return not (logprobs.is_cuda and torch.cuda.is_current_stream_capturing())


def _planned(make, logprobs, rows_list, no_copy_to_cpu):
    """The plan of this call (``make(rows_list, rows, vocab)``), or None
    where the release's own function answers it."""
    if not _eligible(logprobs, rows_list, no_copy_to_cpu):
        return None
    rows, vocab = logprobs.shape
    try:
        return make(rows_list, rows, vocab)
    except PlanError:
        return None


def make_top_logprobs(original: Callable, on_answer: Callable[[], None] | None = None) -> Callable:
    """``get_top_logprobs(logprobs, top_logprobs_nums, no_copy_to_cpu=False)``
    whose answer with ``no_copy_to_cpu=True`` (the decode chain's) is the
    release's, as two registered lists of row views of the top-k tensors.
    ``on_answer`` is called whenever flatgather, not the release, answers
    (the install-time check counts them)."""

    @functools.wraps(original)
    def get_top_logprobs(logprobs, top_logprobs_nums, no_copy_to_cpu=False):
        plan = _planned(SpecLogprobsPlan.top_k, logprobs, top_logprobs_nums, no_copy_to_cpu)
        if plan is None:
            return original(logprobs, top_logprobs_nums, no_copy_to_cpu)
        rows = logprobs.shape[0]
        # The release's own call: max(top_logprobs_nums) on the last dim.
        values, indices = logprobs.topk(plan.width, dim=-1)
        n = plan.num_rows
        if n != rows:
            values, indices = values[:n], indices[:n]
        if not values.is_contiguous():
            return original(logprobs, top_logprobs_nums, no_copy_to_cpu)
        if on_answer is not None:
            on_answer()
        return (
            _register(_Flat(_views(plan, values), values, plan)),
            _register(_Flat(_views(plan, indices), indices, plan)),
        )

    get_top_logprobs.__flatgather__ = TOP
    return get_top_logprobs


def make_token_ids_logprobs(
    original: Callable, none_as_tensor: bool, on_answer: Callable[[], None] | None = None
) -> Callable:
    """``get_token_ids_logprobs(logprobs, token_ids_logprobs,
    no_copy_to_cpu=False)`` whose answer with ``no_copy_to_cpu=True`` is the
    release's: the values at every requested id in one gather, a registered
    list of row views of them, and the id lists themselves. A row without
    ids gets an empty tensor (``none_as_tensor``, SGLang 0.5.21 on) or an
    empty list (before; the list is then not registered, so the release's
    own chain handles what it makes of it)."""

    @functools.wraps(original)
    def get_token_ids_logprobs(logprobs, token_ids_logprobs, no_copy_to_cpu=False):
        plan = _planned(SpecLogprobsPlan.token_ids, logprobs, token_ids_logprobs, no_copy_to_cpu)
        if plan is None:
            return original(logprobs, token_ids_logprobs, no_copy_to_cpu)
        n = plan.num_values
        if n:
            index = stage(n, plan.fill, logprobs.device)
            # take() reads the logprobs in row-major order, whatever their strides.
            values = logprobs.take(index)
        else:
            values = logprobs.new_empty((0,))
        vals = _views(plan, values)
        idxs = [[] if ids is None else ids for ids in token_ids_logprobs]
        if on_answer is not None:
            on_answer()
        none_rows = plan.none_rows()
        if not none_as_tensor and none_rows:
            for row in none_rows:
                vals[row] = []
            return vals, idxs
        return _register(_Flat(vals, values, plan)), idxs

    get_token_ids_logprobs.__flatgather__ = (TOKEN_IDS, none_as_tensor)
    return get_token_ids_logprobs
