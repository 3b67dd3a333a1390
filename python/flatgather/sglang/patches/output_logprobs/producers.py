"""The producers' check: flatgather's ``get_top_logprobs`` and
``get_token_ids_logprobs`` side by side with the release's own, on the cases
below (see the package's docstring, where the patch is)."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from flatgather.sglang.check import Answered, side_by_side
from flatgather.sglang.compare import first_difference
from flatgather.sglang.patches.output_logprobs import runtime as flat_logprobs

VOCAB = 24

# (top-k numbers, rows of the logprobs, whether flatgather answers)
_TOP_CASES = (
    ([0, 0, 1, 1, 20, 20, 5, 5], 8, True),  # 0 / 1 / 20 mixed, A = 2
    ([3, 3, 3, 3, 3, 3], 6, True),  # every row keeps all: the rows as they are
    ([2, 0, 7], 5, True),  # padding rows past the list
    ([4], 1, False),  # one row: the release's loop is as cheap
    ([2, 25], 2, False),  # past the vocabulary: the release's error
    ([2, -1], 2, False),  # a negative number slices from the end there
)
_IDS = ([3, 1], None, [], [2, -1, 23, 2], [0], [-24, 5, 4])
_ID_CASES = (
    ([_IDS[0], _IDS[0], _IDS[3], _IDS[3], _IDS[4], _IDS[4]], 6, True),  # ragged, A = 2
    ([_IDS[0], _IDS[1], _IDS[2], _IDS[5], _IDS[1]], 5, True),  # None and empty mixed
    ([_IDS[2], _IDS[2]], 4, True),  # nothing to gather, padding rows
    ([_IDS[1], _IDS[1], _IDS[1]], 3, True),  # no row asks
    ([_IDS[3]], 1, False),  # one row
    ([_IDS[0], [24]], 2, False),  # an id past the vocabulary: the release's error
    ([_IDS[0], (1, 2)], 2, False),  # ids as a tuple: the release's own conversion
)


def difference(actual, expected, path: str = "result") -> str | None:
    """:func:`flatgather.sglang.compare.first_difference`, strides included:
    a stage hands its rows on as views, and the next stage's copy keeps
    their layout."""
    return first_difference(actual, expected, path, strides=True)


def _host(v):
    """The release's per-row host copy, as every release writes it (on the
    CPU, the row itself)."""
    return v.to("cpu", non_blocking=True) if torch.is_tensor(v) else v


def tolist_each(v):
    return v.tolist()


@dataclass(frozen=True)
class ProducerCall:
    name: str
    logprobs: torch.Tensor
    arg: list
    flat: bool
    """Whether flatgather, not the release, answers."""


_logprobs: dict[tuple[int, torch.dtype], torch.Tensor] = {}


def producer_calls(name: str) -> Iterator[ProducerCall]:
    cases = _TOP_CASES if name == flat_logprobs.TOP else _ID_CASES
    for (arg, rows, flat), dtype in itertools.product(cases, (torch.float32, torch.bfloat16)):
        logprobs = _logprobs.get((rows, dtype))
        if logprobs is None:
            # Any distinct values do: only where they land is compared.
            gen = torch.Generator().manual_seed(rows)
            logprobs = _logprobs[rows, dtype] = (torch.randn(rows, VOCAB, generator=gen) * 4).to(
                dtype
            )
        yield ProducerCall(name, logprobs, [copy.copy(a) for a in arg], flat)


def answer(fn, call: ProducerCall):
    """What ``fn`` returns for ``call`` and what the release's chain (a host
    copy and ``.tolist()`` per row) makes of each list; the id lists named by
    the request whose object they are (the check's comparison, and the
    mutation suite's)."""
    try:
        lists = fn(call.logprobs, call.arg, no_copy_to_cpu=True)
    except Exception as exc:  # compared by type: the same failure, or none
        return {"raised": type(exc).__name__}
    if not isinstance(lists, (tuple, list)) or len(lists) != 2:
        return {"returned": lists}  # a fork's, not two lists: compared as it is
    lists = list(lists)
    if call.name == flat_logprobs.TOKEN_IDS:
        owners = {id(a): f"ids[{i}]" for i, a in enumerate(call.arg) if a}
        lists[1] = [owners.get(id(a), a) for a in lists[1]]
    chain = []
    for rows in lists:
        if call.name == flat_logprobs.TOKEN_IDS and rows is lists[1]:
            continue
        try:
            host = flat_logprobs.rows_to_host(rows, _host)
            chain.append(flat_logprobs.rows_tolist(host, tolist_each))
        except Exception as exc:
            chain.append({"raised": type(exc).__name__})
    return {"lists": lists, "chain": chain}


def verify_producer(original, replacement, answers: Answered, name: str) -> str | None:
    return side_by_side(
        original,
        replacement,
        producer_calls(name),
        answer,
        answers,
        flat=lambda call: call.flat,
        where=lambda call: (
            f"{name} on {call.arg}, {call.logprobs.shape[0]} rows, {call.logprobs.dtype}"
        ),
        compare=difference,
    )
