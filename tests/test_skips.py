"""A skip never hides a regression: one that says flatgather left code stock
fails on a release of the table and skips elsewhere, whatever the test
called; other skips skip, and every skip is reported by its reason
(``tests/conftest.py``, read by ``.ci/test``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from conftest import RELEASE, ROW

HERE = Path(__file__).resolve().parent

TESTS = """
import pytest
from conftest import left_stock


def test_refused_through_the_helper():
    left_stock("the release's f (a difference)")


def test_refused_in_its_own_words():
    pytest.skip("flatgather leaves this release's f stock: a difference")


def test_needs_cuda():
    pytest.skip("needs CUDA")


@pytest.mark.skip(reason="on demand")
def test_on_demand():
    pass
"""


def _run(tmp_path: Path, release_path: str) -> tuple[dict[str, str], str, str]:
    """The outcome of each test above under the suite's conftest, the run's
    output, and what it appended to the skip log."""
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_refusals.py").write_text(TESTS)
    log, xml = tmp_path / "skips.log", tmp_path / "results.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLATGATHER_")}
    env |= {"PYTHONPATH": release_path, "FLATGATHER_SKIP_LOG": str(log)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={xml}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    outcomes = {}
    for case in ElementTree.parse(xml).iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "skipped", "error")]
        outcomes[case.get("name")] = kinds[0] if kinds else "passed"
    return outcomes, proc.stdout + proc.stderr, log.read_text() if log.exists() else ""


def test_a_refusal_fails_on_a_table_release_and_every_skip_is_reported(tmp_path):
    assert ROW is not None, f"SGLang {RELEASE} is not in the table"
    release = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
    outcomes, out, log = _run(tmp_path, release)
    assert outcomes == {
        "test_refused_through_the_helper": "failure",
        "test_refused_in_its_own_words": "failure",
        "test_needs_cuda": "skipped",
        "test_on_demand": "skipped",
    }, out
    assert "a release of its table" in out, out
    assert log.splitlines() == [f"{RELEASE}\t   1  needs CUDA", f"{RELEASE}\t   1  on demand"]


def test_a_refusal_skips_off_the_table(tmp_path):
    """With no SGLang of the table (none on the path at all), flatgather
    leaving code stock is what it is meant to do: a skip, reported."""
    outcomes, out, log = _run(tmp_path, "")
    assert set(outcomes.values()) == {"skipped"} and len(log.splitlines()) == 4, out
    assert "not in its table" in log, log
