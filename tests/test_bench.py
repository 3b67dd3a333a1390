"""``flatgather bench`` and ``flatgather report``: the sections run on tiny
grids, the JSON they write is read back by ``report``, the machine's load is
judged, and the release to measure is found without a hand-set PYTHONPATH.
No assertion here is about how fast anything is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import flatgather
import numpy as np
import pytest
from conftest import RELEASE
from flatgather import _sglang_dirs
from flatgather.bench import machine, report, run, sections, stats, targets
from flatgather.bench.cases import Grid

if RELEASE is None:
    pytest.skip("no sglang on sys.path", allow_module_level=True)

PACKAGE_ROOT = Path(flatgather.__file__).resolve().parent.parent
REPO = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 300


# -- statistics ----------------------------------------------------------------


def test_ratios_are_taken_round_by_round():
    # A drift that hits both sides of each round cancels out of the ratio.
    drift = np.linspace(1.0, 3.0, 9)
    num = stats.summarize(list(2e-3 * drift), 1, np.random.default_rng(0)).to_dict()
    den = stats.summarize(list(1e-3 * drift), 1, np.random.default_rng(0)).to_dict()
    r = stats.ratio(num, den)
    assert r["median"] == pytest.approx(2.0)
    assert r["low"] == pytest.approx(2.0) and r["high"] == pytest.approx(2.0)
    assert not stats.spans_one(r)
    assert stats.spans_one({"median": 1.1, "low": 0.9, "high": 1.3})


def test_samples_are_interleaved_with_the_order_rotating():
    order: list[str] = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abc"}
    clock = lambda fn, k: (fn(), 1.0)[1]  # noqa: E731 - one call per sample, no timing
    stats.measure_side_by_side(fns, samples=3, warmup_s=0, sample_s=0, clock=clock)
    sampled = order[-9:]
    assert sampled == list("abc" + "bca" + "cab")


def ratio_rows(*intervals) -> list[dict]:
    return [
        {"ratios": {"stock/flatgather": {"low": low, "median": median, "high": high}}}
        for low, median, high in intervals
    ]


def test_never_slower_is_missed_only_where_the_whole_interval_is_below_one():
    noise = ratio_rows((0.9, 0.97, 1.04), (2.0, 2.1, 2.2))
    assert targets.never_slower(noise, "gate") == {"name": "gate", "met": True, "got": "min 0.97x"}
    slower = targets.never_slower([*noise, *ratio_rows((0.9, 0.95, 0.99))], "gate")
    assert slower == {"name": "gate", "met": False, "got": "min 0.95x, 1 slower"}


def test_at_least_judges_the_lowest_value_and_is_absent_without_one():
    assert targets.at_least("x", [], 1.0) == []
    assert targets.at_least("x", [3.0, 1.5], 2) == [
        {"name": "x", "met": False, "got": "1.50x to 3.00x"}
    ]
    assert targets.at_least("x", [250.4, 120.6], 100, span=False, digits=0) == [
        {"name": "x", "met": True, "got": "min 121x"}
    ]
    rows = ratio_rows((1, 2, 3), (4, 5, 6))
    rows[0]["batch"], rows[1]["batch"] = 1, 8
    assert targets.speedups(rows, "stock", "flatgather", lambda r: r["batch"] > 1) == [5]


def test_host_cost_times_the_pruned_states_shapes_at_zero_width():
    from flatgather.bench import host_cost, prune_section

    def shape(s):
        return s.batch, s.mean_extend, s.layers, s.aux

    for size, grid in prune_section.GRIDS.items():
        zero = host_cost.GRIDS[size].shapes(True)
        assert {s.hidden for s in zero} == {0}
        assert {shape(s) for s in grid.shapes(True)} <= {shape(s) for s in zero}
        assert host_cost.GRIDS[size].max_tokens == grid.max_tokens


# -- the machine's load ------------------------------------------------------------


def load_record(other_cores, before=(0.1, 0.1, 0.1), after=(0.2, 0.2, 0.2), threads=1):
    return {
        "cpus": 2,
        "threads": threads,
        "before": list(before),
        "after": list(after),
        "sections": {
            "pruned-states": {
                "seconds": 3.0,
                "other_cores": other_cores,
                "steal": 0.0,
                "competitors": [{"pid": 42, "command": "python busy.py", "cores": 0.9}],
            }
        },
    }


def test_a_quiet_machine_gets_no_warning():
    assert machine.judge(load_record(0.1), max_other_load=0.5) == []


def test_a_competing_process_is_named():
    (warning,) = machine.judge(load_record(0.95), max_other_load=0.5)
    assert warning.startswith("busy machine") and "0.9 during `pruned-states`" in warning
    assert "pid 42 `python busy.py`" in warning


def test_a_high_load_average_warns_and_so_do_too_many_threads():
    (warning,) = machine.judge(load_record(0.0, before=(2.5, 2, 2)), 0.5)
    assert "load average 2.50 before the run" in warning
    warnings = machine.judge(load_record(0.0, threads=3), 0.5)
    assert any("--threads 3 is more than the 2 cores" in w for w in warnings)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs /proc")
def test_cpu_of_other_processes_is_counted():
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        before = machine.snapshot()
        time.sleep(1.0)
        use = machine.usage(before, machine.snapshot(), top=1000)
    finally:
        child.kill()
        child.wait(10)
    assert use.other_cores is not None and use.other_cores >= 0.2
    assert child.pid in [c["pid"] for c in use.competitors]


# -- finding the release ---------------------------------------------------------


def fake_release(root: Path, version: str, complete: bool = True) -> Path:
    package = root / version / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if complete:
        (root / version / ".complete").write_text("")
    return root / version


def test_releases_side_by_side_are_found_by_version(tmp_path, monkeypatch):
    monkeypatch.setenv(_sglang_dirs.DIR_ENV, str(tmp_path))
    monkeypatch.chdir(tmp_path)
    fake_release(tmp_path, "0.5.9")
    wanted = fake_release(tmp_path, "0.5.10.post1")
    fake_release(tmp_path, "0.5.11", complete=False)  # setup did not finish it
    found = _sglang_dirs.available()
    assert list(found)[:2] == ["0.5.10.post1", "0.5.9"]
    assert "0.5.11" not in found
    resolved = _sglang_dirs.resolve("0.5.10.post1")
    assert resolved == wanted.resolve() and resolved.is_absolute()
    with pytest.raises(_sglang_dirs.SGLangNotFound, match=r"no such release.*0\.5\.10\.post1"):
        _sglang_dirs.resolve("0.5.99")
    assert _sglang_dirs.resolve(str(wanted)) == wanted.resolve()
    with pytest.raises(_sglang_dirs.SGLangNotFound, match="holds no sglang package"):
        _sglang_dirs.resolve(str(tmp_path))


def bench_child(args, tmp_path, **extra_env):
    """The bench in a fresh interpreter that finds flatgather (absolute
    path) but no SGLang on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLATGATHER_")}
    env["PYTHONPATH"] = str(PACKAGE_ROOT)
    env.update(extra_env)
    return subprocess.run(
        [sys.executable, "-m", "flatgather", "bench", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )


def test_an_unknown_release_is_a_one_line_error_listing_what_there_is(tmp_path):
    fake_release(tmp_path / "releases", "0.5.7")
    out = bench_child(
        ["--sglang", "9.9.9"], tmp_path, FLATGATHER_SGLANG_DIR=str(tmp_path / "releases")
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert "--sglang 9.9.9: no such release" in out.stderr and "0.5.7" in out.stderr


@pytest.mark.skipif(
    not (REPO / ".sglang" / str(RELEASE) / ".complete").is_file(),
    reason="the release under test is not installed side by side under .sglang/",
)
def test_sglang_flag_finds_the_release_from_anywhere(tmp_path):
    # No SGLang on PYTHONPATH, started outside the repository: --sglang finds
    # the release .ci/setup installed, through FLATGATHER_SGLANG_DIR.
    # The rotation section runs here, in a process of its own: it imports the
    # draft worker, which the tests of the draft patch import on their terms.
    args = ["--sglang", RELEASE, "--quick", "--samples", "1", "--quiet"]
    out = bench_child(
        [*args, "--section", "host-cost", "--section", "rotation", "--json", "b.json"],
        tmp_path,
        FLATGATHER_SGLANG_DIR=str(REPO / ".sglang"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"SGLang {RELEASE}" in out.stdout and "== host-cost" in out.stdout
    (rotation,) = [s for s in json.loads((tmp_path / "b.json").read_text())["sections"][1:]]
    assert rotation["name"] == "rotation"
    assert rotation["rows"] if rotation["status"] == "measured" else rotation["reason"]


# -- the sections, in process, on tiny grids -------------------------------------


@pytest.fixture
def tiny(monkeypatch):
    from flatgather.bench import forward, host_cost, logprobs, prune_section

    monkeypatch.setitem(
        sections.TIMINGS, "quick", sections.Timing(samples=3, warmup_s=0.001, sample_s=0.0005)
    )
    for module, hidden in ((prune_section, 16), (host_cost, 0)):
        monkeypatch.setitem(
            module.GRIDS,
            "quick",
            Grid((1, 6), (4,), (hidden,), ("bf16",), ((0, "none"), (2, "list")), 512),
        )
    monkeypatch.setitem(
        forward.GRIDS,
        "quick",
        forward.Grid((1, 6), (4,), ("LAST", "FULL"), ("list",), 512, (forward.TOP_IDS,)),
    )
    monkeypatch.setattr(forward, "HIDDEN", 16)
    monkeypatch.setitem(logprobs.GRIDS, "quick", logprobs.Grid((1, 6), (1, 4)))
    monkeypatch.setattr(logprobs, "VOCAB", 1024)


IN_PROCESS = ("pruned-states", "host-cost", "forward", "logprobs")


def bench(capsys, *args) -> tuple[int, str, str]:
    if "--section" not in args:
        args = (*args, *(a for name in IN_PROCESS for a in ("--section", name)))
    code = run.main(["--quick", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_sections_run_and_report_reads_the_json_back(tiny, tmp_path, capsys):
    path = tmp_path / "out" / "bench.json"
    code, out, err = bench(capsys, "--json", str(path), "--max-other-load", "1000")
    assert code == 0, err
    assert "torch threads 1 (pinned, --threads)" in out
    # The threshold is out of reach, so nothing blames other processes or the
    # load average (hypervisor steal, a "busy host", is outside its reach).
    assert "WARNING: busy machine:" not in out
    for name in IN_PROCESS:
        assert f"== {name}" in out
    assert "[3/" in err  # progress on stderr
    results = json.loads(path.read_text())
    assert results["threads"] == 1 and results["size"] == "quick"
    assert results["load"]["before"] and results["load"]["after"]
    by_name = {s["name"]: s for s in results["sections"]}
    assert list(by_name) == list(IN_PROCESS)
    for name in IN_PROCESS:
        section = by_name[name]
        assert section["status"] == "measured" and section["rows"]
        for row in section["rows"]:
            if "skipped" in row:
                continue
            # Some variants belong to some rows only (forward's floor: FULL).
            assert {"stock", "flatgather"} <= set(row["time"]) <= set(section["variants"])
            assert "stock/flatgather" in row["ratios"]
            assert row["aten_ops"]["stock"] > 0
            assert set(row["syncs"]) == set(row["aten_ops"])

    md, png = tmp_path / "r.md", tmp_path / "r.png"
    assert report.main([str(path), "--markdown", str(md), "--plot", str(png)]) == 0
    again = capsys.readouterr().out
    assert again.split("\nwrote ")[0] == out.split("\nwrote ")[0]  # the same report
    text = md.read_text()
    assert results["command"] in text and "## How to read this" in text
    assert "mean prompt 4 tokens" in text and "ext~" not in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_cuda_run_renders_its_extra_columns(tiny, tmp_path, capsys):
    # No GPU here: a CPU run's JSON dressed as a CUDA run's (host time,
    # GPU launches) must render in the table, the Markdown and the plot.
    path = tmp_path / "cpu.json"
    code, _, _ = bench(capsys, "--section", "host-cost", "--json", str(path), "--quiet")
    assert code == 0
    results = json.loads(path.read_text())
    results["machine"].update(device="cuda:0", gpu="a GPU")
    for row in results["sections"][0]["rows"]:
        row["host_time"] = row["time"]
        row["host_ratios"] = row["ratios"]
        row["launches"] = {"stock": 7, "flatgather": None}
    text = report.table(results)
    assert "stock host" in text and "GPU ops stock/fg" in text and "7/?" in text
    assert "fg (GPU)" in report.markdown(results)
    report.plot(results, tmp_path / "cuda.png")


def test_section_flag_runs_a_subset(tiny, tmp_path, capsys):
    path = tmp_path / "b.json"
    code, out, _ = bench(capsys, "--section", "host-cost", "--json", str(path), "--quiet")
    assert code == 0
    assert [s["name"] for s in json.loads(path.read_text())["sections"]] == ["host-cost"]
    assert "== pruned-states" not in out


def test_a_busy_machine_is_reported_everywhere(tiny, tmp_path, capsys):
    # A busy loop on the other core, and a threshold it is sure to exceed.
    path, md = tmp_path / "busy.json", tmp_path / "busy.md"
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        code, out, _ = bench(
            capsys,
            "--section",
            "pruned-states",
            "--max-other-load",
            "0.05",
            "--json",
            str(path),
            "--markdown",
            str(md),
            "--quiet",
        )
    finally:
        child.kill()
        child.wait(10)
    assert code == 0
    assert "WARNING: busy machine" in out
    assert any(w.startswith("busy machine") for w in json.loads(path.read_text())["warnings"])
    assert "> **Warning**" in md.read_text() and "busy machine" in md.read_text()


def test_a_ratio_whose_interval_holds_one_is_flagged():
    section = {
        "name": "x",
        "ratios": [{"key": "stock/flatgather", "decisive": True}],
        "rows": [
            {"ratios": {"stock/flatgather": {"median": 1.02, "low": 0.97, "high": 1.1}}},
            {"ratios": {"stock/flatgather": {"median": 3.0, "low": 2.9, "high": 3.1}}},
        ],
    }
    assert report.spanning(section) == (1, 2)
    assert report.fmt_ratio(section["rows"][0]["ratios"]["stock/flatgather"], True).endswith("?")


def test_legends_say_what_differs_in_words():
    common, short = report.split_series(
        ["hidden 1024, bf16, mean prompt 16 tokens", "hidden 1024, bf16, mean prompt 256 tokens"]
    )
    assert common == ["hidden 1024", "bf16"]
    assert list(short.values()) == ["mean prompt 16 tokens", "mean prompt 256 tokens"]


# -- report on a bad file ---------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no such file"), ("{not json", "is not JSON"), ('{"shapes": []}', "not written by")],
)
def test_report_on_a_bad_file_is_a_one_line_error(tmp_path, content, message):
    path = tmp_path / "missing.json"
    if content is not None:
        path.write_text(content)
    out = subprocess.run(
        [sys.executable, "-m", "flatgather", "report", str(path)],
        env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)},
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr


def test_the_spec_logprobs_section_is_flat_and_matches_stock(tiny, tmp_path, capsys, monkeypatch):
    from flatgather.bench import spec_logprobs

    monkeypatch.setitem(spec_logprobs.GRIDS, "quick", spec_logprobs.Grid((1, 6)))
    path = tmp_path / "b.json"
    code, _, err = bench(capsys, "--section", "spec-logprobs", "--json", str(path), "--quiet")
    assert code == 0, err
    (section,) = json.loads(path.read_text())["sections"]
    assert section["status"] == "measured", section
    rows = section["rows"]
    assert len(rows) == 4 and all("stock/flatgather" in r["ratios"] for r in rows)
    for series in {r["series"] for r in rows}:
        mine = [r for r in rows if r["series"] == series]
        assert len({(r["aten_ops"]["flatgather"], r["syncs"]["flatgather"]) for r in mine}) == 1
        assert mine[-1]["syncs"]["stock"] > mine[-1]["syncs"]["flatgather"]


def test_a_scoped_function_pays_its_scope_once_per_sample():
    """The stock side's scope (the release's module functions swapped back)
    is entered around each timed sample, not each call; a plain call enters
    it every time."""
    import contextlib

    from flatgather.bench.stats import Scoped, measure_side_by_side

    entered, calls = [], []

    @contextlib.contextmanager
    def scope():
        entered.append(1)
        yield

    fn = Scoped(lambda: calls.append(1), scope)
    fn()
    assert (len(entered), len(calls)) == (1, 1)
    entered.clear(), calls.clear()
    measure_side_by_side({"f": fn}, samples=3, warmup_s=0.0, sample_s=1e-4)
    assert len(calls) > 3 * len(entered) >= 3
