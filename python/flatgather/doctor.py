"""``python -m flatgather doctor``: what a support request needs to know."""

from __future__ import annotations

import importlib.metadata
import sys


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    import flatgather
    from flatgather import _activate
    from flatgather.sglang import _contracts

    try:
        from flatgather import _core

        extension = f"loaded ({_core.__file__})"
    except ImportError as exc:
        extension = f"NOT loaded: {exc}"
    release = _contracts.sglang_release()
    supported = release in _contracts.CONTRACTS
    switch = _activate.mode()
    lines = [
        f"flatgather   {flatgather.__version__}",
        f"extension    {extension}",
        f"python       {sys.version.split()[0]}",
        f"torch        {_version('torch')}",
        f"sglang       {release or 'not installed'}",
        "supported    "
        + ("yes" if supported else "no")
        + f" (tested: {', '.join(_contracts.SUPPORTED_RELEASES)})",
        f"switch       {_activate.ENV}={switch or 'off'}",
    ]
    print("\n".join(lines))
    return 0 if supported and "NOT" not in extension else 1
