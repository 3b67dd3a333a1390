"""install() time of two versions of flatgather, side by side:

    python benches/install_compare.py BASE [--releases 0.5.10 0.5.16 0.5.23] [--rounds 5]

BASE is a git revision of this repository; the other side is the working
tree. Both run on the extension built here (the installed ``flatgather._core``:
only the Python side may differ between them). For each release set up by
.ci/setup, rounds alternate the two sides, each round a fresh child
interpreter per side that imports the release's patched modules, then runs
``install()`` / ``uninstall()`` 7 times; a round's figure is the median of
runs 2 to 7 (the first includes torch's warm-up). Torch runs on one thread.
Prints one table row per release: each side's median over the rounds, and
the ratio working tree / BASE, with the machine's load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import importlib, json, statistics, sys, time
    import torch
    torch.set_num_threads(1)
    import flatgather.sglang as fs
    from flatgather.testing import install_sgl_kernel_stand_in
    import sglang.srt.layers.logits_processor  # before the stand-in, as the tests do
    install_sgl_kernel_stand_in()
    for name in (
        "sglang.srt.layers.logits_processor",
        "sglang.srt.speculative.eagle_worker_v2",
        "sglang.srt.managers.scheduler_components.batch_result_processor",
        "sglang.srt.managers.scheduler_output_processor_mixin",
        "sglang.srt.managers.utils",
        "sglang.srt.layers.sampler",
    ):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    times = []
    for _ in range(7):
        started = time.perf_counter()
        fs.install()
        times.append(time.perf_counter() - started)
        fs.uninstall()
    print(json.dumps(statistics.median(times[1:]) * 1e3))
    """
)


def _tree(rev: str, into: Path) -> Path:
    """``python/`` of ``rev``, with the extension built here."""
    into.mkdir(parents=True)
    archive = into / "tree.tar"
    subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), rev, "python"], cwd=ROOT, check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    import flatgather._core as core

    shutil.copy(core.__file__, into / "python" / "flatgather" / Path(core.__file__).name)
    return into / "python"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _once(python_dir: Path, release: str) -> float:
    env = {
        **os.environ,
        "PYTHONPATH": f"{python_dir}{os.pathsep}{ROOT / '.sglang' / release}",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("FLATGATHER_SGLANG", None)
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, cwd="/", capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise SystemExit(f"{release}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("--releases", nargs="+", default=["0.5.10", "0.5.16", "0.5.23"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = _tree(args.base, Path(tmp) / "base")
        head = Path(tmp) / "head"
        shutil.copytree(ROOT / "python", head / "python")
        import flatgather._core as core

        shutil.copy(core.__file__, head / "python" / "flatgather" / Path(core.__file__).name)
        head = head / "python"
        print(f"load before: {_load()}")
        print(f"| SGLang | install ms, {args.base} | install ms, working tree | ratio |")
        print("|---|---|---|---|")
        for release in args.releases:
            sides: dict[str, list[float]] = {"base": [], "head": []}
            for n in range(args.rounds):
                order = ("base", "head") if n % 2 == 0 else ("head", "base")
                for side in order:
                    sides[side].append(_once(base if side == "base" else head, release))
            b, h = statistics.median(sides["base"]), statistics.median(sides["head"])
            print(f"| {release} | {b:.1f} | {h:.1f} | {h / b:.2f} |", flush=True)
        print(f"load after: {_load()}")
        if max(os.getloadavg()) > 1.5:
            print("warning: the machine was busy; the figures may not be trusted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
