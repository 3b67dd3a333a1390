"""A child interpreter that imports what this one imports: the test's
``PYTHONPATH`` made of absolute paths (a child may run in another directory),
with more directories first where a test needs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def pythonpath(*first) -> str:
    """``first``, then this process's ``PYTHONPATH``, each made absolute."""
    paths = [*first, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return os.pathsep.join(str(Path(p).resolve()) for p in paths if p)


def assert_prints(code: str, marker: str) -> None:
    """``code`` run by a fresh interpreter that also sees the tests' own
    modules: it must exit 0 having printed ``marker`` (its asserts have run)."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=pythonpath(TESTS)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert marker in out.stdout, out.stdout[-3000:]
