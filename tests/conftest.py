"""Test set-up: one SGLang release per pytest run.

The releases live side by side (see .ci/setup); ``.ci/test`` runs the suite
once per release with that release first on ``PYTHONPATH`` and
``FLATGATHER_TEST_RELEASE`` naming it, so a run can never silently test a
different SGLang than the one it claims to.
"""

from __future__ import annotations

import os

import flatgather.sglang
import pytest
from flatgather.sglang import sglang_release
from hypothesis import HealthCheck, settings

RELEASE = sglang_release()

settings.register_profile(
    "default",
    max_examples=int(os.environ.get("FLATGATHER_HYPOTHESIS_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("default")


def pytest_configure(config):
    expected = os.environ.get("FLATGATHER_TEST_RELEASE")
    if expected and expected != RELEASE:
        raise pytest.UsageError(
            f"FLATGATHER_TEST_RELEASE={expected}, but the sglang on sys.path is {RELEASE}"
        )


def pytest_report_header(config):
    return f"sglang release under test: {RELEASE}"


@pytest.fixture(autouse=True)
def _uninstalled():
    """Every test starts and ends with SGLang unpatched."""
    flatgather.sglang.uninstall()
    yield
    flatgather.sglang.uninstall()
