"""The one shape of every patch (:class:`flatgather.sglang.patching.Patch`)
and the installer that walks the list of them, specified on a patch of a
module of the tests' own: each step's refusal, the choice among
candidates, the guard, and how ``install()`` reports, defers, applies and
reverts a patch it knows only by the protocol."""

from __future__ import annotations

import importlib
import sys
import types

import flatgather.sglang as fs
import pytest
from flatgather.sglang import installer, patching
from flatgather.sglang import patches as rooms
from flatgather.sglang.patching import (
    Candidate,
    Option,
    Patch,
    Refused,
    Service,
    Swap,
    Target,
    Unneeded,
)

MODULE = "flatgather_test_patched_module"


def double(x):
    return 2 * x


def make_module(name: str = MODULE) -> types.ModuleType:
    module = types.ModuleType(name)
    module.double = double
    module.triple = lambda x: 3 * x
    return module


def times_two(x):
    return x + x


def off_by_one(x):
    return 2 * x + 1


class Counter(Service):
    """What a doubling leaves in service: it reports, and counts its reverts."""

    def __init__(self) -> None:
        self.reverted_count = 0
        self.busy = ""

    def report(self):
        return {"doublings": 1}

    def busy_here(self):
        return self.busy or None

    def reverted(self):
        self.reverted_count += 1


class Doubling(Patch):
    """Replaces ``double`` (and, when asked, ``triple``) with candidates
    given by the test, checked on three inputs."""

    name = "doubling"
    modules = (MODULE,)

    def __init__(self, candidates=(times_two,), targets=("double",), **steps):
        self.candidates = candidates
        self.targets = targets
        self.steps = steps
        self.log: list[str] = []
        self.service = Counter()

    @property
    def reverted_count(self) -> int:
        return self.service.reverted_count

    def locate(self, module):
        self.log.append("locate")
        return [Target(module, name, module) for name in self.targets if hasattr(module, name)]

    def prove(self, target):
        self.log.append("prove")
        if "prove" in self.steps:
            self.steps["prove"]()
        return getattr(target.owner, target.name)

    def build(self, target, original):
        self.log.append("build")
        for fn in self.candidates:
            yield Candidate(
                swaps=(Swap(target.owner, target.name, fn),),
                applied=(self.name,),
                gives_up=f"{fn.__name__} left out",
                service=self.service,
            )

    def check(self, target, original, candidate):
        self.log.append("check")
        new = candidate.swaps[0].new
        for x in (0, 1, 5):
            if new(x) != original(x):
                return f"at {x}: {new(x)}, not {original(x)}"
        return None

    def vouch(self, target, original):
        self.log.append("vouch")
        if "vouch" in self.steps:
            return self.steps["vouch"]()
        return ("vouched",)


# --- one patch, one module --------------------------------------------------------------------


def test_the_steps_run_in_order_and_the_first_candidate_that_passes_is_taken():
    module = make_module()
    patch = Doubling(candidates=(off_by_one, times_two))
    result = patch.prepare(module)
    assert [s.new for s in result.swaps] == [times_two]
    assert patch.log == ["locate", "prove", "build", "check", "check", "vouch"]
    assert result.applied == ("doubling",)
    # What the taken candidate gives up against the one before, and why;
    # then what the vouching says.
    assert result.notes == (f"{MODULE}.double: off_by_one left out: at 0: 1, not 0", "vouched")
    assert module.double is double  # prepare() applies nothing


def test_no_candidate_passing_leaves_the_target_stock_with_the_best_one_s_difference():
    result = Doubling(candidates=(off_by_one,)).prepare(make_module())
    assert result.swaps == []
    assert result.notes == (f"{MODULE}.double left stock: at 0: 1, not 0",)
    assert result.refusal == "at 0: 1, not 0"


def test_each_target_is_refused_on_its_own():
    module = make_module()

    def refuse_triple():
        raise Refused("not this one")

    class TwoTargets(Doubling):
        def prove(self, target):
            if target.name == "triple":
                refuse_triple()
            return super().prove(target)

    result = TwoTargets(targets=("double", "triple")).prepare(module)
    assert [s.name for s in result.swaps] == ["double"]
    assert result.notes == ("vouched", f"{MODULE}.triple left stock: not this one")


def test_a_refused_vouching_leaves_the_target_stock():
    def unknown():
        raise Refused("not code the test matrix runs")

    result = Doubling(vouch=unknown).prepare(make_module())
    assert result.swaps == []
    assert result.notes == (f"{MODULE}.double left stock: not code the test matrix runs",)


def test_unneeded_is_neither_a_patch_nor_a_note():
    def unneeded():
        raise Unneeded

    result = Doubling(prove=unneeded).prepare(make_module())
    assert result == patching.Prepared()


def test_a_step_that_fails_is_a_note_and_interrupts_go_through():
    def boom():
        raise RuntimeError("boom")

    result = Doubling(prove=boom).prepare(make_module())
    assert result.swaps == [] and result.notes == (
        f"{MODULE}.double left stock: RuntimeError: boom",
    )

    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Doubling(prove=interrupt).prepare(make_module())


# --- the installer walks the list -------------------------------------------------------------


@pytest.fixture
def with_patch(monkeypatch, tmp_path):
    """``install()`` with :class:`Doubling` last in its list, on a module
    file of the test's own, not imported yet."""
    (tmp_path / f"{MODULE}.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    patch = Doubling()
    every = rooms.patches
    monkeypatch.setattr(rooms, "patches", lambda: (*every(), patch))
    yield patch
    sys.modules.pop(MODULE, None)


def test_a_patch_of_a_module_imported_later_is_pending_then_applied(with_patch):
    report = fs.install()
    (pending,) = [p for p in report.patches if p.patch == "doubling"]
    assert (pending.module, pending.state) == (MODULE, "pending")
    assert MODULE in report.pending
    module = importlib.import_module(MODULE)
    assert module.double is times_two
    report = fs.installed_report()
    (applied,) = [p for p in report.patches if p.patch == "doubling"]
    assert (applied.state, applied.applied, applied.notes) == (
        "applied",
        ("doubling",),
        ("vouched",),
    )
    assert f"{MODULE}.double" in report.patched and MODULE not in report.pending
    # What the patch's service reports is the report's, by name too.
    assert report.details["doublings"] == 1 and report.doublings == 1
    assert fs.uninstall()
    assert module.double is not times_two and module.double(4) == 8
    assert with_patch.reverted_count == 1


def test_each_record_is_told_to_a_listener_and_the_swaps_are_readable(with_patch):
    """What the engine tests' trace and the bench read of an installation,
    through the installer's public accessors: each patch's report in each
    module as it is recorded (at install() and at a later import), and the
    swaps in place."""
    heard = []
    stop = installer.on_record(heard.append)
    try:
        report = fs.install()
        assert heard and heard == [p for p in report.patches if p.state != "pending"]
        assert [s.where for s in installer.installed_swaps()] == list(report.patched)
        before = len(heard)
        module = importlib.import_module(MODULE)
        assert [(p.patch, p.module, p.state) for p in heard[before:]] == [
            ("doubling", MODULE, "applied")
        ]
        (last,) = [s for s in installer.installed_swaps() if s.target is module]
        assert (last.name, last.new) == ("double", times_two)
    finally:
        stop()
        fs.uninstall()
    assert installer.installed_swaps() == ()
    fs.install()
    fs.uninstall()
    assert heard[-1].patch == "doubling"  # stopped: nothing heard since
    assert len([p for p in heard if p.patch == "doubling"]) == 1


def test_every_patch_declares_how_its_answer_is_told():
    """``Patch.answers``, which the engine tests' trace reads: a patch that
    replaces functions whole declares nothing; every other declares one of
    the known ways."""
    assert Doubling.answers == "whole" and "answers" not in vars(Doubling)
    declared = {p.name: p.answers for p in rooms.patches()}
    assert set(declared.values()) <= set(patching.ANSWERS), declared


def test_a_patch_of_a_module_imported_already_applies_with_the_others(with_patch):
    module = importlib.import_module(MODULE)
    report = fs.install()
    assert module.double is times_two
    (applied,) = [p for p in report.patches if p.patch == "doubling"]
    assert applied.state == "applied"


def test_a_module_the_release_lacks_is_skipped(monkeypatch, with_patch):
    monkeypatch.setattr(Doubling, "modules", ("sglang.srt.flatgather_test_no_such_module",))
    report = fs.install()
    assert not [p for p in report.patches if p.patch == "doubling"]


def test_a_left_stock_patch_is_reported_with_its_reason(with_patch):
    with_patch.candidates = (off_by_one,)
    importlib.import_module(MODULE)
    report = fs.install()
    (stock,) = [p for p in report.patches if p.patch == "doubling"]
    assert stock.state == "left stock"
    assert stock.notes == (f"{MODULE}.double left stock: at 0: 1, not 0",)
    assert stock.notes[0] in report.notes


def test_uninstall_reverts_every_swap_in_reverse_order(monkeypatch, with_patch):
    importlib.import_module(MODULE)
    report = fs.install()
    reverted = []
    revert = patching.Swap.revert

    def recording(self):
        reverted.append(self.where)
        revert(self)

    monkeypatch.setattr(patching.Swap, "revert", recording)
    fs.uninstall()
    assert reverted == list(reversed(report.patched))
    assert reverted[0] == f"{MODULE}.double"  # applied last


def test_an_option_is_the_patch_s_own_declaration(monkeypatch, with_patch):
    """An option a patch declares is an ``install()`` keyword: a switch
    turns the patch off, any other is set on it; a keyword no patch declares
    is refused before anything is patched."""
    importlib.import_module(MODULE)
    monkeypatch.setattr(
        Doubling,
        "options",
        {"doubling": Option("double in one go"), "tripling": Option("also triple", switch=False)},
    )
    monkeypatch.setattr(Doubling, "tripling", True, raising=False)
    assert {"doubling", "tripling", "lazy_aux"} <= set(installer.install_options())
    with pytest.raises(TypeError, match="no_such_option"):
        fs.install(no_such_option=False)
    assert not fs.is_installed()
    report = fs.install(doubling=False)
    assert not [p for p in report.patches if p.patch == "doubling"]
    fs.uninstall()

    configured = []
    steps = Doubling.locate

    def locate(self, module):
        configured.append(self.tripling)
        return steps(self, module)

    monkeypatch.setattr(Doubling, "locate", locate)
    fs.install(tripling=False)
    assert configured == [False] and with_patch.tripling is True  # a configured copy
    fs.uninstall()


def test_uninstall_from_inside_a_service_says_where(with_patch):
    importlib.import_module(MODULE)
    fs.install()
    with_patch.service.busy = "inside the test's own doubling"
    with pytest.raises(RuntimeError, match="inside the test's own doubling"):
        fs.uninstall()
    with_patch.service.busy = ""
    assert fs.uninstall()


def test_an_option_turns_its_patches_off():
    report = fs.install(input_logprobs=False, output_logprobs=False)
    names = {p.patch for p in report.patches}
    assert "input-token-ids-logprobs" not in names
    assert not names & {"output-logprobs", "output-logprobs-chain"}
    assert "pruned-states" in names


def test_a_module_still_running_its_own_code_is_patched_once_it_is_whole(with_patch, tmp_path):
    """``install()`` called from inside an import cycle (a server's switch
    installs when the logits processor is imported, which a module of the
    chain imports half-way through its own code): that module's patch waits
    until the module is whole."""
    (tmp_path / f"{MODULE}.py").write_text(
        "import flatgather.sglang\nflatgather.sglang.install()\ndef double(x):\n    return 2 * x\n"
    )
    (tmp_path / "flatgather_test_next_import.py").write_text("")
    module = importlib.import_module(MODULE)
    try:
        importlib.import_module("flatgather_test_next_import")  # the next import fires it
    finally:
        sys.modules.pop("flatgather_test_next_import", None)
    assert module.double is times_two
    (applied,) = [p for p in fs.installed_report().patches if p.patch == "doubling"]
    assert applied.state == "applied"
