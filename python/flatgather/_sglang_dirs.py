"""Which SGLang to measure (or to diagnose), without a hand-set ``PYTHONPATH``.

``--sglang 0.5.23`` picks the release that ``.ci/setup`` installed under
``<repository>/.sglang/0.5.23`` (or ``$FLATGATHER_SGLANG_DIR/0.5.23``);
``--sglang /some/dir`` takes a directory that holds an ``sglang`` package.
Without ``--sglang``, the SGLang installed in the environment is used as
is. The chosen directory goes first on ``sys.path`` (and on ``PYTHONPATH``,
for child processes) before anything of SGLang is imported. Standard library
only: nothing here imports torch or SGLang.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

DIR_ENV = "FLATGATHER_SGLANG_DIR"
"""A directory holding releases side by side, one sub-directory per version
(what ``.ci/setup`` makes under ``.sglang/``)."""

MARKER = ".complete"
"""Written by ``.ci/setup`` once a release is fully installed."""


class SGLangNotFound(Exception):
    """No SGLang to use; the message lists what is available."""


def release_roots() -> list[Path]:
    """Directories that may hold releases side by side: ``$FLATGATHER_SGLANG_DIR``
    alone when it is set, else ``.sglang/`` in the current directory, in the
    repository this package is imported from, or in the one the
    interpreter's environment lives in (or a parent of each)."""
    if os.environ.get(DIR_ENV):
        return [Path(os.environ[DIR_ENV]).expanduser().resolve()]
    roots: list[Path] = []
    starts = [Path.cwd(), Path(__file__).resolve().parent, Path(sys.prefix).resolve()]
    for start in starts:
        for parent in (start, *start.parents):
            candidate = parent / ".sglang"
            if candidate.is_dir():
                roots.append(candidate.resolve())
                break
    unique: list[Path] = []
    for root in roots:
        if root not in unique:
            unique.append(root)
    return unique


def _version_key(version: str) -> tuple:
    parts = []
    for piece in version.replace(".post", ".").split("."):
        parts.append(int(piece) if piece.isdigit() else 0)
    return tuple(parts)


def available() -> dict[str, Path]:
    """Every fully installed release found under :func:`release_roots`,
    newest first (the first root wins a version found twice)."""
    found: dict[str, Path] = {}
    for root in release_roots():
        for child in sorted(root.iterdir()):
            complete = (child / MARKER).is_file() and (child / "sglang" / "__init__.py").is_file()
            if complete and child.name not in found:
                found[child.name] = child.resolve()
    return dict(sorted(found.items(), key=lambda kv: _version_key(kv[0]), reverse=True))


def describe_available() -> str:
    releases = available()
    if not releases:
        return (
            "no release is installed side by side (looked for .sglang/<version>/ with a "
            f".complete marker in {', '.join(map(str, release_roots())) or 'no directory'}; "
            f"run `bash .ci/setup`, or set {DIR_ENV})"
        )
    roots = sorted({str(p.parent) for p in releases.values()})
    return f"available under {', '.join(roots)}: {', '.join(releases)}"


def resolve(spec: str) -> Path:
    """The absolute directory to put on ``sys.path`` for ``spec``: a
    version found by :func:`available`, or a directory holding ``sglang/``."""
    looks_like_path = os.sep in spec or spec.startswith((".", "~"))
    if looks_like_path:
        path = Path(spec).expanduser().resolve()
        if not (path / "sglang" / "__init__.py").is_file():
            raise SGLangNotFound(f"--sglang {spec}: {path} holds no sglang package")
        return path
    releases = available()
    if spec not in releases:
        raise SGLangNotFound(f"--sglang {spec}: no such release; {describe_available()}")
    return releases[spec]


def activate(path: Path) -> None:
    """Put ``path`` first on ``sys.path`` and on ``PYTHONPATH``."""
    if "sglang" in sys.modules:
        loaded = getattr(sys.modules["sglang"], "__file__", None)
        raise SGLangNotFound(f"SGLang is already imported (from {loaded}); cannot switch")
    path = Path(path).resolve()
    sys.path.insert(0, str(path))
    current = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(path) + (os.pathsep + current if current else "")
    importlib.invalidate_caches()


def select(spec: str | None) -> str:
    """Make the requested SGLang importable and return its version.

    With ``spec`` None, an SGLang already importable is used as is; none at
    all raises :class:`SGLangNotFound` listing the releases available.
    """
    if spec is not None:
        activate(resolve(spec))
        from flatgather.sglang.releases import sglang_release

        version = sglang_release()
        looks_like_version = os.sep not in spec and not spec.startswith((".", "~"))
        if looks_like_version and version != spec:
            raise SGLangNotFound(f"--sglang {spec}: the directory holds SGLang {version}")
        return version or "(unknown version)"
    if importlib.util.find_spec("sglang") is None:
        raise SGLangNotFound(
            "no SGLang is installed in this environment; pass --sglang VERSION. "
            + describe_available()
        )
    from flatgather.sglang.releases import sglang_release

    return sglang_release() or "(unknown version)"
