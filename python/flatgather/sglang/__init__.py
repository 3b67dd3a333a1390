"""Put flatgather under an unmodified SGLang.

>>> from flatgather import sglang as fg_sglang
>>> report = fg_sglang.install()   # doctest: +SKIP
>>> report.release, report.patched   # doctest: +SKIP
('0.5.23', ('sglang.srt.layers.logits_processor.LogitsProcessor._get_pruned_states',))
>>> fg_sglang.uninstall()           # doctest: +SKIP
True

``install()`` replaces ``LogitsProcessor._get_pruned_states`` by one that
returns exactly what the installed release's own returns, building the index
sets of its "prefill with input logprobs" branch in one Rust pass and
gathering each tensor with one ``index_select``. On 0.5.10 it also applies the
two fixes of SGLang PR #21589 that the release lacks. ``uninstall()`` puts the
original objects back.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass, field

from flatgather import _import_hooks
from flatgather.sglang import _draft_prefill
from flatgather.sglang._contracts import (
    SUPPORTED_RELEASES,
    Contract,
    UnsupportedRelease,
    contract_for,
    sglang_release,
)
from flatgather.sglang._patching import Patch, apply_all, revert_all
from flatgather.sglang._pruned_states import (
    make_forward,
    make_hidden_states_to_store,
    make_pruned_states,
)

__all__ = [
    "SUPPORTED_RELEASES",
    "InstallReport",
    "UnsupportedRelease",
    "install",
    "is_installed",
    "sglang_release",
    "uninstall",
]

log = logging.getLogger("flatgather")

LOGITS_PROCESSOR = "sglang.srt.layers.logits_processor"


@dataclass(frozen=True)
class InstallReport:
    release: str
    """The SGLang release patched."""
    patched: tuple[str, ...]
    """Attributes replaced so far."""
    pending: tuple[str, ...] = ()
    """Modules whose patches apply once they are imported."""


@dataclass
class _Installed:
    contract: Contract
    patches: list[Patch] = field(default_factory=list)
    pending: dict[str, object] = field(default_factory=dict)

    def report(self) -> InstallReport:
        return InstallReport(
            self.contract.release,
            tuple(p.where for p in self.patches),
            tuple(sorted(self.pending)),
        )


_lock = threading.RLock()
_state: _Installed | None = None


def _logits_processor_patches(contract: Contract, lazy_aux: bool) -> list[Patch]:
    module = importlib.import_module(LOGITS_PROCESSOR)
    cls = module.LogitsProcessor
    raw = vars(cls)
    patches = [
        Patch(
            cls,
            "_get_pruned_states",
            make_pruned_states(raw["_get_pruned_states"], contract, lazy_aux),
        )
    ]
    if lazy_aux:
        patches += [
            Patch(
                cls,
                "_get_hidden_states_to_store",
                make_hidden_states_to_store(raw["_get_hidden_states_to_store"]),
            ),
            Patch(cls, "forward", make_forward(raw["forward"])),
        ]
    return patches


def _defer(state: _Installed, module_name: str, make_patches) -> None:
    """Apply ``make_patches(module)`` when ``module_name`` is imported (now,
    if it already is)."""

    def on_import(module) -> None:
        with _lock:
            if _state is not state or module_name not in state.pending:
                return
            state.patches.extend(apply_all(make_patches(module)))
            del state.pending[module_name]
            log.info("flatgather: patched %s on import", module_name)

    state.pending[module_name] = on_import
    _import_hooks.when_imported(module_name, on_import)


def install(force: bool = False, lazy_aux: bool = True) -> InstallReport:
    """Patch the installed SGLang; idempotent (a second call changes nothing
    and returns the first call's report).

    Refuses (:class:`UnsupportedRelease`) a release other than those in
    ``SUPPORTED_RELEASES`` unless ``force``. With ``lazy_aux`` (the default),
    ``LogitsProcessor.forward`` gathers from the EAGLE3 aux layers only the
    rows it stores (see ``flatgather.sglang._pruned_states``); its outputs are
    unchanged. Either every patch is applied or, if one fails, none is left
    behind and the error propagates.
    """
    global _state
    with _lock:
        if _state is not None:
            return _state.report()
        contract = contract_for(sglang_release(), force=force)
        state = _state = _Installed(contract)
        try:
            state.patches.extend(apply_all(_logits_processor_patches(contract, lazy_aux)))
            if "draft-prefill-no-logprob" in contract.backports:
                _defer(state, _draft_prefill.MODULE, _draft_prefill.patches)
        except BaseException:
            _state = None
            _cancel_pending(state)
            revert_all(state.patches)
            raise
        return state.report()


def _cancel_pending(state: _Installed) -> None:
    for module_name, callback in state.pending.items():
        _import_hooks.cancel(module_name, callback)
    state.pending.clear()


def uninstall() -> bool:
    """Restore every patched attribute to the original object and forget
    pending patches. Returns whether anything was installed."""
    global _state
    with _lock:
        state, _state = _state, None
        if state is None:
            return False
        _cancel_pending(state)
        revert_all(state.patches)
        state.patches.clear()
        return True


def is_installed() -> bool:
    return _state is not None


def installed_report() -> InstallReport | None:
    """What :func:`install` did, or None when not installed."""
    with _lock:
        return None if _state is None else _state.report()
