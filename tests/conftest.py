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
import sys
import types

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
