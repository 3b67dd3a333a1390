"""The check, before anything is patched, that a replacement of a token-id
input-logprob function does what the release's function does.

:func:`verify` calls the release's own function and the
replacement side by side on small CPU chunks chosen so that every point on
which releases differ shows: requests with nothing to score, no ids, an
empty id list, ragged and negative ids; a chunk boundary inside a request,
the next chunk continuing it, an empty chunk, rows past the last request;
float32 and bfloat16; raw logits with a per-row normalizer and the pinned
path where the function takes them. It compares what each returns (or the
type of what it raises) and everything it leaves in the output lists:
values, Python types, nesting, and the id lists themselves (the release
appends the request's own list object, once per row).

The cases of the chunk function are :data:`CASES`; the whole-batch function
has its own, :data:`WHOLE_CASES`.
"""

from __future__ import annotations

import copy
import itertools
import types
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from flatgather.sglang.check import Answered, side_by_side
from flatgather.sglang.compare import first_difference

__all__ = ["CASES", "WHOLE_CASES", "Call", "answer", "verify", "where"]

VOCAB = 11

# (pruned lengths, ids per request, rows of the chunk, split, whether the
# gather must answer): the chunk cases.
_IDS = ([3, 1], None, [], [2, -1, 2, 10], [0], [-11, 5, 4])
CASES = (
    ([2, 3, 1], [_IDS[0], _IDS[3], _IDS[4]], 6, 0, True),  # every row, ragged ids
    ([2, 0, 3, 2], [_IDS[0], _IDS[0], _IDS[5], _IDS[3]], 7, 0, True),  # nothing to score
    ([3, 2, 4], [_IDS[0], _IDS[1], _IDS[3]], 9, 0, True),  # no ids
    ([2, 2, 1], [_IDS[2], _IDS[0], _IDS[2]], 5, 0, True),  # an empty id list
    ([3, 4, 2], [_IDS[3], _IDS[0], _IDS[4]], 5, 0, True),  # the chunk ends inside a request
    ([3, 2], [_IDS[0], _IDS[5]], 4, 2, True),  # the next chunk continues it
    ([2, 3, 4], [_IDS[0], _IDS[3], _IDS[4]], 7, 0, True),  # ... inside its last request
    ([8, 0], [_IDS[3], _IDS[0]], 3, 2, True),  # continued, and not done in this chunk
    ([2, 1, 1], [_IDS[1], _IDS[0], _IDS[4]], 2, 1, True),  # continuing one without ids
    ([1, 2], [_IDS[0], _IDS[3]], 0, 0, True),  # an empty chunk
    ([0, 2], [_IDS[0], _IDS[3]], 0, 0, True),  # ... with a request of no rows
    ([2, 2], [_IDS[0], _IDS[3]], 3, 1, True),  # one row left of a request with ids
    ([2, 1, -1, 2], [_IDS[0], _IDS[3], _IDS[0], _IDS[4]], 9, 0, True),  # rows to spare
    ([4], [_IDS[3]], 4, 0, False),  # one request: the release's loop is as cheap
    ([2, 2], [_IDS[0], [12]], 4, 0, False),  # an id past the vocabulary: its error
)
# The whole-batch function: the releases fail on a request without ids there
# and truncate past the rows; both go to the release's own code.
WHOLE_CASES = (
    ([2, 3, 1], [_IDS[0], _IDS[3], _IDS[4]], 6, 0, True),
    ([2, 0, 3, 2], [_IDS[0], _IDS[1], _IDS[5], _IDS[2]], 7, 0, True),
    ([3, 2], [_IDS[0], _IDS[1]], 5, 0, False),
    ([3, 4], [_IDS[0], _IDS[3]], 5, 0, False),
)


@dataclass(frozen=True)
class Call:
    """The arguments of one call, fresh for each function called (a
    function appends to the lists it is given). ``split``, ``normalizer``
    and ``pinned`` are the chunk function's alone; ``gathers``: whether the
    replacement must answer with its gather (else the release's loop may)."""

    logprobs: torch.Tensor
    ids: list
    lens: list
    split: int
    normalizer: tuple | None
    pinned: bool
    gathers: bool

    def outputs(self):
        # A request continued from the previous chunk needs an entry to
        # extend: the last of the entries of the requests before it.
        if self.split:
            return [[["a request's row"]], [["earlier row"]]], [[["its ids"]], [["earlier ids"]]]
        return [], []


def _calls(cases, keywords: set[str]) -> Iterator[Call]:
    dtypes = (torch.float32, torch.bfloat16)
    normalized = (False, True) if "log_normalizer" in keywords else (False,)
    pinned = (False, True) if "copy_to_pinned_cpu" in keywords else (False,)
    for seed, ((lens, ids, rows, split, gathers), dtype, norm, pin) in enumerate(
        itertools.product(cases, dtypes, normalized, pinned)
    ):
        gen = torch.Generator().manual_seed(seed)
        # Any values do: only where they land is compared.
        logits = (torch.randn(rows, VOCAB, generator=gen) * 4).to(dtype)
        normalizer = None
        if norm:
            x = logits.float()
            row_max = x.amax(dim=-1) if rows else x.new_zeros(0)
            normalizer = (row_max, torch.logsumexp(x - row_max[:, None], dim=-1))
        # The pinned path leaves a chunk with nothing to copy to the release.
        gathers = gathers and not (pin and rows == 0)
        ids = [copy.copy(i) for i in ids]
        yield Call(logits, ids, list(lens), split, normalizer, pin, gathers)


def answer(fn, call: Call, chunk: bool) -> dict:
    """What ``fn`` (the chunk function, with ``chunk``, else the whole-batch
    one) answers on ``call``: what it returns (or the name of the type it
    raises) and the output lists it leaves, each id list named by the
    request it belongs to."""
    val, idx = call.outputs()
    try:
        if chunk:
            kwargs = {}
            if call.normalizer is not None:
                kwargs["log_normalizer"] = call.normalizer
            if call.pinned:
                kwargs["copy_to_pinned_cpu"] = True
            returned = fn(call.logprobs, call.ids, call.lens, val, idx, call.split, **kwargs)
        else:
            metadata = types.SimpleNamespace(
                token_ids_logprobs=call.ids, extend_logprob_pruned_lens_cpu=call.lens
            )
            returned = fn(call.logprobs, metadata)
            val, idx = returned
            returned = None
    except Exception as exc:  # compared by type: the same failure, or none
        return {"raised": type(exc).__name__}
    # The id lists appended are the request's own objects: name them by index.
    owners = {id(ids): f"ids[{i}]" for i, ids in enumerate(call.ids) if ids is not None}
    named = [
        [owners.get(id(item), item) for item in entry] if isinstance(entry, list) else entry
        for entry in idx
    ]
    return {"returned": returned, "val": val, "idx": named}


def where(call: Call) -> str:
    return (
        f"on pruned lengths {call.lens}, ids {call.ids}, {call.logprobs.shape[0]} rows, "
        f"split {call.split}, {call.logprobs.dtype}"
        f"{', normalized' if call.normalizer is not None else ''}"
        f"{', pinned' if call.pinned else ''}"
    )


def verify(original, replacement, gathers: Answered, cases, chunk: bool) -> str | None:
    """None when ``replacement`` answers as ``original`` on every case of
    ``cases`` (and gathers, counted by ``gathers``, where the case says it
    must); else the first difference."""
    keywords = set(original.__code__.co_varnames[: original.__code__.co_argcount])
    return side_by_side(
        original,
        replacement,
        _calls(cases, keywords),
        lambda fn, call: answer(fn, call, chunk),
        gathers,
        flat=lambda call: call.gathers,
        where=where,
        compare=first_difference,
    )
