"""The generator of flatgather's table of known code
(:mod:`flatgather.sglang.known_shapes`).

It walks the patches (:func:`flatgather.sglang.patches.patches`) and, for
each piece of code a patch declares it vouches for
(:attr:`flatgather.sglang.patching.Patch.known`), fingerprints the running
release's own (:func:`flatgather.sglang.shapes.fingerprint`). Run in one
release, it prints that release's fingerprints as one JSON line; with
``--write`` it runs itself once per release of the release table (each
release from its own folder, as ``.ci/setup`` installs them) and writes the
table::

    .venv/bin/python -m flatgather.testing.fingerprints            # the release on sys.path
    .venv/bin/python -m flatgather.testing.fingerprints --write    # every release, the file

A patch added with a new :class:`~flatgather.sglang.patching.Known` gets its
row by the same command; nothing here names a patch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

from flatgather.sglang.patching import release_function as release_own

__all__ = ["declared", "release_fingerprints", "release_function", "release_functions", "render"]


def declared() -> Iterator:
    """Every :class:`~flatgather.sglang.patching.Known` of every patch, in
    install order, each key once."""
    from flatgather.sglang.patches import patches

    seen = set()
    for patch in patches():
        for known in patch.known:
            if known.key not in seen:
                seen.add(known.key)
                yield known


def _module(name: str) -> types.ModuleType | None:
    """The module, or None where the release has none. A module that needs
    the GPU-only ``sgl_kernel`` (the scheduler's, on some releases) is
    imported over the tests' stand-in, after the logits processor, which
    must not see it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("sgl_kernel"):
            return None
    except ImportError:
        return None
    from flatgather.testing.standins import install_sgl_kernel_stand_in

    importlib.import_module("sglang.srt.layers.logits_processor")
    install_sgl_kernel_stand_in()
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def release_function(known) -> tuple[type | None, types.FunctionType] | None:
    """``(owner class or None, the release's own function)`` for ``known``
    in the running release, or None where no module of it defines it. A
    module-level function must be defined in the module it is read from
    (the others import it), unless the declaration reads an import."""
    for name in known.modules:
        module = _module(name)
        if module is None:
            continue
        if known.owner is not None:
            owner = vars(module).get(known.owner)
            if isinstance(owner, type) and known.name in vars(owner):
                return owner, vars(owner)[known.name]
            continue
        fn = release_own(module, known.name)
        if fn is None:
            continue
        if known.imported or fn.__module__ == module.__name__:
            return None, fn
    return None


def release_functions() -> dict[str, types.FunctionType]:
    """The running release's own function of each declared module-level
    function it defines (the functions flatgather replaces whole), by key."""
    out = {}
    for known in declared():
        if known.owner is not None or known.imported:
            continue
        located = release_function(known)
        if located is not None:
            out[known.key] = located[1]
    return out


def release_fingerprints() -> dict[str, str]:
    """The running release's fingerprint of each declared piece of code it has."""
    from flatgather.sglang import shapes

    found = {}
    for known in declared():
        located = release_function(known)
        if located is None:
            continue
        owner, fn = located
        found[known.key] = shapes.fingerprint(owner, known.name if owner else fn)
    return found


def render(rows: dict[str, dict[str, str]]) -> str:
    """The table's module, from ``{release: {key: fingerprint}}`` (releases
    in the release table's order)."""
    table: dict[str, dict[str, list[str]]] = {}
    for known in declared():
        table[known.key] = {}
    for release, found in rows.items():
        for key, print_ in found.items():
            table.setdefault(key, {}).setdefault(print_, []).append(release)
    lines = [
        '"""The fingerprints of the code flatgather vouches for, and the releases that',
        "have each (see :mod:`flatgather.sglang.shapes`).",
        "",
        "Generated: do not edit. After adding a release to the release table, or a",
        "patch that declares code it vouches for, regenerate it from every release's",
        "own code:",
        "",
        "    .venv/bin/python -m flatgather.testing.fingerprints --write",
        '"""',
        "",
        "KNOWN: dict[str, dict[str, tuple[str, ...]]] = {",
    ]
    for key, prints in table.items():
        lines.append(f"    {json.dumps(key)}: {{")
        for print_, releases in prints.items():
            names = [json.dumps(r) for r in releases]
            comma = "," if len(names) == 1 else ""
            one = f"        {json.dumps(print_)}: ({', '.join(names)}{comma}),"
            if len(one) <= 100:
                lines.append(one)
            else:
                # As ruff formats it: one release a line.
                lines.append(f"        {json.dumps(print_)}: (")
                lines.extend(f"            {n}," for n in names)
                lines.append("        ),")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds the ``flatgather`` package running this."""


def _write(releases_dir: Path, out: Path) -> int:
    from flatgather.sglang.releases import RELEASES

    rows = {}
    for i, row in enumerate(RELEASES, 1):
        folder = releases_dir / row.version
        print(f"[{i}/{len(RELEASES)}] {row.version}", file=sys.stderr, flush=True)
        if not folder.is_dir():
            print(f"{folder} is missing: run .ci/setup first", file=sys.stderr)
            return 1
        # This flatgather, whichever checkout or environment it runs from.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(_PACKAGE_ROOT)])}
        proc = subprocess.run(
            [sys.executable, "-m", "flatgather.testing.fingerprints"],
            env=env,
            capture_output=True,
            text=True,
            cwd="/",
        )
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        release, found = json.loads(proc.stdout.strip().splitlines()[-1])
        if release != row.version:
            print(f"{folder} holds SGLang {release}, not {row.version}", file=sys.stderr)
            return 1
        rows[release] = found
    out.write_text(render(rows))
    print(f"wrote {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flatgather.testing.fingerprints")
    parser.add_argument("--write", action="store_true", help="every release; write the table")
    here = Path(__file__).resolve()
    root = here.parents[3] if (here.parents[3] / "Cargo.toml").exists() else Path.cwd()
    parser.add_argument("--releases-dir", type=Path, default=root / ".sglang")
    parser.add_argument(
        "--out", type=Path, default=root / "python" / "flatgather" / "sglang" / "known_shapes.py"
    )
    args = parser.parse_args(argv)
    if args.write:
        return _write(args.releases_dir, args.out)
    from flatgather.sglang.releases import sglang_release

    print(json.dumps([sglang_release(), release_fingerprints()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
