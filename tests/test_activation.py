"""The FLATGATHER_SGLANG switch (the wheel's .pth file and import hook) in
fresh interpreters and in processes started with multiprocessing's spawn
method, as SGLang starts its schedulers; and the launcher.

Every child runs from a temporary directory with absolute paths only, and a
child that cannot start fails the test in seconds with its stderr shown."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _child import pythonpath
from conftest import RELEASE

TESTS = Path(__file__).resolve().parent
PTH = "flatgather-sglang.pth"

CHILD = textwrap.dedent(
    """
    import multiprocessing as mp

    def probe(queue):
        from sglang.srt.layers.logits_processor import LogitsProcessor
        fn = vars(LogitsProcessor)["_get_pruned_states"]
        queue.put(getattr(fn, "__flatgather__", None) is not None)

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=probe, args=(queue,))
        child.start()
        child.join(240)
        if child.exitcode != 0:
            raise SystemExit(f"spawned child exited with {child.exitcode}")
        print("child-patched" if queue.get(timeout=5) else "child-unpatched")
    """
)


def run_python(args, switch, tmp_path, timeout=300, **kw):
    env = {k: v for k, v in os.environ.items() if k != "FLATGATHER_SGLANG"}
    if switch is not None:
        env["FLATGATHER_SGLANG"] = switch
    env["PYTHONPATH"] = pythonpath()
    env.update(kw.pop("extra_env", {}))
    try:
        return subprocess.run(
            [sys.executable, *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"child timed out after {timeout} s; stderr:\n{(exc.stderr or '')[-3000:]}")


def pth_dirs() -> list[str]:
    return [d for d in site.getsitepackages() if (Path(d) / PTH).is_file()]


def test_the_wheel_installed_the_switch():
    assert pth_dirs(), f"{PTH} is in none of {site.getsitepackages()}: an editable install?"


@pytest.mark.parametrize(("switch", "want"), [("1", "child-patched"), (None, "child-unpatched")])
def test_spawned_child_follows_the_switch(tmp_path, switch, want):
    script = tmp_path / "parent.py"
    script.write_text(CHILD)
    out = run_python([str(script)], switch, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert want in out.stdout
    if switch:
        assert f"SGLang {RELEASE} verified by probe and test matrix" in out.stderr
        assert out.stderr.count("active in pid") == 1  # the child; the parent has no SGLang


IMPORTED = (
    "import sys; "
    "print(sorted(m for m in sys.modules if m.startswith(('flatgather', 'torch', 'numpy'))))"
)


@pytest.mark.parametrize("value", [None, "", "0", "off", "false", "no", " OFF ", "False"])
def test_switch_off_imports_nothing(tmp_path, value):
    out = run_python(["-c", IMPORTED], value, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("value", ["1", "on", "force", "yes"])
def test_switch_on_imports_no_torch_until_sglang_needs_it(tmp_path, value):
    out = run_python(["-c", IMPORTED], value, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = eval(out.stdout)  # a list of module names printed by the child
    assert set(loaded) == {
        "flatgather",
        "flatgather._activate",
        "flatgather._errors",
        "flatgather._import_hooks",
    }, loaded
    assert out.stderr == ""


def test_the_pth_and_the_activation_module_agree_on_off_values():
    from flatgather import _activate

    line = (Path(pth_dirs()[0]) / PTH).read_text()
    for value in _activate.OFF:
        assert repr(value) in line or f'"{value}"' in line
    assert line.count("\n") <= 1  # one line, as site.py runs it


def test_arming_twice_activates_once(tmp_path):
    """A ``lib64 -> lib`` venv makes Python run a .pth twice: one activation."""
    code = textwrap.dedent(
        f"""
        import site
        for d in {pth_dirs()!r}:
            site.addsitedir(d)  # runs the .pth again
        from sglang.srt.layers.logits_processor import LogitsProcessor
        print(hasattr(vars(LogitsProcessor)["_get_pruned_states"], "__flatgather__"))
        """
    )
    out = run_python(["-c", code], "1", tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "True"
    assert out.stderr.count("active in pid") == 1, out.stderr


def test_a_release_the_probe_refuses_warns_and_is_left_stock(tmp_path):
    code = textwrap.dedent(
        """
        from flatgather.sglang.patches.pruned_states import probe
        def refuse(derived):
            raise probe.ProbeFailed("sample_indices: expected [3], got [4] (simulated)")
        probe.verify = refuse
        from sglang.srt.layers.logits_processor import LogitsProcessor
        fn = vars(LogitsProcessor)["_get_pruned_states"]
        print("patched" if hasattr(fn, "__flatgather__") else "unpatched")
        """
    )
    out = run_python(["-c", code], "1", tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "unpatched"
    assert "WARNING" in out.stderr and "expected [3], got [4]" in out.stderr
    assert "Nothing was patched" in out.stderr


def test_force_means_on_and_says_it_is_no_longer_needed(tmp_path):
    code = "import sglang.srt.layers.logits_processor"
    out = run_python(["-c", code], "force", tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "no longer needed" in out.stderr and "active in pid" in out.stderr


def _standin_entry(tmp_path):
    (tmp_path / "standin_entry.py").write_text(
        textwrap.dedent(
            """
            import os, sys
            from sglang.srt.layers.logits_processor import LogitsProcessor
            fn = vars(LogitsProcessor)["_get_pruned_states"]
            print("argv", sys.argv[1:])
            print("switch", os.environ["FLATGATHER_SGLANG"])
            print("patched", hasattr(fn, "__flatgather__"))
            """
        )
    )
    return {
        "FLATGATHER_LAUNCH_ENTRY": "standin_entry",
        "PYTHONPATH": pythonpath(tmp_path),
    }


def test_launcher_runs_the_entry_point_with_arguments_unchanged(tmp_path):
    args = ["--model-path", "x y", "--port", "30000", "--enable-return-hidden-states"]
    out = run_python(
        ["-m", "flatgather.launch_server", *args],
        None,
        tmp_path,
        extra_env=_standin_entry(tmp_path),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"argv {args!r}" in out.stdout
    assert "switch 1" in out.stdout and "patched True" in out.stdout


def test_a_bad_log_level_warns_and_the_server_still_starts(tmp_path):
    env = {**_standin_entry(tmp_path), "FLATGATHER_LOG_LEVEL": "verbose"}
    out = run_python(
        ["-m", "flatgather.launch_server", "--port", "1"], None, tmp_path, extra_env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "patched True" in out.stdout
    assert "FLATGATHER_LOG_LEVEL=verbose is not a log level" in out.stderr
    assert "active in pid" in out.stderr  # INFO, the fallback


def test_launcher_help_says_what_it_does(tmp_path):
    out = run_python(
        ["-m", "flatgather.launch_server", "--help"],
        None,
        tmp_path,
        extra_env={"FLATGATHER_LAUNCH_ENTRY": "this_module_does_not_exist_here"},
    )
    assert "sglang.launch_server" in out.stdout and "FLATGATHER_SGLANG=1" in out.stdout


def test_a_child_that_cannot_start_fails_fast(tmp_path):
    out = run_python(["-c", "import this_module_does_not_exist_here"], "1", tmp_path, timeout=60)
    assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr


def test_the_release_table_imports_neither_torch_nor_sglang(tmp_path):
    """``flatgather.sglang`` loads its install machinery on first use, so the
    table (read by doctor and the release finder) stays light."""
    code = (
        "import sys\n"
        "from flatgather.sglang import releases\n"
        "assert releases.RELEASES\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang')))\n"
    )
    out = run_python(["-c", code], None, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


KEPT_TREES = textwrap.dedent(
    """
    import ast, gc, json
    import sglang.srt.layers.logits_processor as lp
    from flatgather.testing import install_sgl_kernel_stand_in

    install_sgl_kernel_stand_in()  # up to 0.5.12 the scheduler needs sgl_kernel
    import sglang.srt.managers.scheduler
    import sglang.srt.managers.tokenizer_manager
    from flatgather.sglang import installed_report

    gc.collect()
    live = [o for o in gc.get_objects() if isinstance(o, ast.AST)]
    report = installed_report()
    with open(lp.__file__) as f:
        one_file = sum(1 for _ in ast.walk(ast.parse(f.read())))
    print(json.dumps({
        "patched": list(report.patched) if report else [],
        "modules": sum(isinstance(o, ast.Module) for o in live),
        "nodes": len(live),
        "one_file": one_file,
    }))
    """
)


def test_a_patched_process_keeps_no_parsed_source_file(tmp_path):
    """What the install parsed to prove and rebuild the release's methods is
    garbage once it is done: every syntax-tree object left alive is one more
    for the garbage collector to walk in each full collection of the
    server's processes, for as long as they run (the files of one install
    held some 100,000 objects, a full collection of a scheduler's process
    about a sixth slower). Only the rebuilt methods' own trees may stay
    (they are how a second fix of one method builds on the first), fewer
    nodes than one parse of the logits processor's file."""
    out = run_python(["-c", KEPT_TREES], "1", tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["patched"], f"nothing was patched, so this proves nothing: {out.stderr[-2000:]}"
    assert found["modules"] == 0, found
    assert found["nodes"] < found["one_file"], found
