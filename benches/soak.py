"""Resident memory over many calls: python benches/soak.py [CALLS] [CYCLES]

Calls prune_plan, rotation_plan and the installed _get_pruned_states (on
hidden states with padding rows; SGLang on PYTHONPATH) CALLS times each
(default 1,000,000) on a small batch, then install()s and uninstall()s
CYCLES times (default 1,000; each install runs the probe), and prints the
resident set size before, at each tenth, and after each phase.
"""

from __future__ import annotations

import resource
import sys
import time


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000
    import flatgather
    import flatgather.sglang as fs
    import torch
    from flatgather.bench.batches import metadata
    from sglang.srt.layers.logits_processor import LogitsProcessor

    extend, start = [4, 5, 6, 3], [0, 5, 3, 1]
    rows = sum(extend) + 5  # padding rows, as CUDA-graph buckets leave them
    h = torch.randn(rows, 8)
    aux = [torch.randn(rows, 8) for _ in range(3)]
    md = metadata(extend, start)
    fs.install()
    fn = LogitsProcessor._get_pruned_states
    for _ in range(10_000):  # warm caches and allocators before the baseline
        flatgather.prune_plan(extend, start)
        flatgather.rotation_plan(extend)
        fn(None, h, None, aux, md)
    before = rss_mib()
    print(f"rss before: {before:.1f} MiB", flush=True)
    t = time.perf_counter()
    for i in range(1, calls + 1):
        flatgather.prune_plan(extend, start)
        flatgather.rotation_plan(extend)
        fn(None, h, None, aux, md)
        if i % max(1, calls // 10) == 0:
            print(f"{i:>9} calls each: rss {rss_mib():.1f} MiB", flush=True)
    after = rss_mib()
    print(
        f"rss after calls: {after:.1f} MiB (growth {after - before:+.1f} MiB, "
        f"{time.perf_counter() - t:.0f} s)",
        flush=True,
    )
    fs.uninstall()
    before, t = rss_mib(), time.perf_counter()
    for i in range(1, cycles + 1):
        fs.install()
        fs.uninstall()
        if i % max(1, cycles // 10) == 0:
            print(f"{i:>9} install/uninstall cycles: rss {rss_mib():.1f} MiB", flush=True)
    after = rss_mib()
    print(
        f"rss after cycles: {after:.1f} MiB (growth {after - before:+.1f} MiB, "
        f"{time.perf_counter() - t:.0f} s, {(time.perf_counter() - t) / cycles * 1e3:.1f} ms "
        "per cycle)"
    )


if __name__ == "__main__":
    main()
