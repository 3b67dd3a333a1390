"""Adding a patch is its room and one line. The tests' own seventh patch
(``tests/seventh``: the patch and its names, what runs, its cases) is added
to :func:`flatgather.sglang.patches.patches` by the one line of
:func:`seventh_added`, and from its declarations alone it is installed,
reported, reverted, configured by its option and fingerprinted as
flatgather's own patches are."""

from __future__ import annotations

import importlib
import sys

import flatgather.sglang as fs
import pytest
import seventh
from flatgather.sglang import patches as rooms
from flatgather.sglang import shapes
from flatgather.testing import fingerprints

SUBJECT = "seventh.subject"


@pytest.fixture
def seventh_added(monkeypatch):
    stock = rooms.patches
    monkeypatch.setattr(rooms, "patches", lambda: (*stock(), seventh.PATCH))  # the one line
    sys.modules.pop(SUBJECT, None)
    subject = importlib.import_module(SUBJECT)
    yield subject
    fs.uninstall()
    sys.modules.pop(SUBJECT, None)


def _known(monkeypatch) -> str:
    """The generator's fingerprint of the subject, put in the table as
    ``--write`` would."""
    found = fingerprints.release_fingerprints()["request_totals"]
    monkeypatch.setitem(shapes.KNOWN, "request_totals", {found: ("the tests",)})
    return found


def _state(report):
    (mine,) = [p for p in report.patches if p.patch == seventh.NAME]
    return mine


def test_the_generator_fingerprints_what_the_patch_declares(seventh_added):
    found = fingerprints.release_fingerprints()
    assert found["request_totals"] == shapes.fingerprint(None, seventh_added.request_totals)
    # The release's own code is still walked as before.
    assert shapes.PRUNED_STATES in found


def test_code_the_table_lacks_is_left_stock_with_its_fingerprint(seventh_added):
    original = seventh_added.request_totals
    report = fs.install()
    mine = _state(report)
    assert mine.state == "left stock"
    assert "not code flatgather has seen" in mine.notes[0]
    assert shapes.fingerprint(None, original) in mine.notes[0]
    assert seventh_added.request_totals is original
    assert report.contract is not None  # the other patches went on


def test_known_code_is_installed_reported_and_reverted(seventh_added, monkeypatch):
    _known(monkeypatch)
    original = seventh_added.request_totals
    report = fs.install()
    assert _state(report).state == "applied"
    assert f"{SUBJECT}.request_totals" in report.patched
    flat = seventh_added.request_totals
    assert flat is not original
    batches = (([1, 2, 3, 4], [1, 3]), ([5, 6], [0, 2]), ([0.5, 1.5], [2]), ([1], [2]))
    for values, lengths in batches:
        assert flat(values, lengths) == original(values, lengths)
    # Its service reports: the two integer batches within their values answered flat.
    assert fs.installed_report().request_totals_answered == 2
    assert fs.uninstall()
    assert seventh_added.request_totals is original


def test_its_option_is_an_install_keyword(seventh_added, monkeypatch):
    _known(monkeypatch)
    original = seventh_added.request_totals
    report = fs.install(request_totals=False)
    assert not [p for p in report.patches if p.patch == seventh.NAME]
    assert seventh_added.request_totals is original


def test_a_replacement_that_differs_is_left_stock(seventh_added, monkeypatch):
    _known(monkeypatch)
    from seventh import runtime

    make = runtime.make_request_totals

    def off_by_one(original, on_answer=None):
        flat = make(original, on_answer)
        return lambda values, lengths: [t + 1 for t in flat(values, lengths)]

    monkeypatch.setattr(seventh, "make_request_totals", off_by_one)
    report = fs.install()
    mine = _state(report)
    assert mine.state == "left stock" and "values [1, 2, 3, 4, 5, 6]" in mine.notes[0]


def test_its_mutants_are_judged_as_the_others_are(seventh_added, tmp_path, monkeypatch):
    """The mutation suite takes the functions a patch replaces whole from
    its declarations: the seventh's are mutated and judged like the token-id
    and top-k functions. With the known-code gate, every edit is refused by
    construction; without it, the side-by-side check refuses those its
    cases tell apart."""
    from mutation import targets
    from mutation.mutants import mutants
    from mutation.suite import judge

    (target,) = [t for t in targets.targets() if t.name == "request_totals"]
    assert target.whole_function and target.gated and target.module == SUBJECT
    _, tree, node = targets.release_tree(target)
    found = mutants(node)
    assert len(found) >= 10

    def judged():
        return [judge(target, m, tree, node, tmp_path, 5, 0) for m in found]

    gated = judged()
    assert all(r.verdict == "refused" for r in gated), [(r.description, r.detail) for r in gated]
    # Refused by its check where the cases tell the edit apart, else by the gate.
    by_gate = [r for r in gated if "not code flatgather has seen" in r.detail]
    assert by_gate and all(r in by_gate or "values" in r.detail for r in gated)

    _known(monkeypatch)
    monkeypatch.setattr(targets, "SHAPE_GATE", False)
    checked = judged()
    refused = [r for r in checked if r.verdict == "refused"]
    assert refused and all("values" in r.detail for r in refused)
    # What the gate alone refused before, the check lets through now.
    assert len(refused) == len(gated) - len(by_gate)
