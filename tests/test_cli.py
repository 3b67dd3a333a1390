"""The ``flatgather`` command: its sub-commands, ``install-pth``, and
``doctor``'s verdict on an environment where the switch cannot reach
spawned processes (an editable install). Children get absolute paths and a
bounded time, and show their stderr when they fail."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import flatgather
import pytest
from conftest import RELEASE
from flatgather import _pth, cli, doctor, launch_server

PACKAGE_ROOT = Path(flatgather.__file__).resolve().parent.parent
REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 300


def run(args, *, python=sys.executable, env=None, cwd=None, switch=None):
    """A child interpreter; its PYTHONPATH made of absolute paths."""
    env = dict(os.environ if env is None else env)
    env.pop("FLATGATHER_SGLANG", None)
    if switch is not None:
        env["FLATGATHER_SGLANG"] = switch
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(
            str(Path(p).resolve()) for p in env["PYTHONPATH"].split(os.pathsep) if p
        )
    return subprocess.run(
        [str(python), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT
    )


# -- the command --------------------------------------------------------------------


def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("bench", "report", "doctor", "launch-server", "install-pth"):
        assert f"  {name}" in out


def test_an_unknown_command_is_refused(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_the_console_script_is_declared_and_resolves():
    # tomllib is 3.11+; the section is two lines.
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.scripts]\n", 1)[1].split("\n[", 1)[0]
    assert 'flatgather = "flatgather.cli:main"' in section.splitlines()
    assert callable(cli.main)


def test_python_dash_m_is_the_same_command(tmp_path):
    out = run(["-m", "flatgather", "--help"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "install-pth" in out.stdout


def test_launch_server_goes_through_the_command(tmp_path):
    (tmp_path / "standin_entry.py").write_text(
        "import os, sys\nprint('entry', sys.argv[1:], os.environ['FLATGATHER_SGLANG'])\n"
    )
    env = {
        **os.environ,
        "FLATGATHER_LAUNCH_ENTRY": "standin_entry",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(PACKAGE_ROOT)]),
    }
    out = run(["-m", "flatgather", "launch-server", "--help"], env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "FLATGATHER_SGLANG=1" in out.stdout  # the launcher's own help first
    assert "entry ['--help'] 1" in out.stdout  # then the entry point's


def test_launch_server_refuses_without_the_pth_file(monkeypatch, capsys):
    monkeypatch.setenv("FLATGATHER_SGLANG", "1")  # restored after the test
    monkeypatch.setenv("FLATGATHER_LAUNCH_ENTRY", "this_module_does_not_exist_here")
    monkeypatch.setattr(_pth, "find", lambda dirs=None: [])
    assert launch_server.main(["--port", "30000"]) == 2
    err = capsys.readouterr().err
    assert "would run unpatched" in err and _pth.FIX in err


# -- install-pth -------------------------------------------------------------------


def test_the_line_is_the_one_the_wheel_ships():
    shipped = REPO / "python" / "flatgather-sglang.pth"
    if not shipped.is_file():
        pytest.skip("not in a source checkout")
    assert shipped.read_text().strip() == _pth.LINE


def test_install_pth_round_trip_in_a_site_dir(tmp_path, capsys):
    site_dir = tmp_path / "site-packages"
    assert _pth.main(["--site-dir", str(site_dir)]) == 0
    path = site_dir / _pth.NAME
    lines = path.read_text().splitlines()
    # flatgather is not imported from this directory (an editable install):
    # its directory comes first, so the line finds it whatever the .pth order.
    assert lines == [str(PACKAGE_ROOT), _pth.LINE]
    assert [f.ok for f in _pth.find([site_dir])] == [True]
    assert _pth.main(["--site-dir", str(site_dir)]) == 0
    assert "already up to date" in capsys.readouterr().out
    assert _pth.main(["--site-dir", str(site_dir), "--remove"]) == 0
    assert not path.exists() and _pth.find([site_dir]) == []
    assert _pth.main(["--site-dir", str(site_dir), "--remove"]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_a_pth_with_another_line_is_not_ours(tmp_path):
    (tmp_path / _pth.NAME).write_text("import os\n")
    assert [f.ok for f in _pth.find([tmp_path])] == [False]


def test_the_default_site_dir_is_one_start_up_reads():
    assert (
        _pth.target_dir() in _pth.site_dirs()
        or _pth.target_dir() == Path(sysconfig.get_paths()["purelib"]).resolve()
    )


# -- doctor ------------------------------------------------------------------------


def test_doctor_fails_when_the_switch_is_set_and_no_pth_is_there(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("FLATGATHER_SGLANG", "1")
    monkeypatch.setattr(_pth, "site_dirs", lambda: [tmp_path])
    assert doctor.main(["--skip-probe", "--runs", "1"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL]  no flatgather-sglang.pth" in out
    assert f": {_pth.FIX}" in out


def test_doctor_only_warns_without_the_switch(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("FLATGATHER_SGLANG", raising=False)
    monkeypatch.setattr(_pth, "site_dirs", lambda: [tmp_path])
    code = doctor.main(["--skip-probe", "--runs", "1"])
    out = capsys.readouterr().out
    assert "[WARN]  no flatgather-sglang.pth" in out
    assert code == (1 if "[FAIL]" in out else 0), out


@pytest.mark.skipif(RELEASE is None, reason="no sglang on sys.path")
def test_doctor_reports_the_probe_verdict(capsys):
    code = doctor.main(["--runs", "1"])
    out = capsys.readouterr().out
    assert re.search(rf"sglang +\[ok\] +{re.escape(RELEASE)} ", out), out
    assert "contract verified by probe and test matrix" in out
    assert "trailing token_to_seq entry" in out
    assert "start-up" in out
    assert code == (1 if "[FAIL]" in out else 0), out
    assert not flatgather.sglang.is_installed()


@pytest.fixture
def editable_env(tmp_path):
    """A fresh virtual environment that imports flatgather, torch and SGLang
    from PYTHONPATH, as an editable install would: its site-packages holds no
    flatgather-sglang.pth."""
    venv = tmp_path / "venv"
    made = run(["-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr[-3000:]
    python = venv / "bin" / "python"
    paths = [str(PACKAGE_ROOT), *sysconfig.get_paths()["purelib"].split(os.pathsep)]
    if RELEASE is not None:
        import sglang

        paths.append(str(Path(sglang.__file__).resolve().parent.parent))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    # Fail in seconds, showing why, when the child cannot import what it needs.
    ready = run(["-c", "import flatgather._core, numpy"], python=python, env=env, cwd=tmp_path)
    assert ready.returncode == 0, f"the test venv cannot import flatgather:\n{ready.stderr}"
    return python, env, tmp_path


def test_editable_install_doctor_fails_until_install_pth(editable_env):
    python, env, cwd = editable_env
    args = ["-m", "flatgather", "doctor", "--skip-probe", "--runs", "1"]

    before = run(args, python=python, env=env, cwd=cwd, switch="1")
    assert before.returncode == 1, before.stdout + before.stderr[-3000:]
    assert "no flatgather-sglang.pth" in before.stdout
    assert "does not arm flatgather" in before.stdout
    assert f": {_pth.FIX}" in before.stdout

    fixed = run(["-m", "flatgather", "install-pth"], python=python, env=env, cwd=cwd)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert str(cwd / "venv") in fixed.stdout

    after = run(args, python=python, env=env, cwd=cwd, switch="1")
    assert re.search(r"spawned +\[ok\]", after.stdout), after.stdout + after.stderr[-3000:]
    assert re.search(r"\.pth +\[ok\]", after.stdout), after.stdout
    if RELEASE is not None:
        assert after.returncode == 0, after.stdout

    removed = run(["-m", "flatgather", "install-pth", "--remove"], python=python, env=env, cwd=cwd)
    assert removed.returncode == 0 and "removed" in removed.stdout


def test_the_runtime_imports_nothing_of_the_benchmark(tmp_path):
    """install(), the switch and doctor run without the bench package: it is
    a tool that ships with flatgather, not a part of it."""
    code = (
        "import sys\n"
        "import flatgather.sglang as fs, flatgather.doctor as doctor\n"
        "fs.install(); fs.uninstall()\n"
        "doctor.main(['--runs', '1'])\n"
        "bench = sorted(m for m in sys.modules if m.startswith('flatgather.bench'))\n"
        "assert not bench, bench\n"
    )
    out = run(["-c", code], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
