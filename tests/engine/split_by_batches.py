"""On demand: whether the front end's answers split by side or by batch.

Serves the front-end scenario's calls (``workload.front_end_calls``) from
four ``launch_server`` processes in turn, stock, flatgather, stock,
flatgather, and compares every pair as ``tests/test_front_end_engine.py``
compares stock with flatgather. For each pair it prints whether the answers
are the same bytes and whether the scheduler logged the same prefill
batches. Where a release batches one call's prompts differently from run to
run, a float32 row computed in another batch may differ in its last bits on
either side: the answers then split by the batches, not by the side.

    cd tests && PYTHONPATH=$PWD/../.sglang/0.5.10 FLATGATHER_TEST_RELEASE=0.5.10 \\
        ../.venv/bin/python engine/split_by_batches.py

Exits 1 where two servers that logged the same batches answered
differently, whichever side each was.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from test_engine import _chunked
from test_rust_server_engine import _batches

from engine import harness


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="fg-split-"))

    def serve(flatgather: bool) -> harness.Served:
        return harness.serve(
            work, work / "models", "plain", flatgather, env=_chunked(), front_end="http"
        )

    runs = [
        (name, serve(flat))
        for name, flat in (
            ("stock", False),
            ("flatgather", True),
            ("stock 2", False),
            ("flatgather 2", True),
        )
    ]
    batches = [_batches(served) for _, served in runs]
    split_by_side = False
    for i, (a, x) in enumerate(runs):
        for j, (b, y) in enumerate(runs[i + 1 :], start=i + 1):
            difference, _ = harness.compare_front_end(x.answers, y.answers)
            alike = batches[i] == batches[j]
            split_by_side |= alike and difference is not None
            print(
                f"{a} / {b}: {'the same bytes' if difference is None else 'different'}, "
                f"batches {'alike' if alike else 'formed otherwise'}"
                + ("" if difference is None else f" ({difference[:160]})")
            )
    return 1 if split_by_side else 0


if __name__ == "__main__":
    sys.exit(main())
