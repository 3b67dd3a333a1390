"""The mutation suite: every mutant (or a seeded sample) of every target,
each installed and judged."""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .mutants import Mutant, mutants
from .targets import Target, function_of, module_with, release_tree, targets

VERDICTS = ("patched and exact", "refused", "silently different", "invalid")


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


def judge(target: Target, mutant: Mutant, tree, node, where: Path, cases: int, seed: int) -> Record:
    record = Record(
        target.name, mutant.key, mutant.operator, mutant.equivalent, mutant.description, "invalid"
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            copy = module_with(target, tree, mutant.apply(node), where)
    except Exception as exc:  # a mutant that does not build is no release
        record.detail = f"{type(exc).__name__}: {exc}"
        return record
    fn = function_of(target, copy)
    rng = random.Random(f"{seed}/{target.name}/{mutant.key}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trial = target.trial(copy, fn, rng, cases)
    record.compared, record.raised, record.reached = trial.compared, trial.raised, trial.reached
    if trial.difference is not None:
        record.verdict, record.detail = "silently different", trial.difference
    elif trial.patched and trial.compared == 0:
        # A patch the suite could not put side by side is not shown exact.
        record.verdict, record.detail = "silently different", "patched, and never compared"
    elif trial.patched:
        record.verdict, record.detail = "patched and exact", trial.note[:300]
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
    for target in targets():
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
                "mutants": 0,
                **dict.fromkeys(VERDICTS, 0),
                "equivalent": 0,
                "equivalent refused": 0,
            },
        )
        row["mutants"] += 1
        row[r.verdict] += 1
        row["equivalent"] += r.equivalent
        row["equivalent refused"] += r.equivalent and r.verdict == "refused"
    return list(rows.values())
