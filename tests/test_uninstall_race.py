"""``install()`` / ``uninstall()`` racing forwards that are running.

The lazy aux object made by the patched ``_get_pruned_states`` must never
reach the release's own ``_get_hidden_states_to_store``, whatever the
interleaving. ``uninstall()`` lets no new forward go lazy, waits for those in
flight, then restores everything at once."""

from __future__ import annotations

import importlib
import random
import sys
import threading
import time

import flatgather.sglang as fs
import pytest
from _forward import make_processor, pruning_gate, release_outputs
from _sglang import LogitsProcessor, assert_same, oracle_context
from flatgather.bench.batches import forward_metadata, output_fields
from flatgather.sglang import patches as rooms
from flatgather.sglang.patching import Patch, Prepared
from test_forward import HIDDEN, VOCAB, make_tensors

BATCHES = [([4, 5, 6], [0, 5, 3]), ([1], [0]), ([6] * 8, [0, 3, 6, 5] * 2), ([2, 9], [2, 0])]


# LAST capture: the lazy path gathers only the sampled rows, and the
# release's own _get_hidden_states_to_store reads the aux result, so a lazy
# object that leaked to it would fail (a LazyAuxPruned raises on any use).
CAPTURE = "LAST"


class Forwards:
    """Forwards on the lazy aux path, and the release's own outputs for them."""

    def __init__(self) -> None:
        self.processor, self.lm_head = make_processor(VOCAB, HIDDEN)
        self.stock_processor, _ = make_processor(VOCAB, HIDDEN, stock=True)
        self.inputs = []
        for i, (extend, start) in enumerate(BATCHES):
            input_ids, hidden, _before, aux = make_tensors(extend, i, "list", False, 3)
            self.inputs.append((extend, start, input_ids, hidden, aux))
        self.expected = [self.run(i, stock=True) for i in range(len(BATCHES))]

    def forward(self, processor, i: int, capture: str):
        extend, start, input_ids, hidden, aux = self.inputs[i]
        md = forward_metadata(
            extend, start, capture, input_ids, [0] * len(extend), [None] * len(extend)
        )
        with oracle_context():
            return processor.forward(input_ids, hidden, self.lm_head, md, aux_hidden_states=aux)

    def run(self, i: int, stock: bool = False) -> dict:
        """Batch ``i`` through the processor as it is now (patched or not),
        or the release's own outputs with ``stock`` (see
        :func:`_forward.release_outputs`: the release crashes here before
        SGLang PR #21589)."""
        if not stock:
            return output_fields(self.forward(self.processor, i, CAPTURE))
        extend, start, _, hidden, aux = self.inputs[i]
        return release_outputs(
            lambda capture: self.forward(self.stock_processor, i, capture),
            extend,
            start,
            CAPTURE,
            hidden,
            None,
            aux,
        )

    def release_crash(self, i: int) -> tuple[type, str] | None:
        """How the release's own forward fails on batch ``i`` (LAST capture
        with aux layers before SGLang PR #21589), or None."""
        try:
            self.forward(self.stock_processor, i, CAPTURE)
        except TypeError as exc:
            return type(exc), str(exc)
        return None


@pytest.fixture(scope="module")
def forwards():
    return Forwards()


class PauseAfterPruning:
    """Stops the thread it is installed on right after the patched
    ``_get_pruned_states`` returns (a lazy aux object in hand, before
    ``_get_hidden_states_to_store`` is looked up), until released."""

    def __init__(self, code, at_pause=None, on_resume=None) -> None:
        self.code = code
        self.paused = threading.Event()
        self.resume = threading.Event()
        self.at_pause = at_pause
        self.at_pause_result = None
        self.on_resume = on_resume
        self.on_resume_result = None

    def trace(self, frame, event, arg):
        if frame.f_code is not self.code:
            return None
        return self.local

    def local(self, frame, event, arg):
        if event == "return":
            if self.at_pause is not None:
                self.at_pause_result = self.at_pause()
            self.paused.set()
            assert self.resume.wait(30)
            if self.on_resume is not None:
                self.on_resume_result = self.on_resume()
        return self.local


def run_paused(forwards, pause, i=0):
    result = {}

    def target():
        sys.settrace(pause.trace)
        try:
            result["out"] = forwards.run(i)
        except BaseException as exc:
            result["error"] = exc
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=target)
    thread.start()
    assert pause.paused.wait(30)
    return thread, result


@pytest.mark.matrix
def test_uninstall_between_pruning_and_storing_waits_for_the_forward(forwards):
    before = dict(vars(LogitsProcessor))
    fs.install()
    pause = PauseAfterPruning(vars(LogitsProcessor)["_get_pruned_states"].__code__)
    forward_thread, result = run_paused(forwards, pause)

    uninstaller, uninstalled = uninstall_waiting()
    assert "result" not in uninstalled and fs.is_installed()
    # A forward that starts now gathers eagerly and is not waited for.
    assert_same(forwards.run(1), forwards.expected[1])

    pause.resume.set()
    forward_thread.join(30)
    uninstaller.join(30)
    assert "error" not in result, result.get("error")
    assert_same(result["out"], forwards.expected[0])
    assert uninstalled["result"] is True and not fs.is_installed()
    assert dict(vars(LogitsProcessor)) == before


def test_uninstall_with_a_timeout_leaves_the_installation_whole(forwards):
    report = fs.install()
    pause = PauseAfterPruning(vars(LogitsProcessor)["_get_pruned_states"].__code__)
    forward_thread, result = run_paused(forwards, pause)
    with pytest.raises(TimeoutError):
        fs.uninstall(timeout=0.05)
    assert fs.is_installed() and fs.installed_report() == report
    pause.resume.set()
    forward_thread.join(30)
    assert_same(result["out"], forwards.expected[0])
    # The gate is open again: the next forward goes lazy as before.
    assert_same(forwards.run(2), forwards.expected[2])
    assert fs.uninstall() is True


def test_a_timed_out_uninstall_leaves_the_gate_shut_for_another_that_waits(forwards):
    fs.install()
    gate = pruning_gate()
    pause = PauseAfterPruning(vars(LogitsProcessor)["_get_pruned_states"].__code__)
    forward_thread, result = run_paused(forwards, pause)
    waiting, uninstalled = uninstall_waiting(timeout=30)
    with pytest.raises(TimeoutError):
        fs.uninstall(timeout=0.05)
    assert not gate._open  # the first uninstall() still waits behind it
    pause.resume.set()
    forward_thread.join(30)
    waiting.join(30)
    assert uninstalled["result"] is True and not fs.is_installed()
    assert_same(result["out"], forwards.expected[0])


def test_uninstall_from_inside_a_forward_is_refused(forwards):
    fs.install()
    pause = PauseAfterPruning(
        vars(LogitsProcessor)["_get_pruned_states"].__code__, at_pause=lambda: _try(fs.uninstall)
    )
    forward_thread, result = run_paused(forwards, pause)
    pause.resume.set()
    forward_thread.join(30)
    assert isinstance(pause.at_pause_result, RuntimeError)
    assert "inside LogitsProcessor.forward" in str(pause.at_pause_result)
    assert_same(result["out"], forwards.expected[0])
    assert fs.is_installed()


def uninstall_waiting(timeout=None) -> tuple[threading.Thread, dict]:
    """``uninstall(timeout)`` on a thread of its own, returned once it has
    shut the gate and waits for the forwards in flight, with the dict its
    answer (or exception) lands in under ``"result"``."""
    gate = pruning_gate()
    uninstalled = {}
    thread = threading.Thread(
        target=lambda: uninstalled.update(result=_try(lambda: fs.uninstall(timeout=timeout))),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 30
    while gate._open:
        assert time.monotonic() < deadline, "uninstall() did not close the gate within 30 s"
        time.sleep(0.001)
    return thread, uninstalled


@pytest.mark.parametrize("call", ["installed_report", "install", "a deferred module's import"])
def test_a_forward_may_call_flatgather_while_uninstall_waits_for_it(
    forwards, call, monkeypatch, tmp_path
):
    """``uninstall()`` waits for the forwards in flight without holding the
    install lock: one that asks for the report, installs, or imports a module
    a patch waits for finishes, and then everything is restored."""
    if call == "a deferred module's import":
        module_name = "flatgather_test_deferred_module"
        (tmp_path / f"{module_name}.py").write_text("")
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, module_name, raising=False)
        prepared = []

        class Recording(Patch):
            """A patch of a module of its own: it records the import."""

            name = "recording"
            modules = (module_name,)

            def prepare(self, module):
                prepared.append(module)
                return Prepared()

        every = rooms.patches
        monkeypatch.setattr(rooms, "patches", lambda: (*every(), Recording()))

        def action():
            importlib.import_module(module_name)
            return prepared
    else:
        action = getattr(fs, call)
    before = dict(vars(LogitsProcessor))
    fs.install()
    pause = PauseAfterPruning(
        vars(LogitsProcessor)["_get_pruned_states"].__code__, on_resume=lambda: _try(action)
    )
    forward_thread, result = run_paused(forwards, pause)
    uninstaller, uninstalled = uninstall_waiting(timeout=5)
    pause.resume.set()
    forward_thread.join(30)
    uninstaller.join(30)
    assert not isinstance(pause.on_resume_result, Exception), pause.on_resume_result
    assert uninstalled["result"] is True  # not a TimeoutError
    assert "error" not in result, result.get("error")
    assert_same(result["out"], forwards.expected[0])
    assert not fs.is_installed() and dict(vars(LogitsProcessor)) == before
    if call == "a deferred module's import":
        assert [m.__name__ for m in pause.on_resume_result] == [module_name]


def _try(fn):
    try:
        return fn()
    except Exception as exc:
        return exc


def test_threaded_soak_forwards_while_installs_toggle(forwards):
    """Four threads run forwards while the main thread installs and
    uninstalls 25 times: every output is the release's; nothing raises but
    the release's own crash, where it has one, while uninstalled.

    Not a matrix test: what it drives is flatgather's gate, the same on every
    release; the release's side of it (the lazy path, its aux shapes) takes
    the three forms of the whole-suite releases, and every release gets the
    race pinned at its one dangerous point (the test above)."""
    before = dict(vars(LogitsProcessor))
    errors, done, counts = [], threading.Event(), [0] * 4
    toggles = 25

    def worker(k):
        rng = random.Random(k)
        try:
            # The release's own outputs, computed on this thread: the CPU
            # thread settings that a matmul's rounding depends on are per thread.
            expected = [forwards.run(i, stock=True) for i in range(len(BATCHES))]
            crashes = [forwards.release_crash(i) for i in range(len(BATCHES))]
            while not done.is_set() or counts[k] < 50:
                i = rng.randrange(len(BATCHES))
                try:
                    outputs = forwards.run(i)
                except TypeError as exc:
                    # Uninstalled at that moment, a release that crashes
                    # here crashes exactly so (a leaked lazy object fails
                    # differently).
                    assert (type(exc), str(exc)) == crashes[i], exc
                else:
                    assert_same(outputs, expected[i])
                counts[k] += 1
        except BaseException as exc:
            errors.append(exc)
            done.set()

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    try:
        for _ in range(toggles):
            if errors:
                break
            fs.install()
            time.sleep(0.001)
            fs.uninstall()
    finally:
        done.set()
        for w in workers:
            w.join(300)
    assert not errors, errors[0]
    assert min(counts) >= 50
    fs.uninstall()
    assert dict(vars(LogitsProcessor)) == before
