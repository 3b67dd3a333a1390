"""Hostile input at the Python boundary, threads, and atomic patching.

The error boundary is total: whatever the public API is handed, it returns a
result or raises ``PlanError`` (with ``kind`` and ``request``), except that an
exception raised by the caller's own code (an ``__index__`` that raises,
``KeyboardInterrupt``, ``MemoryError``) propagates as itself.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import flatgather.sglang as fs
import numpy as np
import pytest
import torch
from _sglang import (
    STOCK_PRUNED_STATES,
    TRAILING_TOKEN_TO_SEQ,
    LogitsProcessor,
    assert_same,
    expected_pruned_states,
    pruned_states,
    stock_pruned_states,
)
from _strategies import batches
from flatgather import PlanError, _core, prune_plan, rotation_plan
from flatgather._errors import KINDS
from flatgather.bench.batches import make_states, metadata
from flatgather.sglang import patching
from hypothesis import given
from hypothesis import strategies as st


class Raising:
    """An object whose ``__index__`` raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __index__(self):
        raise self.exc


class Index:
    """An object that is an int through ``__index__`` (as SGLang's numpy
    or torch integers are)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self):
        return self.value


class HugeRepr:
    """Costs seconds to ``repr``: a message must not build it."""

    def __repr__(self):
        time.sleep(5)
        return "x" * 10**8


HOSTILE = (
    st.integers(-(2**70), 2**70)
    | st.integers(-(2**64), -(2**62))
    | st.integers(2**62, 2**64)
    | st.booleans()
    | st.floats(allow_nan=True)
    | st.none()
    | st.text(max_size=3)
    | st.text(alphabet=st.characters(min_codepoint=0x80), min_size=50, max_size=200)
    | st.just(np.float32(1.0))
    | st.just(np.bool_(True))
    | st.builds(np.int64, st.integers(0, 8))
    | st.just(torch.tensor(True))
    | st.just(torch.tensor(3.0))
    | st.builds(lambda v: torch.tensor(v), st.integers(0, 8))
    | st.builds(Index, st.integers(-(2**70), 2**70))
    | st.just(HugeRepr())
    | st.just(b"\xff" * 100)
)


@pytest.mark.matrix
@given(
    extend=st.lists(HOSTILE | st.integers(0, 8), max_size=6),
    start=st.lists(HOSTILE | st.integers(0, 8), max_size=6),
    rows=st.none() | HOSTILE | st.integers(-5, 100),
)
def test_hostile_lengths_give_a_plan_or_plan_error(extend, start, rows):
    started = time.perf_counter()
    try:
        plan = prune_plan(extend, start, num_rows=rows)
    except PlanError as exc:
        assert str(exc) and len(str(exc)) < 400, str(exc)
        assert exc.kind in KINDS
        assert exc.request is None or 0 <= exc.request < max(len(extend), len(start))
        return
    finally:
        # Describing a bad value is bounded work (no repr of HugeRepr).
        assert time.perf_counter() - started < 2.5
    # Accepted: then every value was a real, consistent integer length.
    assert not any(isinstance(v, (bool, np.bool_, float, str, bytes)) for v in extend + start)
    assert plan.gather.numel() == plan.num_pruned <= sum(int(v) for v in extend)


@given(lens=st.lists(HOSTILE | st.integers(1, 8), max_size=6), rows=st.none() | HOSTILE)
def test_hostile_rotation_lengths_give_a_plan_or_plan_error(lens, rows):
    try:
        plan = rotation_plan(lens, num_rows=rows)
    except PlanError as exc:
        assert exc.kind in KINDS and str(exc)
        return
    assert plan.num_tokens == sum(int(v) for v in lens)


@pytest.mark.parametrize(
    "exc", [KeyboardInterrupt(), MemoryError(), SystemExit(3), RuntimeError("mine"), TypeError()]
)
@pytest.mark.parametrize("where", ["extend", "start", "rows", "rotation"])
def test_an_exception_from_index_propagates_as_itself(exc, where):
    bad = Raising(exc)
    with pytest.raises(type(exc)) as info:
        if where == "extend":
            prune_plan([4, bad], [0, 0])
        elif where == "start":
            prune_plan([4, 5], [0, bad])
        elif where == "rows":
            prune_plan([4, 5], [0, 0], num_rows=bad)
        else:
            rotation_plan([2, bad])
    assert info.value is exc


def test_non_ascii_text_is_described_not_panicked_on():
    # A multi-byte character straddling any fixed byte cut.
    for text in ["é" * 40, "😀" * 100, "a" + "é" * 10**6]:
        with pytest.raises(PlanError) as info:
            prune_plan([text], [0])
        assert info.value.kind == "not_an_integer" and info.value.request == 0
        assert "characters" in str(info.value) or len(text) <= 32
        assert len(str(info.value)) < 300


@pytest.mark.parametrize(
    ("rows", "kind"),
    [
        (2.0, "not_an_integer"),
        ("9", "not_an_integer"),
        (2**70, "not_an_integer"),
        (True, "not_an_integer"),
        (torch.tensor(True), "not_an_integer"),
        (np.bool_(False), "not_an_integer"),
        ([9], "not_an_integer"),
        (8, "too_few_rows"),
    ],
)
def test_num_rows_of_any_type_is_a_result_or_plan_error(rows, kind):
    with pytest.raises(PlanError) as info:
        prune_plan([4, 5], [0, 0], num_rows=rows)
    assert info.value.kind == kind and info.value.request is None
    assert "num_rows" in str(info.value) or kind == "too_few_rows"


def test_integers_through_index_numpy_and_torch_are_accepted():
    values = [Index(4), np.int32(5), torch.tensor(6, dtype=torch.int16)]
    plan = prune_plan(values, [0, np.uint8(5), Index(3)], num_rows=Index(15))
    assert plan.gather.tolist() == [0, 1, 2, 3, 8, 12, 13, 14]


@pytest.mark.parametrize(
    "value",
    [
        torch.tensor(True),
        np.bool_(True),
        torch.tensor(4.0),
        torch.tensor([4]),
        np.array(4.0),
        np.float64(4.0),
        4 + 0j,
    ],
)
def test_bool_and_non_integer_scalars_are_refused(value):
    with pytest.raises(PlanError) as info:
        prune_plan([4, value], [0, 0])
    assert info.value.kind == "not_an_integer" and info.value.request == 1


def test_arguments_that_are_not_flags_are_refused():
    for kwargs in ({"exact_rows": 1}, {"pin_memory": "yes"}, {"exact_rows": None}):
        with pytest.raises(PlanError) as info:
            prune_plan([2], [0], **kwargs)
        assert info.value.kind == "bad_argument"


def test_an_enormous_legal_plan_is_refused_before_allocating():
    started = time.perf_counter()
    with pytest.raises(PlanError) as info:
        prune_plan([2**31 - 1], [0])  # 48 GiB of indices
    assert time.perf_counter() - started < 1.0
    assert info.value.kind == "plan_too_large" and "48.00 GiB" in str(info.value)
    # The same tokens, keeping one row: a tiny plan.
    assert prune_plan([2**31 - 1], [2**31 - 2]).num_pruned == 1


@pytest.mark.parametrize(
    "value",
    [
        torch.tensor([4.5]),
        torch.zeros(2, 2, dtype=torch.int64),
        np.array([[1]]),
        np.array(["4"]),
        "45",
        b"45",
        3,
        {4: 0},
        range(3),
        iter([1]),
    ],
)
def test_wrong_containers_are_plan_errors(value):
    with pytest.raises(PlanError) as info:
        prune_plan(value, [0, 0])
    assert info.value.kind == "bad_container"


def test_fill_refuses_wrong_buffers():
    plan = _core.PrunePlan([4, 5, 6], [0, 5, 3])
    with pytest.raises(PlanError, match="holds 3 int64 values"):
        plan.fill(np.zeros(3, dtype=np.int64))
    for bad in (np.zeros(64, dtype=np.int32), np.zeros(128, dtype=np.int64)[::2], [0] * 64):
        with pytest.raises(PlanError) as info:
            plan.fill(bad)
        assert info.value.kind == "bad_buffer"
    readonly = np.zeros(64, dtype=np.int64)
    readonly.flags.writeable = False
    with pytest.raises(PlanError, match="writable"):
        plan.fill(readonly)


def release_indices(extend, start) -> dict:
    """The index sets of the release's own ``_get_pruned_states``; the kept
    rows read off the states it returns for a column of row numbers."""
    rows = torch.arange(sum(extend), dtype=torch.float64).unsqueeze(1)
    pruned, _, _, sample, input_logprob, token_to_seq = stock_pruned_states(
        rows, None, None, metadata(extend, start)
    )
    if TRAILING_TOKEN_TO_SEQ:
        token_to_seq = token_to_seq[:-1]  # the plan's token_to_seq has no trailing entry
    return {
        "gather": pruned.squeeze(1).long().tolist(),
        "sample": sample.tolist(),
        "input_logprob": input_logprob.tolist(),
        "token_to_seq": list(token_to_seq),
    }


@given(batches(max_batch=256))
def test_eight_threads_give_the_release_answer(batch):
    """16 calls on 8 threads, each of ``prune_plan`` and of the installed
    ``_get_pruned_states``: every one gives what the release's own code gives."""
    extend, start = batch
    h, _, aux = make_states(extend, 0, torch.float32, 4, False, "list", 2)
    expected_states = expected_pruned_states(extend, start, h, None, aux, metadata(extend, start))
    expected_indices = release_indices(extend, start)
    fs.install()
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(
                lambda _: (
                    pruned_states(h, None, aux, metadata(extend, start)),
                    prune_plan(extend, start),
                ),
                range(16),
            )
        )
    for states, plan in results:
        assert_same(states, expected_states)
        assert {name: getattr(plan, name).tolist() for name in expected_indices} == (
            expected_indices
        )


def test_gil_is_released_while_a_large_plan_is_written():
    """A Python thread runs while ``fill`` runs: it stamps the time between
    short sleeps, and a stamp falls strictly between a fill's start and end.

    The switch interval is raised to a minute for the test, so the main
    thread is never made to hand over the GIL at a switch point between its
    two clock readings: only a ``fill`` that releases the GIL lets the other
    thread in there."""
    plan = _core.PrunePlan([4096] * 256, [0] * 256)  # 1M rows: well past the detach threshold
    out = np.empty(plan.buffer_len(True), dtype=np.int64)
    plan.fill(out)  # first touch of the pages, outside the timed calls
    stamps: list[float] = []
    stop = threading.Event()

    def stamper():
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.0002)  # releases the GIL, so the main thread never waits for it

    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    thread = threading.Thread(target=stamper)
    try:
        thread.start()
        while not stamps:
            time.sleep(0.001)
        windows = []
        for _ in range(20):
            started = time.perf_counter()
            plan.fill(out)
            windows.append((started, time.perf_counter()))
    finally:
        stop.set()
        thread.join(10)
        sys.setswitchinterval(interval)
    inside = [t for t in stamps if any(a < t < b for a, b in windows)]
    assert inside, f"no stamp inside any of 20 fills ({len(stamps)} stamps in all)"


def test_failed_install_leaves_sglang_exactly_as_it_was(monkeypatch):
    raw_before = dict(vars(LogitsProcessor))
    applied = []
    real_apply = patching.Swap.apply

    def apply_then_fail(self):
        if len(applied) == 2:
            raise RuntimeError("simulated failure midway")
        real_apply(self)
        applied.append(self.name)

    monkeypatch.setattr(patching.Swap, "apply", apply_then_fail)
    with pytest.raises(RuntimeError, match="midway"):
        fs.install()
    assert len(applied) == 2  # two patches went in before the failure ...
    assert dict(vars(LogitsProcessor)) == raw_before  # ... and came out again
    assert not fs.is_installed()
    assert fs.uninstall() is False
    assert dict(vars(LogitsProcessor)) == raw_before
    monkeypatch.undo()
    fs.install()
    assert vars(LogitsProcessor)["_get_pruned_states"] is not STOCK_PRUNED_STATES
    fs.uninstall()
    assert dict(vars(LogitsProcessor)) == raw_before
