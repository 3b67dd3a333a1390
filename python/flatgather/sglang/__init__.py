"""Put flatgather under an unmodified SGLang.

>>> from flatgather import sglang as fg_sglang
>>> report = fg_sglang.install()   # doctest: +SKIP
>>> report.release, report.verified_by   # doctest: +SKIP
('0.5.23', 'probe and test matrix')
>>> fg_sglang.uninstall()           # doctest: +SKIP
True

The names below live in :mod:`flatgather.sglang.installer` and are loaded
from it on first use, so that importing a light module of this package (the
release table, :mod:`flatgather.sglang.releases`) imports neither torch nor
SGLang.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flatgather.sglang.installer import (
        SUPPORTED_RELEASES,
        InstallReport,
        PatchReport,
        UnsupportedRelease,
        install,
        installed_report,
        is_installed,
        sglang_release,
        uninstall,
    )
    from flatgather.sglang.patches.pruned_states import Contract

__all__ = [
    "SUPPORTED_RELEASES",
    "Contract",
    "InstallReport",
    "PatchReport",
    "UnsupportedRelease",
    "install",
    "installed_report",
    "is_installed",
    "sglang_release",
    "uninstall",
]


_HOMES = {
    "Contract": "flatgather.sglang.patches.pruned_states",
    "InstallReport": "flatgather.sglang.report",
    "PatchReport": "flatgather.sglang.report",
    "UnsupportedRelease": "flatgather.sglang.report",
}
"""Where a name of :data:`__all__` lives, if not in the installer."""


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOMES.get(name, "flatgather.sglang.installer")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
