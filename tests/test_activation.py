"""The FLATGATHER_SGLANG switch (the wheel's .pth file and import hook) in
fresh interpreters and in processes started with multiprocessing's spawn
method, as SGLang starts its schedulers; and the launcher."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import RELEASE

TESTS = Path(__file__).parent

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
        patched = queue.get(timeout=240)
        child.join(60)
        print("child-patched" if patched else "child-unpatched")
    """
)


def run_python(args, switch, tmp_path, **kw):
    env = {k: v for k, v in os.environ.items() if k != "FLATGATHER_SGLANG"}
    if switch is not None:
        env["FLATGATHER_SGLANG"] = switch
    env.update(kw.pop("extra_env", {}))
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(("switch", "want"), [("1", "child-patched"), (None, "child-unpatched")])
def test_spawned_child_follows_the_switch(tmp_path, switch, want):
    script = tmp_path / "parent.py"
    script.write_text(CHILD)
    out = run_python([str(script)], switch, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert want in out.stdout
    if switch:
        assert f"SGLang {RELEASE}, patched" in out.stderr


def test_without_switch_nothing_of_flatgather_is_imported(tmp_path):
    out = run_python(
        ["-c", "import sys; print(sorted(m for m in sys.modules if 'flatgather' in m))"],
        None,
        tmp_path,
    )
    assert out.stdout.strip() == "[]"


def test_untested_release_warns_and_patches_nothing(tmp_path):
    # A stand-in module reports another version for the distribution lookup.
    code = textwrap.dedent(
        """
        from flatgather.sglang import _contracts
        _contracts.CONTRACTS.pop(_contracts.sglang_release())
        from sglang.srt.layers.logits_processor import LogitsProcessor
        fn = vars(LogitsProcessor)["_get_pruned_states"]
        print("patched" if hasattr(fn, "__flatgather__") else "unpatched")
        """
    )
    out = run_python(["-c", code], "1", tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "unpatched"
    assert "WARNING" in out.stderr and "not a release flatgather was tested against" in out.stderr


def test_launcher_runs_the_entry_point_with_arguments_unchanged(tmp_path):
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
    args = ["--model-path", "x y", "--port", "30000", "--enable-return-hidden-states"]
    out = run_python(
        ["-m", "flatgather.launch_server", *args],
        None,
        tmp_path,
        extra_env={
            "FLATGATHER_LAUNCH_ENTRY": "standin_entry",
            "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"argv {args!r}" in out.stdout
    assert "switch 1" in out.stdout and "patched True" in out.stdout


def test_launcher_help_says_what_it_does(tmp_path):
    out = run_python(
        ["-m", "flatgather.launch_server", "--help"],
        None,
        tmp_path,
        extra_env={"FLATGATHER_LAUNCH_ENTRY": "this_module_does_not_exist_here"},
    )
    assert "sglang.launch_server" in out.stdout and "FLATGATHER_SGLANG=1" in out.stdout
