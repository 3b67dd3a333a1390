"""``flatgather doctor``: what a deployment needs to be right, checked.

Prints flatgather's version and where it is imported from, the extension,
Python, torch, the SGLang that ``import sglang`` finds and the probe's
verdict on it (``install()``, then ``uninstall()``), the switch, whether the
``flatgather-sglang.pth`` file that carries the switch into spawned
processes is in place, and what the switch costs each interpreter at
start-up. Exits 1 when any check fails, printing the command that fixes it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

OK, WARN, FAIL, INFO = "ok", "WARN", "FAIL", ""

PROBE_TARGET_MS = 50
STARTUP_WARN_MS = 50
CHILD_TIMEOUT_S = 60


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str | None = None


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def child_env(switch: str | None) -> dict[str, str]:
    """The environment for a child interpreter: ours, ``PYTHONPATH`` made
    absolute (a child may start elsewhere), the switch set or removed."""
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(
            str(Path(p).resolve()) for p in env["PYTHONPATH"].split(os.pathsep) if p
        )
    env.pop("FLATGATHER_SGLANG", None)
    if switch is not None:
        env["FLATGATHER_SGLANG"] = switch
    return env


def run_child(code: str, switch: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(switch),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )


def check_package() -> list[Check]:
    import flatgather

    where = Path(flatgather.__file__).resolve().parent
    checks = [Check("flatgather", INFO, f"{flatgather.__version__} ({where})")]
    try:
        from flatgather import _core

        checks.append(Check("extension", OK, f"loaded from {_core.__file__}"))
    except ImportError as exc:
        checks.append(
            Check(
                "extension",
                FAIL,
                f"flatgather._core does not load: {exc}",
                "build it: maturin develop --release (or bash .ci/setup)",
            )
        )
    checks.append(Check("python", INFO, f"{sys.version.split()[0]} ({sys.executable})"))
    torch = _version("torch")
    if torch is None:
        checks.append(
            Check("torch", FAIL, "not installed", "install the torch your SGLang release pins")
        )
    else:
        checks.append(Check("torch", INFO, torch))
    return checks


def check_sglang(probe: bool) -> list[Check]:
    import importlib.util

    from flatgather.sglang import releases

    spec = importlib.util.find_spec("sglang")
    if spec is None:
        from flatgather._sglang_dirs import describe_available

        return [
            Check(
                "sglang",
                FAIL,
                f"no SGLang is importable; {describe_available()}",
                "install SGLang in this environment, or pass --sglang VERSION",
            )
        ]
    release = releases.sglang_release()
    where = next(iter(spec.submodule_search_locations or ()), spec.origin)
    row = releases.by_version(release)
    tested = ", ".join(r.version for r in releases.RELEASES)
    checks = [
        Check(
            "sglang",
            OK if row else WARN,
            f"{release or '(unknown version)'} ({where}); "
            + ("in the test matrix" if row else f"not in the test matrix ({tested})"),
        )
    ]
    if not probe:
        return [*checks, Check("probe", INFO, "skipped (--skip-probe)")]
    return checks + check_probe()


def check_probe() -> list[Check]:
    import flatgather.sglang as fs

    print("doctor: importing SGLang to probe it (this can take a while)...", file=sys.stderr)
    try:
        started = time.perf_counter()
        fs.install()
        report = fs.installed_report()
        install_ms = (time.perf_counter() - started) * 1e3
    except fs.UnsupportedRelease as exc:
        return [
            Check(
                "probe",
                FAIL,
                str(exc),
                "use a release of the test matrix, or report the difference above",
            )
        ]
    except Exception as exc:
        return [Check("probe", FAIL, f"install() raised {type(exc).__name__}: {exc}")]
    finally:
        fs.uninstall()
    probe_ms = report.probe_seconds * 1e3
    slow = probe_ms > PROBE_TARGET_MS
    checks = [
        Check(
            "probe",
            WARN if slow else OK,
            f"contract verified by {report.verified_by} in {probe_ms:.0f} ms"
            + (f", above the {PROBE_TARGET_MS} ms target" if slow else "")
            + f" (install() with SGLang's import: {install_ms:.0f} ms)",
        ),
        Check("contract", INFO, report.contract.describe() if report.contract else "none"),
        Check(
            "patches",
            INFO,
            ", ".join(".".join(p.rsplit(".", 2)[-2:]) for p in report.patched)
            + "".join(f"; {m.rsplit('.', 1)[-1]} when imported" for m in report.pending)
            + f"; lazy aux {'on' if report.lazy_aux else 'off'}"
            + f"; backports: {', '.join(report.backports) or 'none'}",
        ),
    ]
    checks += [Check("note", INFO, note) for note in report.notes]
    return checks


ARMED = "import sys; print(int('flatgather._activate' in sys.modules), int('torch' in sys.modules))"


def check_switch(runs: int) -> list[Check]:
    from flatgather import _activate, _pth

    mode = _activate.mode()
    value = os.environ.get(_activate.ENV)
    checks = [
        Check(
            "switch",
            INFO,
            f"{_activate.ENV}={value!r} ({mode or 'off'})" if value else f"{_activate.ENV} unset",
        )
    ]
    # The switch set without the .pth file is a failure: SGLang's schedulers
    # run unpatched. Unset, the file is only needed once someone sets it.
    missing = FAIL if mode else WARN
    found = _pth.find()
    good = [f for f in found if f.ok]
    if good:
        checks.append(Check(".pth", OK, ", ".join(str(f.path) for f in good)))
    elif found:
        checks.append(
            Check(
                ".pth",
                missing,
                f"{found[0].path} does not end with the switch line",
                _pth.FIX,
            )
        )
    else:
        dirs = ", ".join(map(str, _pth.site_dirs())) or "no site-packages"
        checks.append(
            Check(
                ".pth",
                missing,
                f"no {_pth.NAME} in {dirs} (an editable install, pip install -e . or maturin "
                "develop, does not ship it): spawned processes, SGLang's schedulers "
                + ("included, run unpatched" if mode else "included, would run unpatched"),
                _pth.FIX,
            )
        )
    checks += check_startup(runs, missing)
    return checks


def _timed(switch: str | None) -> float:
    started = time.perf_counter()
    out = run_child("pass", switch)
    elapsed = time.perf_counter() - started
    if out.returncode != 0 or out.stderr.strip():
        raise RuntimeError(
            f"python -c pass with FLATGATHER_SGLANG={switch} failed "
            f"(exit {out.returncode}): {out.stderr.strip()[-2000:]}"
        )
    return elapsed


def check_startup(runs: int, missing: str) -> list[Check]:
    from flatgather._pth import FIX

    try:
        out = run_child(ARMED, "1")
    except subprocess.TimeoutExpired:
        return [Check("start-up", FAIL, f"a fresh interpreter took over {CHILD_TIMEOUT_S} s")]
    if out.returncode != 0:
        return [
            Check(
                "start-up",
                FAIL,
                f"a fresh interpreter with FLATGATHER_SGLANG=1 failed (exit {out.returncode}):\n"
                + out.stderr.strip()[-2000:],
            )
        ]
    armed, torch_loaded = [*out.stdout.split(), "0", "0"][:2]
    checks = []
    if armed != "1":
        checks.append(
            Check(
                "spawned",
                missing,
                "a fresh interpreter with FLATGATHER_SGLANG=1 does not arm flatgather"
                + (f"; its stderr: {out.stderr.strip()[-1000:]}" if out.stderr.strip() else ""),
                FIX,
            )
        )
    else:
        checks.append(
            Check("spawned", OK, "a fresh interpreter with FLATGATHER_SGLANG=1 arms flatgather")
        )
    if torch_loaded == "1":
        checks.append(
            Check(
                "start-up",
                FAIL,
                "the switch imports torch at interpreter start-up: every process pays for it",
            )
        )
    if armed != "1":
        return [
            *checks,
            Check("start-up", INFO, "cost not measured: the switch arms nothing here"),
        ]
    try:
        off, on = [], []
        for _ in range(runs):
            off.append(_timed(None))
            on.append(_timed("1"))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return [*checks, Check("start-up", FAIL, str(exc))]
    off_ms, on_ms = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    cost = on_ms - off_ms
    checks.append(
        Check(
            "start-up",
            WARN if cost > STARTUP_WARN_MS else OK,
            f"{cost:+.1f} ms per interpreter with the switch on (python -c pass: "
            f"{off_ms:.1f} ms off, {on_ms:.1f} ms on, median of {runs} each)",
        )
    )
    return checks


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        status = f"[{c.status}]" if c.status else ""
        text = c.detail.replace("\n", "\n" + " " * (width + 9))
        lines.append(f"{c.name.ljust(width)}  {status:<6}  {text}")
    failures = [c for c in checks if c.status == FAIL]
    warnings = [c for c in checks if c.status == WARN]
    lines.append("")
    fixes: dict[str, list[str]] = {}
    for c in failures + warnings:
        if c.fix:
            fixes.setdefault(c.fix, []).append(c.name)
    lines += [f"fix ({', '.join(names)}): {fix}" for fix, names in fixes.items()]
    if failures:
        names = ", ".join(c.name for c in failures)
        lines.append(f"doctor: {len(failures)} check(s) failed: {names}")
    else:
        lines.append("doctor: no failure" + (f" ({len(warnings)} warning(s))" if warnings else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="flatgather doctor",
        description="Check what a deployment of flatgather under SGLang needs; exit 1 on failure.",
    )
    parser.add_argument(
        "--sglang",
        metavar="VERSION|DIR",
        help="diagnose a release installed side by side by .ci/setup (e.g. 0.5.23) instead of "
        "the SGLang installed in the environment",
    )
    parser.add_argument(
        "--skip-probe", action="store_true", help="do not import SGLang to probe its contract"
    )
    parser.add_argument(
        "--runs", type=int, default=7, help="interpreter starts timed per setting (default 7)"
    )
    args = parser.parse_args(argv)
    if args.sglang:
        from flatgather import _sglang_dirs

        try:
            _sglang_dirs.select(args.sglang)
        except _sglang_dirs.SGLangNotFound as exc:
            print(f"flatgather doctor: error: {exc}", file=sys.stderr)
            return 2
    checks = check_package()
    if not any(c.status == FAIL for c in checks):
        checks += check_sglang(probe=not args.skip_probe)
    checks += check_switch(max(1, args.runs))
    print(render(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0
