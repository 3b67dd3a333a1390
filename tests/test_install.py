"""install() / uninstall(): idempotent, exact restore, refusal of untested releases."""

from __future__ import annotations

import flatgather.sglang as fs
import pytest
from _sglang import RELEASE, STOCK_PRUNED_STATES, LogitsProcessor
from flatgather.sglang import _contracts


def current():
    return vars(LogitsProcessor)["_get_pruned_states"]


def test_install_is_idempotent_and_uninstall_restores_the_original_object():
    assert not fs.is_installed()
    first = fs.install()
    patched = current()
    assert fs.install() == first and current() is patched
    assert fs.is_installed() and first.release == RELEASE
    assert fs.uninstall() is True
    assert current() is STOCK_PRUNED_STATES
    assert fs.uninstall() is False
    assert not fs.is_installed()


def test_cycles_leave_no_trace():
    for _ in range(5):
        fs.install()
        assert current() is not STOCK_PRUNED_STATES
        fs.uninstall()
        assert current() is STOCK_PRUNED_STATES
    assert fs.installed_report() is None


def test_untested_release_is_refused_naming_the_tested_ones(monkeypatch):
    monkeypatch.setattr(_contracts, "sglang_release", lambda: "0.4.9")
    monkeypatch.setattr(fs, "sglang_release", lambda: "0.4.9")
    with pytest.raises(fs.UnsupportedRelease) as info:
        fs.install()
    for release in ("0.4.9", "0.5.23", "0.5.15", "0.5.10", "force=True"):
        assert release in str(info.value)
    assert current() is STOCK_PRUNED_STATES and not fs.is_installed()


def test_force_uses_the_nearest_older_tested_contract(monkeypatch):
    monkeypatch.setattr(fs, "sglang_release", lambda: "0.5.16")
    report = fs.install(force=True)
    assert report.release == "0.5.16"
    assert current().__flatgather__.trailing_token_to_seq is True  # as 0.5.15
    assert _contracts.contract_for("0.5.99", force=True).packed_aux is True  # as 0.5.23
    assert _contracts.contract_for("0.4.1", force=True).backports  # as 0.5.10


def test_detected_release_is_the_one_on_sys_path():
    import importlib.metadata

    assert fs.sglang_release() == RELEASE
    assert RELEASE in fs.SUPPORTED_RELEASES
    assert importlib.metadata.version("sglang") == RELEASE
