"""What :mod:`flatgather.sglang` exports: ``install()``, ``uninstall()``
and the report.

``install()`` reads top to bottom: the running release is probed
(:mod:`flatgather.sglang.pruned_states.probe`: its own ``_get_pruned_states`` against
flatgather's on small CPU batches), then ``LogitsProcessor`` is patched with
the contract the probe verified, and the V2 draft worker's prefill
(:mod:`flatgather.sglang.draft_prefill`) is rewritten when
``eagle_worker_v2`` is imported, after its own check, and so is the
scheduler's ``process_batch_result_prefill``
(:mod:`flatgather.sglang.prefill_result`) where it serves later requests
another's input logprobs (SGLang issue #36938), and the output-logprob chain
(:mod:`flatgather.sglang.spec_logprobs_check`) as its modules are imported.
The release table
(:mod:`flatgather.sglang.releases`) only says whether the release is also
covered by the test matrix. ``uninstall()`` puts the original objects back.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import logging
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType

from flatgather import _import_hooks

# The names the package exports from here: its list, written once there.
from flatgather.sglang import __all__ as __all__
from flatgather.sglang import (
    draft_prefill,
    prefill_result,
    releases,
    shapes,
    spec_logprobs,
    spec_logprobs_check,
)
from flatgather.sglang.input_logprobs import check as input_logprobs_check
from flatgather.sglang.patching import Patch, Prepared, apply_all, never_raises, revert_all
from flatgather.sglang.pruned_states import (
    Contract,
    LazyGate,
    make_forward,
    make_hidden_states_to_store,
    make_pruned_states,
    probe,
)
from flatgather.sglang.pruned_states.probe import ProbeFailed, Verdict
from flatgather.sglang.releases import sglang_release

log = logging.getLogger("flatgather")

LOGITS_PROCESSOR = "sglang.srt.layers.logits_processor"

SUPPORTED_RELEASES: tuple[str, ...] = tuple(r.version for r in releases.RELEASES)
"""The releases of the test matrix (:data:`flatgather.sglang.releases.RELEASES`)."""


class UnsupportedRelease(RuntimeError):
    """The running SGLang's ``_get_pruned_states`` is not one flatgather can
    reproduce exactly; nothing was patched. The message names the first
    difference the probe found."""


@dataclass(frozen=True)
class InstallReport:
    release: str | None
    """The SGLang version found (None when it has no distribution metadata)."""
    patched: tuple[str, ...]
    """Attributes replaced so far."""
    pending: tuple[str, ...] = ()
    """Modules whose patches apply once they are imported."""
    contract: Contract | None = None
    """What the probe found the release's ``_get_pruned_states`` to do."""
    verified_by: str = "probe"
    """``"probe and test matrix"`` for a release of the table, else ``"probe"``."""
    lazy_aux: bool = False
    """Lazy aux pruning is on (asked for and verified)."""
    lazy_full: bool = False
    """Under FULL capture no aux row is gathered (verified: the release's
    FULL store reads none)."""
    backports: tuple[str, ...] = ()
    """SGLang fixes applied so far: PR #21589's two, issue #36938's
    (:data:`flatgather.sglang.prefill_result.FIX`)."""
    notes: tuple[str, ...] = ()
    """What was left stock, and why; how the probe ran."""
    probe_seconds: float = 0.0


@dataclass
class _Installed:
    release: str | None
    verdict: Verdict
    gate: LazyGate | None
    patches: list[Patch] = field(default_factory=list)
    pending: dict[tuple[str, Callable], object] = field(default_factory=dict)
    """``(module name, prepare)`` -> the import callback, per deferred patcher."""
    backports: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def report(self) -> InstallReport:
        in_table = releases.by_version(self.release) is not None
        return InstallReport(
            release=self.release,
            patched=tuple(p.where for p in self.patches),
            pending=tuple(sorted({name for name, _ in self.pending})),
            contract=self.verdict.contract,
            verified_by="probe and test matrix" if in_table else "probe",
            lazy_aux=self.gate is not None,
            lazy_full=self.gate is not None and self.verdict.lazy_full,
            backports=tuple(self.backports),
            notes=tuple(self.notes),
            probe_seconds=self.verdict.seconds,
        )


_lock = threading.RLock()
_state: _Installed | None = None


def _logits_processor_patches(module, verdict: Verdict, gate: LazyGate | None) -> list[Patch]:
    cls = module.LogitsProcessor
    raw = vars(cls)
    store = None
    if gate is not None:
        store = make_hidden_states_to_store(raw["_get_hidden_states_to_store"])
    patches = [
        Patch(
            cls,
            "_get_pruned_states",
            make_pruned_states(
                raw["_get_pruned_states"],
                verdict.contract,
                gate,
                lazy_full=verdict.lazy_full,
                store=store,
            ),
        )
    ]
    if gate is not None:
        patches += [
            Patch(cls, "_get_hidden_states_to_store", store),
            Patch(cls, "forward", make_forward(raw["forward"], gate)),
        ]
    return patches


def _table_notes(release: str | None, contract: Contract) -> list[str]:
    row = releases.by_version(release)
    if row is None:
        return [
            f"SGLang {release or '(unknown version)'} is not in flatgather's test matrix; "
            "verified by the probe alone"
        ]
    expected = Contract(
        row.trailing_token_to_seq, row.packed_aux, row.writes_cpu_indices, row.prunes_aux
    )
    if expected != contract:
        # The probe verified what runs; the table describes the wheel.
        return [
            f"the running SGLang {release} differs from the published wheel "
            f"(table: {expected.describe()}); the probe's contract is used"
        ]
    return []


# Patchers that wait for a module to be imported: the module's name and its
# ``prepare(module) -> Prepared``, which never raises and verifies what it
# patches on its own. Each runs once, when (or if) that module is imported.
DEFERRED: tuple[tuple[str, Callable[[ModuleType], Prepared]], ...] = (
    (draft_prefill.MODULE, draft_prefill.prepare),
    # process_batch_result_prefill: in the mixin up to 0.5.12, in the batch
    # result processor from 0.5.13; a release has one of the two modules.
    *((name, prefill_result.prepare) for name in prefill_result.MODULES),
)

# The output-logprob chain (install(output_logprobs=True)): its producers
# and its consumers, wherever the running release has them.
OUTPUT_LOGPROBS: tuple[tuple[str, Callable[[ModuleType], Prepared]], ...] = tuple(
    (name, spec_logprobs_check.prepare_producers) for name in spec_logprobs_check.PRODUCER_MODULES
) + tuple(
    (name, spec_logprobs_check.prepare_consumers) for name in spec_logprobs_check.CONSUMER_CLASSES
)


def _absent(name: str) -> bool:
    """Whether the installed SGLang has no module ``name``, told from the
    packages already imported without importing anything."""
    if name in sys.modules:
        return False
    parts = name.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        package = sys.modules.get(".".join(parts[:depth]))
        if package is None:
            continue
        path = getattr(package, "__path__", None)
        for k in range(depth, len(parts)):
            if path is None:
                return True  # a module where a package would have to be
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: k + 1]), path)
            if spec is None:
                return True
            path = spec.submodule_search_locations
        return False
    return False


def _on_import(state: _Installed, prepare, module) -> None:
    name = module.__name__
    with _lock:
        if _state is not state or (name, prepare) not in state.pending:
            return
        del state.pending[(name, prepare)]
        # Never fail the import this rides on.
        result = never_raises(lambda module: module.__name__)(prepare)(module)
        state.notes.extend(result.notes)
        for note in result.notes:
            log.warning("flatgather: %s", note)
        if result.patches:
            state.patches.extend(apply_all(result.patches))
            state.backports.extend(result.backports)
            log.info("flatgather: patched %s (%s)", name, ", ".join(result.applied))


def install(
    force: bool = False,
    lazy_aux: bool = True,
    input_logprobs: bool = True,
    output_logprobs: bool = True,
) -> InstallReport:
    """Probe the running SGLang and patch it; idempotent (a second call
    changes nothing and returns the report so far).

    Raises :class:`UnsupportedRelease`, leaving SGLang untouched, when the
    probe finds that flatgather cannot reproduce the release's
    ``_get_pruned_states`` exactly. With ``lazy_aux`` (the default, and only
    where the probe verified it), ``LogitsProcessor.forward`` gathers from the
    EAGLE3 aux layers only the rows it stores; its outputs are unchanged.
    With ``input_logprobs`` (the default), the token-id input logprobs are
    gathered in one go (:mod:`flatgather.sglang.input_logprobs`), each
    function verified against the release's own first. With
    ``output_logprobs`` (the default), the output logprobs of decode and
    speculative verify steps (top logprobs, token-id logprobs) go from the
    device to the scheduler flat (:mod:`flatgather.sglang.spec_logprobs`),
    each stage verified against the release's own as its module is imported.
    Either every patch is applied or, if one fails, none is left behind and
    the error propagates.

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
    with _lock:
        if _state is not None:
            return _state.report()
        module = importlib.import_module(LOGITS_PROCESSOR)
        release = sglang_release()
        try:
            verdict = probe.run(module)
        except ProbeFailed as exc:
            raise UnsupportedRelease(
                f"SGLang {release or '(unknown version)'}: {exc}. Nothing was patched."
            ) from None
        # The probe's batches prove the contract on those batches: the code
        # itself must also be code the test matrix has run (shapes.py).
        try:
            shape = shapes.known(shapes.PRUNED_STATES, module.LogitsProcessor, "_get_pruned_states")
        except shapes.UnknownShape as exc:
            raise UnsupportedRelease(
                f"SGLang {release or '(unknown version)'}: {exc}. Nothing was patched."
            ) from None
        # Lazy aux hands the store only the rows it was seen to read: the
        # store must be known code too, else lazy aux stays off.
        store_unknown = None
        if lazy_aux and verdict.lazy_aux:
            try:
                shapes.known(shapes.STORE, module.LogitsProcessor, "_get_hidden_states_to_store")
            except shapes.UnknownShape as exc:
                store_unknown = str(exc)
        gate = LazyGate() if lazy_aux and verdict.lazy_aux and not store_unknown else None
        state = _Installed(release, verdict, gate)
        state.notes.extend(_table_notes(release, verdict.contract))
        seen_in = ", ".join(shapes.KNOWN[shapes.PRUNED_STATES][shape])
        state.notes.append(f"_get_pruned_states is code the test matrix runs ({seen_in})")
        if lazy_aux and not verdict.lazy_aux:
            state.notes.append(f"lazy aux pruning left off: {verdict.lazy_aux_note}")
        elif store_unknown:
            state.notes.append(f"lazy aux pruning left off: {store_unknown}")
        elif lazy_aux and not verdict.lazy_full:
            state.notes.append(f"FULL capture gathers every kept aux row: {verdict.lazy_full_note}")
        if verdict.metadata_note:
            state.notes.append(verdict.metadata_note)
        if verdict.pin_neutralised:
            state.notes.append(
                "this host has no CUDA and the release's _get_pruned_states pins memory "
                "unconditionally: the probe ran it with pin_memory=False (pinning changes no value)"
            )
        patches = _logits_processor_patches(module, verdict, gate)
        if input_logprobs:
            flat = input_logprobs_check.prepare(
                [sys.modules[m] for m in input_logprobs_check.MODULES if m in sys.modules]
            )
            patches += flat.patches
            state.notes.extend(flat.notes)
        _state = state
        try:
            state.patches.extend(apply_all(patches))
            state.backports.extend(verdict.contract.backports)
            deferred = DEFERRED + (OUTPUT_LOGPROBS if output_logprobs else ())
            for module_name, prepare in deferred:
                if _absent(module_name):
                    continue
                on_import = functools.partial(_on_import, state, prepare)
                state.pending[(module_name, prepare)] = on_import
                _import_hooks.when_imported(module_name, on_import)
        except BaseException:
            _state = None
            _cancel_pending(state)
            revert_all(state.patches)
            raise
        for note in state.notes:
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
        if state.gate is not None and state.gate.current():
            raise RuntimeError(
                "flatgather.sglang.uninstall() called from inside LogitsProcessor.forward, "
                "which it would wait for"
            )
    if state.gate is not None and not state.gate.close(timeout):
        raise TimeoutError(f"forwards still running after {timeout} s; flatgather stays installed")
    with _lock:
        if _state is not state:
            return False  # another uninstall() restored it meanwhile
        _state = None
        _cancel_pending(state)
        revert_all(state.patches)
        state.patches.clear()
        # Lists registered before now are read by the release's loops.
        spec_logprobs.clear()
        return True


@contextlib.contextmanager
def _module_functions_as_shipped() -> Iterator[None]:
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
        patches = [] if state is None else [p for p in state.patches if _is_module(p.target)]
        for patch in patches:
            setattr(patch.target, patch.name, patch.original)
        try:
            yield
        finally:
            for patch in reversed(patches):
                setattr(patch.target, patch.name, patch.new)


def _is_module(target) -> bool:
    return isinstance(target, ModuleType)


def is_installed() -> bool:
    return _state is not None


def installed_report() -> InstallReport | None:
    """What :func:`install` did, or None when not installed."""
    with _lock:
        return None if _state is None else _state.report()
