"""What :func:`flatgather.sglang.install` reports, the same for every
patch, and the error of a release it refuses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["InstallReport", "PatchReport", "UnsupportedRelease"]


class UnsupportedRelease(RuntimeError):
    """The running SGLang's ``_get_pruned_states`` is not one flatgather can
    reproduce exactly; nothing was patched. The message names the first
    difference the probe found."""


@dataclass(frozen=True)
class PatchReport:
    """One patch in one module, reported the same way for every patch."""

    patch: str
    module: str
    state: str
    """``"applied"``; ``"as shipped"`` (the release needs nothing here);
    ``"left stock"`` (see :attr:`notes`); ``"pending"`` (prepared when the
    module is imported)."""
    applied: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class InstallReport:
    """What :func:`install` did. Besides the fields below, what the patches in
    service report (:attr:`details`) reads as attributes too:
    ``report.contract`` (what the probe found the release's
    ``_get_pruned_states`` to do), ``report.lazy_aux``, ``report.lazy_full``,
    ``report.probe_seconds``."""

    release: str | None
    """The SGLang version found (None when it has no distribution metadata)."""
    patched: tuple[str, ...]
    """Attributes replaced so far."""
    pending: tuple[str, ...] = ()
    """Modules whose patches apply once they are imported."""
    verified_by: str = "probe"
    """``"probe and test matrix"`` for a release of the table, else ``"probe"``."""
    backports: tuple[str, ...] = ()
    """SGLang fixes applied so far: PR #21589's two, issue #36938's."""
    notes: tuple[str, ...] = ()
    """What was left stock, and why; how the probe ran."""
    patches: tuple[PatchReport, ...] = ()
    """Each patch in each module it was prepared for, or waits for."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """What each patch in service reports (:meth:`~flatgather.sglang.patching.Service.report`)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "details":
            raise AttributeError(name)
        try:
            return self.details[name]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}"
            ) from None
