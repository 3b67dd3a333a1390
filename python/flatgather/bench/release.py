"""The SGLang release under test, as the bench's sections see it."""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

import torch

from flatgather import testing
from flatgather.bench.batches import metadata
from flatgather.sglang.patches import draft_prefill
from flatgather.sglang.patches.input_logprobs import CHUNK, MODULES, PREFILL
from flatgather.sglang.unpinned import first_run, within
from flatgather.testing import install_sgl_kernel_stand_in


class SGLang:
    """The release under test: its modules, its own functions (taken before
    ``install()``), and flatgather installed over it for the whole run."""

    def __init__(self, notes: list[str], draft: bool = False) -> None:
        from sglang.srt.layers import logits_processor as lp

        import flatgather.sglang as fs

        self.fs, self.lp = fs, lp
        self.release = fs.sglang_release()
        if fs.is_installed():
            # FLATGATHER_SGLANG was set: the import installed flatgather.
            fs.uninstall()
            notes.append("FLATGATHER_SGLANG was set; flatgather was uninstalled to time stock")
        self.draft_module = self.draft_stock = self.draft_fg = None
        self.draft_problem: str | None = None
        self.draft_notes: list[str] = []
        if draft:
            self._import_draft_worker()
        cls = lp.LogitsProcessor
        before = dict(vars(cls))
        modules = [sys.modules[m] for m in MODULES if m in sys.modules]
        functions = {(m, name): vars(m).get(name) for m in modules for name in (CHUNK, PREFILL)}
        self.report = fs.install()
        after = vars(cls)
        self.stock = {name: value for name, value in before.items() if after.get(name) is not value}
        """The release's own attributes that ``install()`` replaced."""
        self.token_ids = {
            f"{m.__name__}.{name}": (stock, vars(m)[name])
            for (m, name), stock in functions.items()
            if stock is not None and vars(m)[name] is not stock
        }
        """The token-id input-logprob functions ``install()`` replaced, by
        where they live: (the release's own, flatgather's)."""
        self.fg_pruned = after["_get_pruned_states"]
        if self.draft_module is not None:
            # install() patched the worker at once: it was imported already.
            owner = getattr(self.draft_module, draft_prefill.OWNER)
            self.draft_fg = vars(owner)[draft_prefill.METHOD]
        self.contract = self.report.contract
        self._stock_pruned = self.stock["_get_pruned_states"]
        self._notes: list[str] = []

        def first(no_pin):
            with within(no_pin):
                self._stock_pruned(None, torch.zeros(2, 1), None, None, metadata([2], [0]))

        _, self._no_pin = first_run(first)
        if self._no_pin is not None:
            self._notes.append(
                "This release pins memory unconditionally and this host has no CUDA: both "
                "sides ran under a TorchFunctionMode that turns pinning off, which adds to "
                "the time of each torch call (more to **stock**'s, which makes more calls)."
            )
        if not self.contract.prunes_aux:
            self._notes.append(
                "This release lacks SGLang PR #21589: its own code drops list aux layers (which "
                "flatgather prunes, the backport), so **stock** does less work on those rows."
            )

    def _import_draft_worker(self) -> None:
        """Import the V2 draft worker before ``install()``, so that its own
        method is at hand. It imports the GPU-only ``sgl_kernel``: where that
        is missing, a stand-in whose functions refuse to run takes its place
        (the rotation runs before any kernel would)."""
        if importlib.util.find_spec("sgl_kernel") is None:
            install_sgl_kernel_stand_in()
            self.draft_notes.append(
                "No `sgl_kernel` here: the draft worker was imported with a stand-in whose "
                "functions refuse to run (none runs before the draft forward)."
            )
        name, method = draft_prefill.MODULE, draft_prefill.METHOD
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            self.draft_problem = f"{name} does not import here: {type(exc).__name__}: {exc}"
            return
        owner = getattr(module, draft_prefill.OWNER, None)
        if not isinstance(owner, type) or method not in vars(owner):
            self.draft_problem = f"{name} has no {draft_prefill.WHERE}"
            return
        self.draft_module = module
        self.draft_stock = vars(owner)[method]

    def stock_pruned_states(self, hidden, before_norm, aux, md):
        with within(self._no_pin):
            return self._stock_pruned(None, hidden, before_norm, aux, md)

    def fg_pruned_states(self, hidden, before_norm, aux, md):
        with self.fg_scope():
            return self.fg_pruned(None, hidden, before_norm, aux, md)

    @contextlib.contextmanager
    def fg_scope(self):
        """Where flatgather's side runs: under the same pinning stand-in as
        the stock side where the release needs one (flatgather hands
        one-request batches to the release's own code, which pins
        unconditionally on some releases)."""
        with within(self._no_pin):
            yield

    @contextlib.contextmanager
    def stock_scope(self):
        """Where the release's side runs: the module-level functions
        ``install()`` replaced are the release's own, and pinning as on
        flatgather's side."""
        with testing.module_functions_as_shipped(), within(self._no_pin):
            yield

    def stock_notes(self) -> list[str]:
        return list(self._notes)

    def install_record(self) -> dict:
        r = self.report
        return {
            "release": r.release,
            "verified_by": r.verified_by,
            "probe_ms": round(r.probe_seconds * 1e3, 1),
            "contract": r.contract.describe() if r.contract else None,
            "lazy_aux": r.lazy_aux,
            "backports": list(r.backports),
            "patched": list(r.patched),
            "notes": list(r.notes),
        }

    def close(self) -> None:
        self.fs.uninstall()
