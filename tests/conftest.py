"""Test set-up: one SGLang release per pytest run.

The releases live side by side (see .ci/setup); ``.ci/test`` runs the suite
once per release with that release first on ``PYTHONPATH`` and
``FLATGATHER_TEST_RELEASE`` naming it, so a run can never silently test a
different SGLang than the one it claims to. The whole suite runs against the
releases marked ``full_suite`` in flatgather's release table; every release
runs the tests marked ``matrix``.

Tests gate on what the release does (its row of the table: packed aux,
trailing ``token_to_seq_idx`` entry, ...), never on its version string; a
matrix test checks that the probe finds each row true of the running code.
"""

from __future__ import annotations

import os
import re
import sys
import types
from collections import Counter
from typing import NoReturn

import flatgather.sglang
import pytest
from flatgather.sglang import releases
from hypothesis import HealthCheck, settings

RELEASE = releases.sglang_release()
ROW = releases.by_version(RELEASE)

settings.register_profile(
    "default",
    max_examples=int(os.environ.get("FLATGATHER_HYPOTHESIS_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("default")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "matrix: run against every release of the table, not only the full-suite ones"
    )
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")
    config.addinivalue_line(
        "markers", "engine: serves a workload on a real SGLang engine, flatgather off and on"
    )
    expected = os.environ.get("FLATGATHER_TEST_RELEASE")
    if expected and expected != RELEASE:
        raise pytest.UsageError(
            f"FLATGATHER_TEST_RELEASE={expected}, but the sglang on sys.path is {RELEASE}"
        )


def left_stock(what: str) -> NoReturn:
    """Where a test finds that flatgather leaves the release's code stock
    (refused it): on a release of the table, which says the test matrix
    verifies flatgather there, that is a regression, and the test fails; on
    any other release (a fork, one not yet in the table) it is what
    flatgather is meant to do with code it cannot prove, and the test skips."""
    if ROW is not None:
        pytest.fail(
            f"flatgather leaves {what} stock on SGLang {RELEASE}, a release of its table",
            pytrace=False,
        )
    pytest.skip(f"flatgather leaves {what} stock (SGLang {RELEASE} is not in its table)")


# A skip whose reason says flatgather left code stock, however the test
# worded it: on a release of the table it is a failure (see left_stock).
_REFUSAL = re.compile(r"flatgather\b.*\b(stock|refus)", re.IGNORECASE)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if ROW is None or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if _REFUSAL.search(reason):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped, saying flatgather left code stock, on SGLang {RELEASE}, "
            f"a release of its table: {reason}"
        )


_skipped: Counter = Counter()


def pytest_runtest_logreport(report):
    if report.skipped and isinstance(report.longrepr, tuple) and not hasattr(report, "wasxfail"):
        _skipped[report.longrepr[2].removeprefix("Skipped: ")] += 1


def pytest_terminal_summary(terminalreporter):
    """Every skip of the run by its reason, with the release; appended to
    ``FLATGATHER_SKIP_LOG`` where it is set (``.ci/test`` prints them all at
    the end), so that no skip goes by unread."""
    lines = [f"{count:4d}  {reason}" for reason, count in sorted(_skipped.items())]
    terminalreporter.write_sep("-", f"skips against sglang {RELEASE}: {_skipped.total()}")
    for line in lines:
        terminalreporter.write_line(line)
    log = os.environ.get("FLATGATHER_SKIP_LOG")
    if log:
        with open(log, "a") as out:
            for line in lines or ["   0  (none)"]:
                out.write(f"{RELEASE}\t{line}\n")


def pytest_report_header(config):
    row = "in the release table" if ROW else "NOT in the release table"
    return f"sglang release under test: {RELEASE} ({row})"


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


_STOCK: dict = {}
_MARKS = ("__flatgather__", "__flatgather_build__")


def _flatgather_functions_left() -> list[str]:
    """flatgather's functions still reachable in the SGLang modules imported
    so far: module-level ones (the logprob helpers it replaces in module
    globals) and methods of the modules' own classes (the rewritten ones)."""
    left = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("sglang.") or not isinstance(module, types.ModuleType):
            continue
        for attr, value in list(vars(module).items()):
            places = [(attr, value)]
            if isinstance(value, type) and value.__module__ == name:
                places += [(f"{attr}.{a}", v) for a, v in list(vars(value).items())]
            for where, fn in places:
                if isinstance(fn, types.FunctionType) and any(m in fn.__dict__ for m in _MARKS):
                    left.append(f"{name}.{where}")
    return left


@pytest.fixture(autouse=True)
def _uninstalled(monkeypatch):
    """Every test starts and ends with SGLang unpatched and its
    ``LogitsProcessor`` exactly as shipped.

    The fixture takes ``monkeypatch`` so that its teardown runs first: a test
    that installs over a monkeypatched release is uninstalled before the
    monkeypatch is undone, never the other way round.
    """
    flatgather.sglang.uninstall()
    module = sys.modules.get("sglang.srt.layers.logits_processor")
    if module is not None and not _STOCK:
        _STOCK.update(vars(module.LogitsProcessor))
    yield
    flatgather.sglang.uninstall()
    monkeypatch.undo()
    if _STOCK:
        leaked = (
            {
                name
                for name, value in vars(sys.modules[module.__name__].LogitsProcessor).items()
                if _STOCK.get(name) is not value
            }
            if module is not None
            else set()
        )
        assert not leaked, f"the test left LogitsProcessor changed: {sorted(leaked)}"
    left = _flatgather_functions_left()
    assert not left, f"uninstalled, but flatgather's functions are still in SGLang: {left}"
