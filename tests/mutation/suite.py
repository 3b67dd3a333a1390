"""The mutation suite: every mutant (or a seeded sample) of every target,
each installed and judged."""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import targets
from .argued import argued
from .mutants import Mutant, mutants
from .targets import Inputs, Target, function_of, module_with, release_tree

VERDICTS = (
    "patched and exact",
    "patched, not distinguished",
    "refused",
    "silently different",
    "invalid",
)
"""Patched and exact: the inputs tell the mutant apart from the release and
flatgather answers as the mutant on each. Patched, not distinguished: no
input tried tells the mutant apart from the release, so flatgather's
answering alike shows nothing of the edit."""

GATE = "refused by the gate by construction"
NO_ORACLE = "refused by the gate by construction, no oracle"
COMPARED = "compared against the mutant"


def proves(target: Target) -> str:
    """What a verdict on ``target``'s mutants can show: a function replaced
    only where its code is known refuses every edit (any edit changes its
    fingerprint), with an oracle the gate-off run uses, or none; the others
    (rewrites of a loop or a branch) take mutants, and what they put in
    place is compared with each."""
    if not target.gated:
        return COMPARED
    return NO_ORACLE if target.whole_function else GATE


@dataclass
class Record:
    target: str
    key: str
    operator: str
    equivalent: bool
    description: str
    verdict: str
    detail: str = ""
    compared: int = 0
    raised: int = 0
    reached: int | None = None
    proves: str = COMPARED
    distinguished: bool | None = None
    """Some input tells the mutant apart from the unmodified release (None:
    the suite runs no input for the target)."""
    told: str = ""
    unchecked: str = ""
    seconds: float = 0.0
    argued: str = ""
    """Why a mutant no input tells apart is equivalent or unreachable on a
    CPU (``argued.py``), or empty."""

    @property
    def unexplained(self) -> bool:
        """Not told apart from the release, and neither equivalent by
        construction nor argued so: the inputs are short of it."""
        return (
            self.distinguished is False
            and not self.equivalent
            and not self.argued
            and self.verdict != "invalid"
        )


def chosen(all_mutants: list[Mutant], sample: int | None, seed: int) -> list[Mutant]:
    """All of them, or ``sample`` of them drawn with ``seed``, in their
    order; the equivalent ones always among them when they fit."""
    if sample is None or sample >= len(all_mutants):
        return all_mutants
    rng = random.Random(seed)
    equivalent = [m for m in all_mutants if m.equivalent]
    others = [m for m in all_mutants if not m.equivalent]
    keep = rng.sample(equivalent, min(len(equivalent), max(1, sample // 5)))
    keep += rng.sample(others, min(len(others), sample - len(keep)))
    order = {m.key: k for k, m in enumerate(all_mutants)}
    return sorted(keep, key=lambda m: order[m.key])


_releases: dict = {}
_inputs: dict = {}


def _release(target: Target, tree, node, where: Path):
    """The release's function unedited, in a module of its own made as each
    mutant's is (one per target and folder)."""
    key = (target.name, id(node), str(where))
    if key not in _releases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            copy = module_with(target, tree, node, where)
        _releases[key] = (node, function_of(target, copy))
    return _releases[key][1]


def judge(target: Target, mutant: Mutant, tree, node, where: Path, cases: int, seed: int) -> Record:
    record = Record(
        target.name, mutant.key, mutant.operator, mutant.equivalent, mutant.description, "invalid"
    )
    started = time.monotonic()
    record.proves = proves(target)
    record.argued = argued(target.function, mutant, node, target.through)
    release = _release(target, tree, node, where)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            copy = module_with(target, tree, mutant.apply(node), where)
    except Exception as exc:  # a mutant that does not build is no release
        record.detail = f"{type(exc).__name__}: {exc}"
        return record
    fn = function_of(target, copy)
    targets.GROWING = 1 if mutant.equivalent or record.argued else targets.GROW
    inputs = _inputs.setdefault((target.name, seed), Inputs(f"{seed}/{target.name}"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trial = target.trial(copy, fn, release, inputs, cases)
    record.compared, record.raised, record.reached = trial.compared, trial.raised, trial.reached
    record.seconds = time.monotonic() - started
    record.distinguished, record.told = trial.distinguished, trial.told[:300]
    record.unchecked = trial.unchecked[:300]
    if trial.difference is not None:
        record.verdict, record.detail = "silently different", trial.difference
    elif trial.patched and trial.compared == 0:
        # A patch the suite could not put side by side is not shown exact.
        record.verdict, record.detail = "silently different", "patched, and never compared"
    elif trial.patched and trial.distinguished:
        record.verdict, record.detail = "patched and exact", trial.note[:300]
    elif trial.patched:
        record.verdict, record.detail = "patched, not distinguished", trial.note[:300]
    else:
        record.verdict, record.detail = "refused", trial.note[:300]
    return record


def run(
    where: Path,
    sample: int | None = None,
    cases: int = 30,
    seed: int = 0,
    only: list[str] | None = None,
    progress: Callable[[int, int, Record], None] | None = None,
) -> tuple[list[Record], str]:
    from flatgather.sglang.releases import sglang_release

    plan = []
    for target in targets.targets():
        if only and target.name not in only and target.function not in only:
            continue
        _, tree, node = release_tree(target)
        plan += [(target, m, tree, node) for m in chosen(mutants(node), sample, seed)]
    records = []
    for done, (target, mutant, tree, node) in enumerate(plan, 1):
        records.append(judge(target, mutant, tree, node, where, cases, seed))
        if progress is not None:
            progress(done, len(plan), records[-1])
    return records, sglang_release()


def summary(records: list[Record]) -> list[dict]:
    rows = {}
    for r in records:
        row = rows.setdefault(
            r.target,
            {
                "target": r.target,
                "proves": r.proves,
                "mutants": 0,
                **dict.fromkeys(VERDICTS, 0),
                "equivalent": 0,
                "equivalent refused": 0,
                "distinguished": None,
                "not distinguished": {"equivalent": 0, "argued": 0, "unexplained": 0},
                "unchecked": 0,
            },
        )
        row["mutants"] += 1
        row[r.verdict] += 1
        row["equivalent"] += r.equivalent
        row["equivalent refused"] += r.equivalent and r.verdict == "refused"
        row["unchecked"] += bool(r.unchecked)
        if r.distinguished is None or r.verdict == "invalid":
            continue
        row["distinguished"] = (row["distinguished"] or 0) + r.distinguished
        if not r.distinguished:
            why = "equivalent" if r.equivalent else "argued" if r.argued else "unexplained"
            row["not distinguished"][why] += 1
    return list(rows.values())
