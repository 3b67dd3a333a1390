"""The token-id input logprobs in one gather.

When requests ask for the input logprobs of given token ids, SGLang's
input-logprob code walks the requests one by one: for each it builds the ids
into a tensor (a blocking host-to-device copy of a Python list), indexes the
logprobs at the request's rows, and calls ``.tolist()`` (a host sync), so a
prefill batch of B such requests costs about 4B kernels and B syncs; before
0.5.21 it went row by row. The functions, as the releases call them:

* ``get_token_ids_logprobs_chunk`` (every release; the only path from 0.5.16
  on, and the chunked path before): one chunk of rows, requests split across
  chunks continuing their previous entry;
* ``get_token_ids_logprobs_prefill`` (0.5.10 to 0.5.15, the unchunked path):
  the whole batch at once.

Their replacements build every ``(row, id)`` pair of the call in Rust
(:class:`flatgather._core.TokenIdsPlan`, from the pruned lengths and the id
lists), stage them with one host-to-device copy, gather every value with one
index (and normalize them with one subtraction each, where the release hands
raw logits and a per-row normalizer), and make one ``.tolist()``; the plan
then nests the values into the very lists the release appends. On the pinned
path (0.5.21 on, ``copy_to_pinned_cpu``) the values go to the host in one
copy, through the release's own ``async_d2h``, and each request gets a view
of it where the release gives it a copy of its own.

Anything the replacement does not reproduce exactly goes to the release's own
function, untouched: a batch of one request (cheaper there), compiled code,
CUDA-graph capture, ids that are not lists of ints or lie outside the
vocabulary, a request without ids where the release fails on it, rows past
the logprobs where it silently truncates, arguments it does not know.
Which functions are patched, and how each walks its requests, is decided
and verified at install by :mod:`flatgather.sglang.patches.input_logprobs`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flatgather._core import TokenIdsPlan
from flatgather._errors import PlanError
from flatgather._staging import stage

__all__ = ["CHUNK", "PREFILL", "Walk", "make_chunk", "make_prefill", "token_ids"]

CHUNK = "get_token_ids_logprobs_chunk"
PREFILL = "get_token_ids_logprobs_prefill"

# The parameters of the chunk function, by position (the releases name the
# two output lists differently), and the keywords of the newer ones.
_CHUNK_POSITIONS = 6
_CHUNK_KEYWORDS = ("log_normalizer", "copy_to_pinned_cpu")

_MIN_REQUESTS = 2
"""Below this many requests the release's own loop is as cheap."""


@dataclass(frozen=True)
class Walk:
    """How a release's function walks its requests (see
    :class:`flatgather._core.TokenIdsPlan`)."""

    skip_empty: bool
    """No entry for a request without values; nothing for an empty chunk
    (SGLang 0.5.10 to 0.5.15)."""


def token_ids(
    logprobs,
    ids_lists,
    pruned_lens,
    val_out,
    idx_out,
    split,
    walk: Walk,
    whole: bool = False,
    normalizer=None,
    to_host: Callable | None = None,
) -> int | None:
    """Append to ``val_out`` and ``idx_out`` what the release's function
    appends and return what it returns, or return None, having touched
    nothing, where the release's own function must run.

    ``normalizer`` is the release's per-row ``(max, log_sum)`` where
    ``logprobs`` are raw logits; ``to_host`` is the release's ``async_d2h``
    on the pinned path (each request then gets views of one host copy)."""
    if torch.compiler.is_compiling():
        return None
    if not (isinstance(logprobs, torch.Tensor) and logprobs.dim() == 2):
        return None
    if not (type(val_out) is list and type(idx_out) is list and type(split) is int):
        return None
    if type(ids_lists) is not list or type(pruned_lens) is not list:
        return None
    if min(len(ids_lists), len(pruned_lens)) < _MIN_REQUESTS:
        return None
    device = logprobs.device
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None  # a graph must not capture a copy from reused host buffers
    if normalizer is not None and not (
        isinstance(normalizer, tuple)
        and len(normalizer) == 2
        and all(isinstance(t, torch.Tensor) and t.dim() == 1 for t in normalizer)
    ):
        return None
    rows, vocab = logprobs.shape
    try:
        plan = TokenIdsPlan(
            pruned_lens, ids_lists, vocab, rows, split, skip_empty=walk.skip_empty, whole=whole
        )
    except PlanError:
        return None
    if plan.extends and not (val_out and idx_out):
        return None  # the release fails on the missing entry to extend
    n = plan.num_values
    if n == 0 and to_host is not None:
        return None  # nothing to copy; the release's empty spans keep their dtype
    values = None
    if n:
        rows = normalizer is not None
        index = stage(plan.buffer_len(rows), functools.partial(plan.fill, rows=rows), device)
        # take() reads the logprobs in row-major order, whatever their strides.
        values = logprobs.take(index[:n])
        if normalizer is not None:
            row = index[n:]
            row_max, row_log_sum = normalizer
            values = (values.float() - row_max.index_select(0, row)) - row_log_sum.index_select(
                0, row
            )
    if to_host is None:
        plan.nest([] if values is None else values.tolist(), ids_lists, val_out, idx_out)
    else:
        _nest_spans(plan, to_host(values), ids_lists, val_out, idx_out)
    return plan.next_split


def _nest_spans(plan, host, ids_lists, val_out, idx_out) -> None:
    """The pinned path: each request's rows as one ``[rows, width]`` view of
    the host copy, in a list (the release's one span per request)."""
    for entry in plan.entries():
        if entry is None:
            val_out.append([])
            idx_out.append([])
            continue
        request, rows, width, value, extend = entry
        val, idx = [], []
        if rows:
            val.append(host[value : value + rows * width].view(rows, width))
            idx.extend([ids_lists[request]] * rows)
        if extend:
            val_out[-1].extend(val)
            idx_out[-1].extend(idx)
        else:
            val_out.append(val)
            idx_out.append(idx)


def make_chunk(
    original: Callable,
    walk: Walk,
    to_host: Callable | None = None,
    on_gather: Callable[[], None] | None = None,
) -> Callable:
    """``get_token_ids_logprobs_chunk`` in one gather, with ``original``'s
    signature: six positional parameters (the logprobs, the id lists, the
    pruned lengths, the two output lists, the split), and the keywords
    ``log_normalizer`` and ``copy_to_pinned_cpu`` where it has them.
    ``to_host`` is the release's ``async_d2h`` (for ``copy_to_pinned_cpu``);
    ``on_gather`` is called whenever the gather, not the release, answers
    (the install-time check counts them)."""
    params = list(inspect.signature(original).parameters.values())
    names = [p.name for p in params]
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    plain = all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    if not plain or len(names) < _CHUNK_POSITIONS or not set(names[6:]) <= set(_CHUNK_KEYWORDS):
        raise TypeError(f"{original.__qualname__}{inspect.signature(original)}: not a known shape")

    known = frozenset(names)

    @functools.wraps(original)
    def get_token_ids_logprobs_chunk(*args, **kwargs):
        # Decided first, so that handing a small chunk back costs next to nothing.
        if len(args) > 2 and type(args[2]) is list and len(args[2]) < _MIN_REQUESTS:
            return original(*args, **kwargs)
        if len(args) > len(names) or not kwargs.keys() <= known:
            return original(*args, **kwargs)
        bound = {**defaults, **dict(zip(names, args, strict=False)), **kwargs}
        if len(bound) != len(names):
            return original(*args, **kwargs)  # a parameter missing: its TypeError
        logprobs, ids_lists, pruned_lens, val_out, idx_out, split = (
            bound[n] for n in names[:_CHUNK_POSITIONS]
        )
        pinned = bound.get("copy_to_pinned_cpu", False)
        if pinned is not False and (pinned is not True or to_host is None):
            return original(*args, **kwargs)
        end = token_ids(
            logprobs,
            ids_lists,
            pruned_lens,
            val_out,
            idx_out,
            split,
            walk,
            normalizer=bound.get("log_normalizer"),
            to_host=to_host if pinned else None,
        )
        if end is None:
            return original(*args, **kwargs)
        if on_gather is not None:
            on_gather()
        return end

    get_token_ids_logprobs_chunk.__flatgather__ = walk
    return get_token_ids_logprobs_chunk


def make_prefill(original: Callable, on_gather: Callable[[], None] | None = None) -> Callable:
    """``get_token_ids_logprobs_prefill(all_logprobs, logits_metadata,
    no_copy_to_cpu=False)`` in one gather (SGLang 0.5.10 to 0.5.15);
    ``on_gather`` as for :func:`make_chunk`."""

    @functools.wraps(original)
    def get_token_ids_logprobs_prefill(all_logprobs, logits_metadata, no_copy_to_cpu=False):
        if no_copy_to_cpu is False:
            vals, idxs = [], []
            end = token_ids(
                all_logprobs,
                getattr(logits_metadata, "token_ids_logprobs", None),
                getattr(logits_metadata, "extend_logprob_pruned_lens_cpu", None),
                vals,
                idxs,
                0,
                Walk(skip_empty=False),
                whole=True,
            )
            if end is not None:
                if on_gather is not None:
                    on_gather()
                return vals, idxs
        return original(all_logprobs, logits_metadata, no_copy_to_cpu)

    get_token_ids_logprobs_prefill.__flatgather__ = Walk(skip_empty=False)
    return get_token_ids_logprobs_prefill
