"""Check the ``sgl_kernel`` stand-in's torch ops against the running
release's own Triton kernels of the same job, run by Triton's interpreter.

Run as a script with ``TRITON_INTERPRET=1``, ``SGLANG_USE_CPU_ENGINE=1`` and
the release and ``site/`` on ``PYTHONPATH`` (``tests/test_engine.py`` does).
Prints one line per op: ``checked`` with its case count, or ``not checked``
with the reason the release table gives (``Release.unchecked_ops``). Exits
non-zero, naming it, at the first difference, and at the end when an op has
no kernel to check it against and the table says nothing of it, when the
table excuses an op the release has a kernel for, or when the release's own
code names an op the table says it never calls: an op that cannot be
checked never passes by being skipped.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import sgl_kernel
import torch
from flatgather.sglang import releases

# op -> (the release's kernel of the same job, the modules that have held
# it, newest first)
KERNELS = {
    "assign_req_to_token_pool_cpu": (
        "assign_req_to_token_pool",
        (
            "sglang.srt.mem_cache.allocation",
            "sglang.srt.speculative.triton_ops.cache_locs",
            "sglang.srt.speculative.spec_utils",
        ),
    ),
    "assign_extend_cache_locs_cpu": (
        "assign_extend_cache_locs",
        (
            "sglang.kernels.ops.speculative.cache_locs",
            "sglang.srt.speculative.triton_ops.cache_locs",
            "sglang.srt.speculative.spec_utils",
            "sglang.srt.speculative.eagle_info_v2",
        ),
    ),
    "assign_draft_cache_locs_contiguous_cpu": (
        "assign_draft_cache_locs_contiguous",
        (
            "sglang.kernels.ops.speculative.cache_locs",
            "sglang.srt.speculative.triton_ops.cache_locs",
        ),
    ),
    "fill_accept_out_cache_loc_cpu": (
        "fill_accept_out_cache_loc",
        (
            "sglang.kernels.ops.speculative.eagle",
            "sglang.srt.speculative.triton_ops.eagle",
            "sglang.srt.speculative.eagle_info_v2",
        ),
    ),
    "fill_bonus_tokens_cpu": (
        "fill_bonus_tokens",
        (
            "sglang.kernels.ops.speculative.eagle",
            "sglang.srt.speculative.triton_ops.eagle",
            "sglang.srt.speculative.eagle_info_v2",
        ),
    ),
    "copy_all_layer_kv_cache_cpu": (
        "copy_all_layer_kv_cache_tiled",
        (
            "sglang.kernels.ops.kvcache.cache_move",
            "sglang.srt.mem_cache.triton_ops.cache_move",
            "sglang.srt.mem_cache.memory_pool",
        ),
    ),
}
DELEGATED = ("build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu")
"""The stand-in's ops that call the release's own Triton code: nothing to
compare."""


def kernel(op: str):
    name, places = KERNELS[op]
    return sgl_kernel.release_object(name, places)


def excused() -> dict[str, str]:
    """op -> why the release table says it is not checked on this release."""
    row = releases.by_version(releases.sglang_release())
    return dict(row.unchecked_ops) if row else {}


def release_names(ops) -> set[str]:
    """Those of ``ops`` that the release's own code names (its tests aside)."""
    import sglang

    root = Path(sglang.__file__).parent
    named = set()
    for path in root.rglob("*.py"):
        if "test" in path.relative_to(root).parts:
            continue
        text = path.read_text(errors="replace")
        named |= {op for op in ops if op in text}
    return named


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def runs(rng, bs, width):
    starts = [rng.randrange(0, width // 2) for _ in range(bs)]
    ends = [s + rng.randrange(0, width // 2) for s in starts]
    return torch.tensor(starts), torch.tensor(ends)


def case_assign(rng, scatter: bool):
    bs, width, rows = rng.randint(1, 6), 64, 8
    pool = torch.randperm(rows)[:bs].to(torch.int64)
    start, end = runs(rng, bs, width)
    total = int((end - start).sum())
    req_to_token = torch.randint(0, 1000, (rows, width), dtype=torch.int32)
    out = torch.randint(0, 1000, (total,), dtype=torch.int64)
    if not scatter:
        out = torch.full((total,), -7, dtype=torch.int64)
    return bs, (pool, req_to_token, start, end, out, width)


def check(op: str, ref, ref_launch, make, n=40) -> None:
    fn = getattr(sgl_kernel, op)
    name = KERNELS[op][0]
    rng = random.Random(0)
    for i in range(n):
        bs, args = make(rng)
        mine = [a.clone() if torch.is_tensor(a) else a for a in args]
        theirs = [a.clone() if torch.is_tensor(a) else a for a in args]
        fn(*mine)
        ref_launch(ref, bs, theirs)
        for k, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            if torch.is_tensor(a) and not torch.equal(a, b):
                raise SystemExit(f"{op}: case {i}, argument {k} differs from {name}:\n{a}\n{b}")
    print(f"{op}: checked, {n} cases equal to the release's {name}")


def check_kv(op: str, ref, make, n=40) -> None:
    """The KV copy works on raw addresses: checked on buffers of its own."""
    rng = random.Random(0)
    for i in range(n):
        count, bufs, src, tgt = make(rng)
        theirs = [b.clone() for b in bufs]
        for side in (bufs, theirs):
            ptrs = torch.tensor([b.data_ptr() for b in side], dtype=torch.uint64)
            strides = torch.tensor(
                [b.stride(0) * b.element_size() for b in side], dtype=torch.int64
            )
            if side is bufs:
                getattr(sgl_kernel, op)(ptrs, strides, tgt, src)
            else:
                tile = 128
                grid = (len(side), -(-int(strides.max()) // tile))
                ref[grid](ptrs, strides, tgt, src, count, next_pow2(count), BYTES_PER_TILE=tile)
        for a, b in zip(bufs, theirs, strict=True):
            if not torch.equal(a, b):
                raise SystemExit(f"{op}: case {i} differs from {KERNELS[op][0]}")
    print(f"{op}: checked, {n} cases equal to the release's {KERNELS[op][0]}")


def draft(rng):
    bs, width, rows, topk, steps = (
        rng.randint(1, 5),
        64,
        8,
        rng.randint(1, 3),
        rng.randint(1, 4),
    )
    pool = torch.randperm(rows)[:bs].to(torch.int64)
    seq = torch.tensor([rng.randrange(0, width - topk * steps) for _ in range(bs)])
    req_to_token = torch.randint(0, 1000, (rows, width), dtype=torch.int32)
    out = torch.full((bs * topk * steps,), -7, dtype=torch.int64)
    return bs, (pool, req_to_token, seq, out, width, topk, steps)


def accept(rng):
    size = rng.randint(1, 12)
    index = torch.tensor([rng.choice([-1, rng.randrange(size)]) for _ in range(size)])
    loc = torch.randint(0, 1000, (size,), dtype=torch.int64)
    out = torch.full((size,), -7, dtype=torch.int64)
    return size, (index, loc, out)


def bonus(rng):
    bs, stride = rng.randint(1, 6), rng.randint(1, 4)
    tokens = torch.randint(0, 1000, (bs, stride), dtype=torch.int64)
    lens = torch.tensor([rng.randint(1, stride) for _ in range(bs)], dtype=torch.int32)
    out = torch.full((bs,), -7, dtype=torch.int64)
    return bs, (tokens, lens, out, stride)


def kv(rng):
    layers, rows, width = rng.randint(1, 3), 16, rng.choice([8, 32])
    bufs = [torch.randn(rows, width) for _ in range(layers)]
    n = rng.randint(1, 6)
    src = torch.tensor(rng.sample(range(rows), n), dtype=torch.int64)
    tgt = torch.tensor(rng.sample(range(rows), n), dtype=torch.int64)
    return (n, bufs, src, tgt)


# op -> how its kernel is launched, and the cases
CASES = {
    "assign_req_to_token_pool_cpu": (
        lambda k, bs, a: k[(bs,)](*a, next_pow2(bs)),
        lambda rng: case_assign(rng, scatter=True),
    ),
    "assign_extend_cache_locs_cpu": (
        lambda k, bs, a: k[(bs,)](*a, next_pow2(bs)),
        lambda rng: case_assign(rng, scatter=False),
    ),
    "assign_draft_cache_locs_contiguous_cpu": (lambda k, bs, a: k[(bs,)](*a), draft),
    "fill_accept_out_cache_loc_cpu": (
        lambda k, size, a: k[(size,)](*a, next_pow2(size)),
        accept,
    ),
    "fill_bonus_tokens_cpu": (lambda k, bs, a: k[(bs,)](*a), bonus),
}


def main() -> int:
    # An op added to the stand-in is checked here, or it fails.
    covered = set(KERNELS) | set(DELEGATED)
    if covered != set(sgl_kernel.OPS):
        print(
            f"the stand-in's ops {sorted(sgl_kernel.OPS)} are not the ones this script "
            f"checks or delegates: {sorted(covered)}",
            file=sys.stderr,
        )
        return 1
    for op in DELEGATED:
        print(f"{op}: the release's own Triton code, nothing to compare")
    why = excused()
    problems = []
    absent = []
    for op in KERNELS:
        ref = kernel(op)
        if ref is None:
            if op in why:
                absent.append(op)
                print(f"{op}: not checked: {why[op]}")
            else:
                problems.append(
                    f"{op}: this release has no {KERNELS[op][0]} in {KERNELS[op][1]}, "
                    "and the release table gives no reason to leave it unchecked"
                )
            continue
        if op in why:
            problems.append(
                f"{op}: the release table leaves it unchecked ({why[op]}), "
                f"but the release has {KERNELS[op][0]}"
            )
        if op == "copy_all_layer_kv_cache_cpu":
            check_kv(op, ref, kv)
        else:
            check(op, ref, *CASES[op])
    for op in sorted(release_names(absent)):
        problems.append(
            f"{op}: the release table leaves it unchecked ({why[op]}), but the release's "
            "code names it"
        )
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
