"""The README says what the code does: its release table is the one the
table module prints."""

from __future__ import annotations

from pathlib import Path

from flatgather.sglang import releases

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_release_table_is_generated_from_the_release_table():
    assert releases.markdown() in README.read_text()
