"""Hostile input at the Python boundary, threads, and atomic patching."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import flatgather.sglang as fs
import numpy as np
import pytest
import torch
from _sglang import STOCK_PRUNED_STATES, LogitsProcessor, assert_same, metadata, pruned_states
from _strategies import batches
from flatgather import PlanError, _core, prune_plan
from flatgather.sglang import _patching
from hypothesis import given
from hypothesis import strategies as st

HOSTILE = (
    st.integers(-(2**70), 2**70)
    | st.booleans()
    | st.floats(allow_nan=True)
    | st.none()
    | st.text(max_size=3)
    | st.just(np.float32(1.0))
)


@given(
    extend=st.lists(HOSTILE | st.integers(0, 8), max_size=6),
    start=st.lists(HOSTILE | st.integers(0, 8), max_size=6),
    rows=st.none() | st.integers(-5, 100),
)
def test_hostile_lengths_give_a_plan_or_plan_error(extend, start, rows):
    try:
        plan = prune_plan(extend, start, num_rows=rows)
    except PlanError as exc:
        assert str(exc)
        assert exc.request is None or 0 <= exc.request < max(len(extend), len(start))
        return
    # Accepted: then every value was a real, consistent int length.
    assert all(type(v) is int for v in extend + start)
    assert plan.gather.numel() == plan.num_pruned <= sum(extend)


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
    ],
)
def test_wrong_containers_are_plan_errors(value):
    with pytest.raises(PlanError):
        prune_plan(value, [0, 0])


def test_fill_refuses_wrong_buffers():
    plan = _core.Plan([4, 5, 6], [0, 5, 3])
    with pytest.raises(PlanError, match="holds 3 int64 values"):
        plan.fill(np.zeros(3, dtype=np.int64))
    with pytest.raises(TypeError):
        plan.fill(np.zeros(64, dtype=np.int32))
    with pytest.raises(PlanError, match="contiguous"):
        plan.fill(np.zeros(128, dtype=np.int64)[::2])


@given(batches(max_batch=256))
def test_eight_threads_equal_serial(batch):
    extend, start = batch
    rows = sum(extend)
    h = torch.randn(rows, 4)
    aux = [torch.randn(rows, 4) for _ in range(2)]
    fs.install()
    serial = pruned_states(h, None, aux, metadata(extend, start))
    expected_plan = prune_plan(extend, start).buffer
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(
                lambda _: (
                    pruned_states(h, None, aux, metadata(extend, start)),
                    prune_plan(extend, start).buffer,
                ),
                range(16),
            )
        )
    for states, buffer in results:
        assert_same(states, serial)
        assert torch.equal(buffer, expected_plan)


def test_gil_is_released_while_a_large_plan_is_written():
    plan = _core.Plan([4096] * 256, [0] * 256)  # 1M rows: well past the detach threshold
    out = np.empty(plan.buffer_len(True), dtype=np.int64)
    ticks = 0
    stop = threading.Event()

    def ticker():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.01)
    before = ticks
    for _ in range(50):
        plan.fill(out)
    during = ticks - before
    stop.set()
    thread.join()
    # With the GIL held for the whole fill the ticker could only advance at
    # the few switch points between calls.
    assert during > 50


def test_failed_install_leaves_sglang_exactly_as_it_was(monkeypatch):
    raw_before = dict(vars(LogitsProcessor))
    applied = []
    real_apply = _patching.Patch.apply

    def apply_then_fail(self):
        if len(applied) == 2:
            raise RuntimeError("simulated failure midway")
        real_apply(self)
        applied.append(self.name)

    monkeypatch.setattr(_patching.Patch, "apply", apply_then_fail)
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
