"""What :mod:`flatgather.sglang` exports: ``install()``, ``uninstall()``
and the report.

``install()`` walks the patches (:func:`flatgather.sglang.patches.patches`),
each a :class:`~flatgather.sglang.patching.Patch`, in order, and knows none
of them by name. For each module a patch names: one already imported is
prepared and applied now (a required one, the pruning, is imported first);
one that exists but is not imported yet (or is still running its own code,
in an import cycle) is prepared when its import is done; one the installed
SGLang does not have is skipped. What is prepared now is applied
all together or not at all; a required patch that is refused refuses the
release, and nothing is patched. Every patch is reported the same way (see
:class:`PatchReport`). ``uninstall()`` reverts every swap in reverse order.
The release table (:mod:`flatgather.sglang.releases`) only says whether the
release is also covered by the test matrix.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

from flatgather import _import_hooks
from flatgather.sglang import patches as rooms
from flatgather.sglang import releases, source
from flatgather.sglang.patching import Option, Patch, Prepared, Service, Swap, apply_all, revert_all
from flatgather.sglang.releases import sglang_release
from flatgather.sglang.report import InstallReport, PatchReport, UnsupportedRelease

log = logging.getLogger("flatgather")

SUPPORTED_RELEASES: tuple[str, ...] = tuple(r.version for r in releases.RELEASES)
"""The releases of the test matrix (:data:`flatgather.sglang.releases.RELEASES`)."""


@dataclass
class _Installed:
    release: str | None
    swaps: list[Swap] = field(default_factory=list)
    outcomes: list[PatchReport] = field(default_factory=list)
    pending: dict[tuple[str, Patch], Any] = field(default_factory=dict)
    """``(module name, patch)`` -> its import callback."""
    services: list[Service] = field(default_factory=list)
    """What the patches applied left in service, each once, in order."""
    backports: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def record(self, patch: Patch, module: str, result: Prepared) -> None:
        state = "applied" if result.swaps else "left stock" if result.notes else "as shipped"
        outcome = PatchReport(patch.name, module, state, result.applied, result.notes)
        self.outcomes.append(outcome)
        for listener in tuple(_listeners):
            listener(outcome)
        self.notes.extend(result.notes)
        if result.swaps:
            self.backports.extend(b for b in result.backports if b not in self.backports)
            self.services.extend(s for s in result.services if s not in self.services)

    def report(self) -> InstallReport:
        in_table = releases.by_version(self.release) is not None
        details: dict[str, Any] = {}
        for service in self.services:
            details.update(service.report())
        waiting = tuple(PatchReport(patch.name, name, "pending") for name, patch in self.pending)
        return InstallReport(
            release=self.release,
            patched=tuple(s.where for s in self.swaps),
            pending=tuple(sorted({name for name, _ in self.pending})),
            verified_by="probe and test matrix" if in_table else "probe",
            backports=tuple(self.backports),
            notes=tuple(self.notes),
            patches=(*self.outcomes, *waiting),
            details=MappingProxyType(details),
        )


_lock = threading.RLock()
_state: _Installed | None = None
_listeners: list[Callable[[PatchReport], None]] = []


def on_record(listener: Callable[[PatchReport], None]) -> Callable[[], None]:
    """From now on, call ``listener`` with each patch's report in each
    module as it is recorded (by :func:`install`, and by each later import
    of a module a patch waits for), under the install lock: a process's own
    account of what was installed as it happened (the engine tests' trace).
    It must not raise (that fails the install or the import). Returns what
    stops the calls."""
    _listeners.append(listener)
    return functools.partial(_listeners.remove, listener)


def _table_note(release: str | None) -> list[str]:
    if releases.by_version(release) is not None:
        return []
    return [
        f"SGLang {release or '(unknown version)'} is not in flatgather's test matrix; "
        "verified by the probe alone"
    ]


def install_options() -> dict[str, Option]:
    """Every ``install()`` keyword, from the patches that declare it
    (:attr:`flatgather.sglang.patching.Patch.options`)."""
    found: dict[str, Option] = {}
    for patch in rooms.patches():
        found.update(patch.options)
    return found


def _on_import(state: _Installed, patch: Patch, module) -> None:
    name = module.__name__
    with _lock:
        if _state is not state or (name, patch) not in state.pending:
            return
        del state.pending[(name, patch)]
        # Never fail the import this rides on: prepare() never raises.
        try:
            result = patch.prepare(module)
        finally:
            source.forget_parses()
        for note in result.notes:
            log.warning("flatgather: %s", note)
        _apply(state, patch, name, result)
        if result.swaps:
            log.info("flatgather: patched %s (%s)", name, ", ".join(result.applied))


def _apply(state: _Installed, patch: Patch, name: str, result: Prepared) -> None:
    state.swaps.extend(apply_all(result.swaps))
    state.record(patch, name, result)


def install(force: bool = False, **options: bool) -> InstallReport:
    """Probe the running SGLang and patch it; idempotent (a second call
    changes nothing and returns the report so far).

    Raises :class:`UnsupportedRelease`, leaving SGLang untouched, when the
    probe finds that flatgather cannot reproduce the release's
    ``_get_pruned_states`` exactly. Either every patch that applies now is
    applied or, if one fails, none is left behind and the error propagates.

    The keywords are the patches' options (:func:`install_options`), each True
    unless given: ``lazy_aux`` (inside ``LogitsProcessor.forward``, gather the
    EAGLE3 aux layers only at the rows stored, where the probe verified it),
    ``input_logprobs`` (the token-id input logprobs in one go),
    ``output_logprobs`` (the output logprobs of decode and verify steps handed
    to the scheduler flat), ``front_end`` (the tokenizer manager's logprob
    texts decoded in one go), ``openai_logprobs`` (the OpenAI ``logprobs``
    object built in one pass). Any other keyword raises ``TypeError``.

    ``force`` is accepted for compatibility and changes nothing: every
    release, tested or not, is patched exactly when the probe passes.
    """
    global _state
    if force:
        warnings.warn(
            "install(force=True) is no longer needed and has no effect: flatgather "
            "patches any SGLang release whose probe passes, and none other",
            DeprecationWarning,
            stacklevel=2,
        )
    known = install_options()
    for key, value in options.items():
        if key not in known:
            raise TypeError(
                f"install() got an unexpected keyword argument {key!r} "
                f"(the patches' options: {', '.join(sorted(known))})"
            )
        if not isinstance(value, bool):
            raise TypeError(f"install({key}=...) takes True or False, not {value!r}")
    with _lock:
        if _state is not None:
            return _state.report()
        release = sglang_release()
        state = _Installed(release)
        memo: dict = {}  # what this installation's patches remember
        chosen = [p for p in (patch.configure(options, memo) for patch in rooms.patches()) if p]
        said: tuple[str, ...] = ()
        _state = state
        try:
            for patch in chosen:
                for name in patch.modules:
                    if patch.required:
                        result = patch.prepare(importlib.import_module(name))
                        if not result.swaps:
                            raise UnsupportedRelease(
                                f"SGLang {release or '(unknown version)'}: {result.refusal}. "
                                "Nothing was patched."
                            )
                        _apply(state, patch, name, result)
                        said = result.notes
                    elif not _import_hooks.absent(name) and (name, patch) not in state.pending:
                        # Prepared and applied now if the module is whole, in
                        # this order (a later patch may rebuild what an
                        # earlier one rebuilt: the chain, the #36938 fix's
                        # method up to 0.5.12); else once its import is done.
                        on_import = functools.partial(_on_import, state, patch)
                        state.pending[(name, patch)] = on_import
                        _import_hooks.when_imported(name, on_import)
        except BaseException:
            _state = None
            _cancel_pending(state)
            revert_all(state.swaps)
            raise
        finally:
            source.forget_parses()
        table = _table_note(release)
        state.notes[:0] = table
        # The other patches' notes were logged as each was prepared.
        for note in (*table, *said):
            log.info("flatgather: %s", note)
        return state.report()


def _cancel_pending(state: _Installed) -> None:
    for (module_name, _), callback in state.pending.items():
        _import_hooks.cancel(module_name, callback)
    state.pending.clear()


def uninstall(timeout: float | None = None) -> bool:
    """Restore every patched attribute to the original object and forget
    pending patches. Returns whether this call uninstalled anything.

    Forwards already running finish with the patches they started with:
    ``uninstall()`` first lets no new forward use lazy aux pruning, waits for
    those in flight to leave, then restores everything in one step. It waits
    without holding the install lock, so a forward may meanwhile call
    :func:`install` or :func:`installed_report`, or import a module a patch
    waits for. With a ``timeout`` (seconds) that passes first, it raises
    ``TimeoutError`` and leaves the installation as it was. Called from
    inside a patched ``forward``, it raises ``RuntimeError`` (it would wait
    for itself).
    """
    global _state
    with _lock:
        state = _state
        if state is None:
            return False
        services = list(state.services)
        for service in services:
            where = service.busy_here()
            if where:
                raise RuntimeError(
                    f"flatgather.sglang.uninstall() called from {where}, which it would wait for"
                )
    for service in services:
        if not service.drain(timeout):
            raise TimeoutError(
                f"forwards still running after {timeout} s; flatgather stays installed"
            )
    with _lock:
        if _state is not state:
            return False  # another uninstall() restored it meanwhile
        _state = None
        _cancel_pending(state)
        revert_all(state.swaps)
        state.swaps.clear()
        for service in reversed(state.services):
            service.reverted()
        return True


@contextlib.contextmanager
def module_functions_as_shipped() -> Iterator[None]:
    """Within it, the module-level functions that :func:`install` replaced
    (the token-id input logprobs) are the release's own again, so that the
    release's code can be run beside flatgather's in one process: the
    bench's **stock** side, the tests' oracle (:mod:`flatgather.testing`
    hands it out). Not for serving: every thread
    sees the swap. It holds the install lock throughout, so that no
    ``install()`` or ``uninstall()`` in another thread interleaves with the
    swap and the swap back (either would leave the other's functions in
    place)."""
    with _lock:
        state = _state
        swaps = [] if state is None else [s for s in state.swaps if _is_module(s.target)]
        for swap in swaps:
            setattr(swap.target, swap.name, swap.original)
        try:
            yield
        finally:
            for swap in reversed(swaps):
                setattr(swap.target, swap.name, swap.new)


def _is_module(target) -> bool:
    return isinstance(target, ModuleType)


def in_service() -> tuple[Service, ...]:
    """What the patches applied so far left in service, in order (none when
    not installed): the bench and the tests read a patch's state there."""
    with _lock:
        return () if _state is None else tuple(_state.services)


def installed_swaps() -> tuple[Swap, ...]:
    """Every swap applied so far, in order (none when not installed): what
    is in place of the release's code, for the bench to read."""
    with _lock:
        return () if _state is None else tuple(_state.swaps)


def is_installed() -> bool:
    return _state is not None


def installed_report() -> InstallReport | None:
    """What :func:`install` did, or None when not installed."""
    with _lock:
        return None if _state is None else _state.report()
