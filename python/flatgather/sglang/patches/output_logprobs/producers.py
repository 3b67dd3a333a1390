"""The producers' patch: ``get_top_logprobs`` and ``get_token_ids_logprobs``
replaced where their callers look them up, each checked side by side with
the release's own (see the package's docstring)."""

from __future__ import annotations

import copy
import itertools
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from flatgather.sglang.check import Answered, side_by_side
from flatgather.sglang.compare import first_difference
from flatgather.sglang.patches.output_logprobs import runtime as flat_logprobs
from flatgather.sglang.patches.output_logprobs.names import PRODUCER_MODULES, PRODUCERS
from flatgather.sglang.patching import (
    Candidate,
    Known,
    Option,
    Patch,
    Refused,
    Service,
    Swap,
    Target,
    known_code,
    release_function,
)

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
class _Call:
    name: str
    logprobs: torch.Tensor
    arg: list
    flat: bool
    """Whether flatgather, not the release, answers."""


_logprobs: dict[tuple[int, torch.dtype], torch.Tensor] = {}


def producer_calls(name: str) -> Iterator[_Call]:
    cases = _TOP_CASES if name == flat_logprobs.TOP else _ID_CASES
    for (arg, rows, flat), dtype in itertools.product(cases, (torch.float32, torch.bfloat16)):
        logprobs = _logprobs.get((rows, dtype))
        if logprobs is None:
            # Any distinct values do: only where they land is compared.
            gen = torch.Generator().manual_seed(rows)
            logprobs = _logprobs[rows, dtype] = (torch.randn(rows, VOCAB, generator=gen) * 4).to(
                dtype
            )
        yield _Call(name, logprobs, [copy.copy(a) for a in arg], flat)


def _answer(fn, call: _Call):
    """What ``fn`` returns for ``call`` and what the release's chain (a host
    copy and ``.tolist()`` per row) makes of each list; the id lists named by
    the request whose object they are."""
    try:
        lists = fn(call.logprobs, call.arg, no_copy_to_cpu=True)
    except Exception as exc:  # compared by type: the same failure, or none
        return {"raised": type(exc).__name__}
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


def _verify_producer(original, replacement, answers: Answered, name: str) -> str | None:
    return side_by_side(
        original,
        replacement,
        producer_calls(name),
        _answer,
        answers,
        flat=lambda call: call.flat,
        where=lambda call: (
            f"{name} on {call.arg}, {call.logprobs.shape[0]} rows, {call.logprobs.dtype}"
        ),
        compare=difference,
    )


@dataclass
class _Rebind(Swap):
    """A swap whose revert puts back the release's own function, whatever
    the name held when it was applied: a module that imported the name from
    one flatgather had patched holds flatgather's replacement, which must
    not outlive the installation."""

    release: Any = None

    def apply(self) -> None:
        super().apply()
        self.original = self.release


class Registry(Service):
    """The flat lists the producers hand on, registered for the chain
    (:mod:`~flatgather.sglang.patches.output_logprobs.runtime`): once
    the producers are reverted, lists registered before are read by the
    release's own loops, and are dropped."""

    def reverted(self):
        flat_logprobs.clear()


REGISTRY = Registry()

OPTION = {
    "output_logprobs": Option(
        "hand the output logprobs of decode and verify steps from the device to the scheduler flat"
    )
}
"""The ``install()`` keyword of the output logprobs' two patches."""

DEFINED_IN = (
    "sglang.srt.layers.logprob_processor",
    "sglang.srt.layers.utils.logprob",
    "sglang.srt.layers.logits_processor",
)
"""Where a release defines the producers (their fingerprints are read there)."""


class Producers(Patch[types.FunctionType, tuple[Callable, Answered]]):
    """``get_top_logprobs`` and ``get_token_ids_logprobs`` in the globals of
    each module of :data:`PRODUCER_MODULES` that calls them, each verified
    on its own."""

    name = PRODUCERS
    modules = PRODUCER_MODULES
    what = "the output logprobs"
    options = OPTION
    known = (
        Known(flat_logprobs.TOP, DEFINED_IN, flat_logprobs.TOP),
        Known(flat_logprobs.TOKEN_IDS, DEFINED_IN, flat_logprobs.TOKEN_IDS),
    )

    def locate(self, module):
        targets = []
        for name in (flat_logprobs.TOP, flat_logprobs.TOKEN_IDS):
            if release_function(module, name) is not None:
                targets.append(Target(module, name, module))
        return targets

    def prove(self, target):
        # Replaced whole, behind its check: what it is, :meth:`vouch` says.
        # Under flatgather's replacement where the module imported the name
        # from one flatgather had patched (0.5.10's worker, the sampler,
        # imported after install()): the release's own is checked, and
        # restored by uninstall() (:class:`_Rebind`).
        return release_function(target.owner, target.name)

    def build(self, target, original):
        """One candidate per walk: the one checked counts its answers; the
        one that goes into service counts nothing."""
        if target.name == flat_logprobs.TOP:
            ways = [(flat_logprobs.make_top_logprobs, ())]
        else:
            ways = [(flat_logprobs.make_token_ids_logprobs, (walk,)) for walk in (True, False)]
        for make, args in ways:
            answers = Answered()
            yield Candidate(
                swaps=(Swap(target.owner, target.name, make(original, *args)),),
                applied=(PRODUCERS,),
                detail=(make(original, *args, on_answer=answers), answers),
            )

    def check(self, target, original, candidate):
        counted, answers = candidate.detail
        return _verify_producer(original, counted, answers, target.name)

    def pick(self, target, original):
        """Once per release function in an installation, whichever module
        holds it (the same function sits in several modules' globals): the
        replacement verified, or why there is none, is remembered for that
        installation alone (:meth:`~flatgather.sglang.patching.Patch.memo`),
        so the next one judges the code it finds."""
        verdicts = self.memo()
        found = verdicts.get(original)
        if found is None:
            try:
                found = super().pick(target, original).swaps[0].new
            except Refused as exc:
                found = str(exc)
            verdicts[original] = found
        if isinstance(found, str):
            raise Refused(found)
        swap = _Rebind(target.owner, target.name, found, release=original)
        return Candidate(swaps=(swap,), applied=(PRODUCERS,), service=REGISTRY)

    def vouch(self, target, original):
        known_code(target.name, None, original)
        return ()


PATCH = Producers()


def producer(
    original: Callable, name: str, memo: dict | None = None
) -> tuple[Callable | None, str | None]:
    """flatgather's replacement of the release's ``original`` (``name``),
    verified against it, or None and the first difference; with ``memo`` (an
    installation's, :meth:`~flatgather.sglang.patching.Patch.memo`) the
    verdict the producers' patch reached in it, or reached now and kept
    there."""
    patch = Producers()
    if memo is not None:
        vars(patch)["_memo"] = memo
    try:
        return patch.pick(Target(None, name), original).swaps[0].new, None
    except Refused as exc:
        return None, str(exc)
