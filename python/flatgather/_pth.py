"""The ``flatgather-sglang.pth`` file that carries the ``FLATGATHER_SGLANG``
switch into every Python process, SGLang's spawned schedulers included.

A wheel install puts it into site-packages. An editable install
(``pip install -e .``, ``maturin develop``) does not, and the switch then
does nothing in spawned processes: ``flatgather install-pth`` writes it,
``flatgather install-pth --remove`` takes it away, and ``flatgather doctor``
and ``flatgather launch-server`` check for it. Standard library only.
"""

from __future__ import annotations

import site
import sysconfig
from dataclasses import dataclass
from pathlib import Path

NAME = "flatgather-sglang.pth"

LINE = (
    'import os; os.environ.get("FLATGATHER_SGLANG", "").strip().lower() not in '
    '("", "0", "false", "off", "no") and '
    '__import__("flatgather._activate", fromlist=["arm"]).arm()'
)
"""The line the wheel ships in ``python/flatgather-sglang.pth`` (a test
keeps the two equal). It only reads the environment unless the switch is on."""

FIX = "flatgather install-pth"
"""The command that puts the file in place (``python -m flatgather
install-pth`` is the same)."""


def site_dirs() -> list[Path]:
    """The directories whose ``.pth`` files this interpreter runs at start-up."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    seen: list[Path] = []
    for d in dirs:
        path = Path(d).resolve()
        if path not in seen:
            seen.append(path)
    return seen


def target_dir() -> Path:
    """Where ``install-pth`` writes: the environment's purelib (where pip
    installs), when start-up scans it, else the first site-packages."""
    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    dirs = site_dirs()
    if purelib in dirs or not dirs:
        return purelib
    return dirs[0]


def package_root() -> Path:
    """The directory ``import flatgather`` is found in."""
    import flatgather

    return Path(flatgather.__file__).resolve().parent.parent


def content(site_dir: Path) -> str:
    """What the file written into ``site_dir`` holds: the switch line, after
    the directory flatgather is imported from when that is not ``site_dir``
    itself (an editable install). Python runs ``.pth`` files in name order
    and maturin's editable ``flatgather.pth`` comes after this one, so the
    switch line must not depend on it to find flatgather."""
    root = package_root()
    if root == Path(site_dir).resolve():
        return LINE + "\n"
    return f"{root}\n{LINE}\n"


@dataclass(frozen=True)
class Found:
    path: Path
    ok: bool
    """Its last line is the switch line."""


def find(dirs: list[Path] | None = None) -> list[Found]:
    """Every ``flatgather-sglang.pth`` start-up would run."""
    out = []
    for d in site_dirs() if dirs is None else dirs:
        path = Path(d) / NAME
        if path.is_file():
            lines = [x.strip() for x in path.read_text(errors="replace").splitlines()]
            lines = [x for x in lines if x]
            out.append(Found(path, bool(lines) and lines[-1] == LINE))
    return out


def write(site_dir: Path | None = None) -> tuple[Path, bool]:
    """Write the file; returns its path and whether anything changed."""
    site_dir = Path(site_dir) if site_dir is not None else target_dir()
    path = site_dir / NAME
    text = content(site_dir)
    if path.is_file() and path.read_text(errors="replace") == text:
        return path, False
    site_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # a start-up never reads half a file
    return path, True


def remove(site_dir: Path | None = None) -> Path | None:
    """Remove the file; returns its path, or None when there was none."""
    path = (Path(site_dir) if site_dir is not None else target_dir()) / NAME
    if not path.is_file():
        return None
    path.unlink()
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="flatgather install-pth",
        description=(
            f"Write {NAME} into this environment's site-packages, so that "
            "FLATGATHER_SGLANG=1 installs flatgather in every Python process, SGLang's "
            "spawned schedulers included. A wheel install ships it; an editable install "
            "(pip install -e ., maturin develop) does not."
        ),
    )
    parser.add_argument("--remove", action="store_true", help="remove the file instead")
    parser.add_argument("--site-dir", type=Path, help=f"write there instead of {target_dir()}")
    args = parser.parse_args(argv)
    site_dir = args.site_dir.resolve() if args.site_dir else target_dir()
    if args.remove:
        removed = remove(site_dir)
        print(f"removed {removed}" if removed else f"no {NAME} in {site_dir}: nothing to remove")
        return 0
    try:
        path, changed = write(site_dir)
    except OSError as exc:
        print(f"flatgather install-pth: cannot write into {site_dir}: {exc}")
        return 1
    print(f"{'wrote' if changed else 'already up to date:'} {path}")
    if package_root() != site_dir:
        print(
            f"flatgather is imported from {package_root()}, not from {site_dir} (an editable "
            "install): the file puts that directory on sys.path before the switch line."
        )
    print("FLATGATHER_SGLANG=1 now installs flatgather in every Python process of this venv.")
    return 0
