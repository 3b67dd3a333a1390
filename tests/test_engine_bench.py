"""The engine bench's reading of a sampler's output (``benches/engine.py
--profiler py-spy``): py-spy's collapsed stacks become the profile that
cProfile's snapshots give, so one report reads both. Pure functions; no
engine runs here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benches" / "engine.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("flatgather_engine_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


STACKS = [
    "<module> (/srv/sglang/srt/a.py:1);f (/srv/sglang/srt/a.py:10);g (/srv/sglang/srt/a.py:20) 3\n",
    # f recursing: inside f once per sample, and no f -> f callee.
    "<module> (/srv/sglang/srt/a.py:1);f (/srv/sglang/srt/a.py:10);f (/srv/sglang/srt/a.py:10) 2\n",
    "<module> (/srv/sglang/srt/a.py:1);recv_pyobj (/srv/zmq/sugar/socket.py:900) 5\n",
    "not a stack\n",
    "\n",
]


def test_collapsed_stacks_become_a_profile_with_each_sample_counted_once(bench):
    profile = bench.sampled_profile(STACKS, rate=10)
    module, f, g = (f"/srv/sglang/srt/a.py:{n}" for n in ("1(<module>)", "10(f)", "20(g)"))
    recv = "/srv/zmq/sugar/socket.py:900(recv_pyobj)"
    assert set(profile) == {module, f, g, recv}
    assert profile[f][:3] == [5, pytest.approx(0.5), pytest.approx(0.2)]
    assert profile[g][:3] == [3, pytest.approx(0.3), pytest.approx(0.3)]
    assert profile[module][:3] == [10, pytest.approx(1.0), pytest.approx(0.0)]
    assert profile[f][3] == {g: pytest.approx(0.3)}
    assert profile[module][3] == {f: pytest.approx(0.5), recv: pytest.approx(0.5)}


def test_a_sampled_profile_reads_its_pickling_from_the_sockets_functions(bench):
    profile = bench.sampled_profile(STACKS, rate=10)
    read = bench.process_profile(profile, cpu_s=1.0, served=10, sampled=True)
    assert read["pickle_share"] == pytest.approx(0.5)
    assert read["cpu_ms"] == pytest.approx(100.0)
    # cProfile's reading finds no pickling builtin in a sampler's profile.
    assert bench.process_profile(profile, cpu_s=1.0, served=10)["pickle_share"] == 0
    assert read["top_own"][0] == ["recv_pyobj (socket.py:900)", pytest.approx(50.0)]


def test_a_method_is_named_as_cprofile_names_it(bench):
    """py-spy says ``Class.method`` and ``f.<locals>.g``; the report's
    function sets (the step, the logprob functions) hold code names."""
    profile = bench.sampled_profile(
        [
            "run (/srv/sglang/srt/s.py:1);Scheduler.run_batch (/srv/sglang/srt/s.py:40) 4\n",
            "run (/srv/sglang/srt/s.py:1);serve.<locals>.on_done (/srv/sglang/srt/s.py:9) 1\n",
        ],
        rate=100,
    )
    assert set(profile) == {
        "/srv/sglang/srt/s.py:1(run)",
        "/srv/sglang/srt/s.py:40(run_batch)",
        "/srv/sglang/srt/s.py:9(on_done)",
    }
    assert bench.process_profile(profile, cpu_s=0.05, served=1, sampled=True)["of"] == "step"
