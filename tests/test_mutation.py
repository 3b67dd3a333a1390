"""The mutation suite, bounded: a seeded sample of the one-edit mutants of
every function flatgather patches in the release under test, each handed to
flatgather's patcher as a fork's code would be, and whatever is then in
place run side by side with the mutant on random inputs. None may answer
otherwise than the mutant, and each sampled mutant must be told apart from
the unmodified release by some input, unless it is equivalent by
construction or argued equivalent or unreachable on a CPU
(``mutation/argued.py``): a mutant the inputs cannot tell apart shows
nothing of flatgather's answer (``tests/mutation``; the whole suite on
demand: ``cd tests && python -m mutation``, figure in docs/reliability.md).

Not matrix-marked: it runs on the full-suite releases."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

import pytest
from _sglang import DRAFT_NO_LOGPROB
from conftest import left_stock
from mutation import targets
from mutation.mutants import Mutant, mutants
from mutation.suite import chosen, judge


@dataclass(frozen=True)
class Edited(Mutant):
    replacement: ast.FunctionDef | None = None

    def apply(self, function: ast.FunctionDef) -> ast.FunctionDef:
        return self.replacement


SAMPLE = int(os.environ.get("FLATGATHER_MUTANTS", "16"))
GROW = 6
"""Inputs for a sampled mutant not yet told apart: up to ``GROW`` times the 15
each gets (the store's LAST rows without aux layers, with before-norm
states, come about once in 17 inputs)."""
TARGETS = {t.name: t for t in targets.targets()}


def _judged(target, tmp_path, pick, cases=15):
    _, tree, node = targets.release_tree(target)
    return [judge(target, m, tree, node, tmp_path, cases, 0) for m in pick(mutants(node))]


_sampled: dict[str, list] = {}


@pytest.fixture
def sampled(tmp_path_factory):
    """The seeded sample of each target, judged once for the tests below."""

    def get(name: str):
        if name not in _sampled:
            where = tmp_path_factory.mktemp("mutants")
            pick = lambda found: chosen(found, SAMPLE, seed=0)  # noqa: E731
            grow, targets.GROW = targets.GROW, GROW
            try:
                _sampled[name] = _judged(TARGETS[name], where, pick)
            finally:
                targets.GROW = grow
        return _sampled[name]

    return get


@pytest.mark.parametrize("name", list(TARGETS))
def test_no_mutant_is_silently_different(name, sampled):
    records = sampled(name)
    different = [r for r in records if r.verdict == "silently different"]
    assert not different, [(r.description, r.detail) for r in different]
    assert not [r for r in records if r.verdict == "invalid"]


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_sampled_mutant_is_told_apart_from_the_release(name, sampled):
    """A mutant no input tells apart from the unmodified release proves
    nothing when flatgather answers as it does: each sampled one is told
    apart, or is equivalent by construction, or is argued equivalent or
    unreachable on a CPU (``mutation/argued.py``)."""
    if TARGETS[name].whole_function:
        pytest.skip(f"no oracle in the suite for {name}: no inputs to tell mutants apart")
    records = sampled(name)
    short = [(r.operator, r.description) for r in records if r.unexplained]
    assert not short, short
    assert any(r.distinguished for r in records), records


@pytest.mark.parametrize("name", list(TARGETS))
def test_the_oracle_runs_the_unchanged_function(name, tmp_path):
    """The control: the release's function, unchanged, in a module of its
    own, is patched where flatgather patches the release, and the oracle's
    inputs reach it (it returns on them, rather than every side failing the
    same way)."""
    target = TARGETS[name]
    if target.whole_function:
        # Any mutant of these the suite sees patched counts as silently
        # different; the release's own is compared in their test files.
        pytest.skip(f"no oracle in the suite for {name}, replaced whole behind its shape")
    _, tree, node = targets.release_tree(target)
    record = judge(target, Edited("unchanged", 0, (), True, "", node), tree, node, tmp_path, 20, 0)
    # Unchanged, it is the release: no input may tell them apart (the
    # control of the kill rate).
    assert record.distinguished is False, record
    assert record.compared == 20, record
    assert record.raised < record.compared if target.release_raises else record.raised == 0, record
    if record.verdict == "refused":
        left_stock(f"the release's {name} ({record.detail})")
    assert record.verdict == "patched, not distinguished", record
    assert record.reached is None or record.reached > 0, record


def _with_edit(tmp_path, target, old: str, new: str, cases: int = 60):
    """The release's function with one line's text replaced (a compound
    edit no generated mutant makes), judged."""
    _, tree, node = targets.release_tree(target)
    text = ast.unparse(node)
    if old not in text:
        pytest.skip(f"no {old!r} in this release's {target.name}")
    (edited,) = ast.parse(text.replace(old, new, 1)).body
    mutant = Edited("edited", 0, (), False, new, edited)
    return judge(target, mutant, tree, node, tmp_path, cases, 0)


LONG_REQUESTS = (
    "if extend_len == extend_logprob_start_len:",
    "if extend_len == extend_logprob_start_len or extend_len > 64:",
)


def test_the_oracle_sees_what_the_probe_alone_lets_through(tmp_path, monkeypatch):
    """The chunk rule for requests longer than any probe batch: with the
    known-code gate off, the probe passes it and the suite's oracle sees
    the difference; with the gate on it is refused."""
    target = TARGETS["LogitsProcessor._get_pruned_states"]
    monkeypatch.setattr(targets, "SHAPE_GATE", False)
    record = _with_edit(tmp_path, target, *LONG_REQUESTS)
    assert record.verdict == "silently different", record
    monkeypatch.setattr(targets, "SHAPE_GATE", True)
    record = _with_edit(tmp_path, target, *LONG_REQUESTS)
    assert record.verdict == "refused" and "not code flatgather has seen" in record.detail


def test_a_middle_chunk_that_does_not_advance_the_cursor_is_refused(tmp_path, monkeypatch):
    """Found by the suite: a release whose middle-chunk branch leaves the
    input logprob cursor where it was. flatgather's advance over a skipped
    request cannot then give the requests after it what they get without
    it; the check's case of a middle chunk before a skipped request
    refuses it. Without that case it was patched and silently different."""
    from flatgather.sglang.patches import prefill_result
    from flatgather.sglang.patches.prefill_result import check

    target = next(t for t in TARGETS.values() if t.function == prefill_result.METHOD)

    def advances(found):
        return [
            m for m in found if m.operator == "statement dropped" and "logprob_pt" in m.description
        ]

    records = _judged(target, tmp_path, advances, cases=30)
    assert records
    assert "silently different" not in {r.verdict for r in records}, records
    # Without the case of a middle chunk right before a skipped request.
    cases = [
        case
        for case in check.CASES
        if not any(a.middle_chunk and b.skipped for a, b in zip(case[0], case[0][1:], strict=False))
    ]
    assert len(cases) < len(check.CASES)
    monkeypatch.setattr(check, "CASES", tuple(cases))
    records = _judged(target, tmp_path, advances, cases=30)
    assert "silently different" in {r.verdict for r in records}, records


@pytest.mark.skipif(not DRAFT_NO_LOGPROB, reason="the release does not set return_logprob")
def test_a_draft_method_that_sets_return_logprob_itself_gets_no_backport(tmp_path):
    """Found by the suite: with ``forward_batch.return_logprob = True`` in
    the method, the backport's ``False`` went in before it and was
    overwritten, while the install report said it was applied."""
    target = next(t for t in TARGETS.values() if t.function == "_draft_extend_for_prefill")
    sets = "forward_batch.return_logprob = "
    record = _with_edit(tmp_path, target, f"{sets}False", f"{sets}True")
    assert record.verdict in ("patched and exact", "refused"), record
    assert "return_logprob backport not applied" in record.detail, record


# Handed no sample indices, the store keeps the pruned aux rows only while a
# batch is small (the probe's largest has 32 requests); past that, the first.
# The release's store is never handed None in a prefill with logprobs; lazy
# aux pruning hands it None with the sampled rows alone.
SMALL_BATCHES_ONLY = (
    "else aux_pruned_states",
    "else (aux_pruned_states if aux_pruned_states.shape[0] < 40 else aux_pruned_states[:1])",
)


def test_lazy_aux_needs_a_store_flatgather_has_seen(tmp_path, monkeypatch):
    """Lazy aux pruning hands the store only the rows the release's store
    was seen to read. A store that reads others only past the probe's
    batches passes the probe; with the known-code gate off the suite's
    oracle sees it, with the gate on lazy aux stays off."""
    target = TARGETS["LogitsProcessor._get_hidden_states_to_store"]
    monkeypatch.setattr(targets, "SHAPE_GATE", False)
    # Only a large prefill with logprobs and list aux layers, captured LAST,
    # takes the edited branch: one input in tens.
    record = _with_edit(tmp_path, target, *SMALL_BATCHES_ONLY, cases=150)
    assert record.verdict == "silently different", record
    monkeypatch.setattr(targets, "SHAPE_GATE", True)
    record = _with_edit(tmp_path, target, *SMALL_BATCHES_ONLY)
    assert record.verdict == "refused", record
    assert "lazy aux pruning left off" in record.detail and "not code flatgather has seen" in (
        record.detail
    ), record


def test_the_chain_oracle_sees_a_stage_that_moves_rows(tmp_path, monkeypatch):
    """The chain's oracle can fail: flatgather's host copy with its rows
    rotated (for four rows or more) and the install-time check switched
    off, on the release's own copy_to_cpu, is silently different."""
    from flatgather.sglang.patches import output_logprobs
    from flatgather.sglang.patches.output_logprobs import runtime as flat_logprobs

    target = TARGETS["GenerationBatchResult.copy_to_cpu"]
    _, tree, node = targets.release_tree(target)
    control = Edited("unchanged", 0, (), True, "", node)
    assert judge(target, control, tree, node, tmp_path, 20, 0).verdict == (
        "patched, not distinguished"
    )

    def rotated(rows, elt):
        out = flat_logprobs.rows_to_host(rows, elt)
        return out[1:] + out[:1] if len(out) > 3 else out

    consumers = output_logprobs.consumers
    helpers = {**consumers.HELPERS, output_logprobs.TO_HOST: rotated}
    monkeypatch.setattr(consumers, "HELPERS", helpers)
    monkeypatch.setattr(consumers, "verify_chain", lambda *args: None)
    record = judge(target, control, tree, node, tmp_path, 20, 0)
    assert record.verdict == "silently different", record


# The top-k rows one shorter for k of 30 or more: none of the check's cases
# asks for that many.
SHORT_FOR_LARGE_K = (
    "top_logprobs_val.append(values[i][:k])",
    "top_logprobs_val.append(values[i][:k] if k < 30 else values[i][:k - 1])",
)


def test_an_edit_of_the_helper_a_replaced_function_calls_is_refused(tmp_path, monkeypatch):
    """``get_top_logprobs`` is one call of ``get_top_logprobs_raw``, where the
    logic lives: a fork that edits the helper has edited the function. The
    known-code gate fingerprints the helpers of the same module with it; when
    it named them by their names alone, this edit passed the side-by-side
    check and was patched."""
    from flatgather.sglang import shapes
    from flatgather.testing import fingerprints

    target = next(
        t for t in TARGETS.values() if t.name == "get_top_logprobs_raw (called by get_top_logprobs)"
    )
    record = _with_edit(tmp_path, target, *SHORT_FOR_LARGE_K)
    assert record.verdict == "refused" and "not code flatgather has seen" in record.detail, record
    # The gate as it was: helpers by their names, the release's fingerprint so.
    monkeypatch.setattr(shapes, "HELPERS_BY_CODE", False)
    by_name = shapes.fingerprint(None, fingerprints.release_functions()["get_top_logprobs"])
    monkeypatch.setitem(shapes.KNOWN, "get_top_logprobs", {by_name: ("this release",)})
    record = _with_edit(tmp_path, target, *SHORT_FOR_LARGE_K)
    assert record.verdict == "silently different", record
