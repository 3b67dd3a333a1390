"""A seventh patch, the tests' own: ``request_totals`` of
:mod:`seventh.subject` replaced whole by one running sum. It is written as
a patch of flatgather is, a room and one line: this package (the patch and
its names here, what runs in :mod:`seventh.runtime`, its cases in
:mod:`seventh.check`) and the line that adds :data:`PATCH` to
:func:`flatgather.sglang.patches.patches` (the tests add it with
``monkeypatch``). Everything else, the installer, the report, the revert,
the fingerprint generator and the mutation suite, takes it from what it
declares."""

from __future__ import annotations

import types
from collections.abc import Callable
from types import MappingProxyType

from flatgather.sglang.check import Answered
from flatgather.sglang.patching import (
    Candidate,
    Known,
    Option,
    Patch,
    Service,
    Swap,
    Target,
    known_code,
)

from seventh import check
from seventh.runtime import make_request_totals

MODULE = "seventh.subject"
FUNCTION = "request_totals"
NAME = "request-totals"


class Answers(Service):
    """What stays in service: the count of batches answered flat, which
    the install report shows."""

    def __init__(self) -> None:
        self.answered = Answered()

    def report(self):
        return {"request_totals_answered": self.answered.count}


class RequestTotals(Patch[types.FunctionType, tuple[Callable, Answered]]):
    name = NAME
    modules = (MODULE,)
    what = "the request totals"
    options = MappingProxyType({"request_totals": Option("sum the requests' runs in one pass")})
    known = (Known(FUNCTION, (MODULE,), FUNCTION),)

    def __init__(self) -> None:
        self.answers = Answers()

    def locate(self, module):
        fn = vars(module).get(FUNCTION)
        return [Target(module, FUNCTION, module)] if isinstance(fn, types.FunctionType) else []

    def prove(self, target):
        return vars(target.owner)[target.name]

    def build(self, target, original):
        counted = Answered()
        yield Candidate(
            swaps=(
                Swap(target.owner, FUNCTION, make_request_totals(original, self.answers.answered)),
            ),
            applied=(NAME,),
            detail=(make_request_totals(original, counted), counted),
            service=self.answers,
        )

    def check(self, target, original, candidate):
        counted, answered = candidate.detail
        return check.verify(original, counted, answered)

    def vouch(self, target, original):
        known_code(FUNCTION, None, original)
        return ()


PATCH = RequestTotals()
