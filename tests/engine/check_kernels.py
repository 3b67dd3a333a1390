"""Check the ``sgl_kernel`` stand-in's torch ops against the running
release's own Triton kernels of the same job, run by Triton's interpreter.

Run as a script with ``TRITON_INTERPRET=1``, ``SGLANG_USE_CPU_ENGINE=1`` and
the release and ``site/`` on ``PYTHONPATH`` (``tests/test_engine.py`` does).
Prints one line per op and case count; exits non-zero at the first
difference, naming it. An op whose kernel the release does not have is
reported as such (nothing to check it against), never passed silently.
"""

from __future__ import annotations

import random
import sys

import sgl_kernel
import torch

# kernel name -> the modules that have held it, newest first
PLACES = {
    "assign_req_to_token_pool": (
        "sglang.srt.mem_cache.allocation",
        "sglang.srt.speculative.triton_ops.cache_locs",
    ),
    "assign_extend_cache_locs": (
        "sglang.kernels.ops.speculative.cache_locs",
        "sglang.srt.speculative.triton_ops.cache_locs",
        "sglang.srt.speculative.spec_utils",
    ),
    "assign_draft_cache_locs_contiguous": (
        "sglang.kernels.ops.speculative.cache_locs",
        "sglang.srt.speculative.triton_ops.cache_locs",
    ),
    "fill_accept_out_cache_loc": (
        "sglang.kernels.ops.speculative.eagle",
        "sglang.srt.speculative.triton_ops.eagle",
        "sglang.srt.speculative.eagle_info_v2",
    ),
    "fill_bonus_tokens": (
        "sglang.kernels.ops.speculative.eagle",
        "sglang.srt.speculative.triton_ops.eagle",
    ),
    "copy_all_layer_kv_cache_tiled": (
        "sglang.kernels.ops.kvcache.cache_move",
        "sglang.srt.mem_cache.triton_ops.cache_move",
    ),
}


def kernel(name: str):
    return sgl_kernel.release_object(name, PLACES[name])


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


def check(name, op, ref_launch, make, n=40) -> None:
    ref = kernel(name)
    if ref is None:
        print(f"{op.__name__}: this release has no {name} kernel; nothing to check it against")
        return
    rng = random.Random(0)
    for i in range(n):
        bs, args = make(rng)
        mine = [a.clone() if torch.is_tensor(a) else a for a in args]
        theirs = [a.clone() if torch.is_tensor(a) else a for a in args]
        op(*mine)
        ref_launch(ref, bs, theirs)
        for k, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            if torch.is_tensor(a) and not torch.equal(a, b):
                raise SystemExit(
                    f"{op.__name__}: case {i}, argument {k} differs from {name}:\n{a}\n{b}"
                )
    print(f"{op.__name__}: {n} cases equal to the release's {name}")


def main() -> int:
    check(
        "assign_req_to_token_pool",
        sgl_kernel.assign_req_to_token_pool_cpu,
        lambda k, bs, a: k[(bs,)](*a, next_pow2(bs)),
        lambda rng: case_assign(rng, scatter=True),
    )
    check(
        "assign_extend_cache_locs",
        sgl_kernel.assign_extend_cache_locs_cpu,
        lambda k, bs, a: k[(bs,)](*a, next_pow2(bs)),
        lambda rng: case_assign(rng, scatter=False),
    )

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

    check(
        "assign_draft_cache_locs_contiguous",
        sgl_kernel.assign_draft_cache_locs_contiguous_cpu,
        lambda k, bs, a: k[(bs,)](*a),
        draft,
    )

    def accept(rng):
        size = rng.randint(1, 12)
        index = torch.tensor([rng.choice([-1, rng.randrange(size)]) for _ in range(size)])
        loc = torch.randint(0, 1000, (size,), dtype=torch.int64)
        out = torch.full((size,), -7, dtype=torch.int64)
        return size, (index, loc, out)

    check(
        "fill_accept_out_cache_loc",
        sgl_kernel.fill_accept_out_cache_loc_cpu,
        lambda k, size, a: k[(size,)](*a, next_pow2(size)),
        accept,
    )

    def bonus(rng):
        bs, stride = rng.randint(1, 6), rng.randint(1, 4)
        tokens = torch.randint(0, 1000, (bs, stride), dtype=torch.int64)
        lens = torch.tensor([rng.randint(1, stride) for _ in range(bs)], dtype=torch.int32)
        out = torch.full((bs,), -7, dtype=torch.int64)
        return bs, (tokens, lens, out, stride)

    check(
        "fill_bonus_tokens",
        sgl_kernel.fill_bonus_tokens_cpu,
        lambda k, bs, a: k[(bs,)](*a),
        bonus,
    )

    def kv(rng):
        layers, rows, width = rng.randint(1, 3), 16, rng.choice([8, 32])
        bufs = [torch.randn(rows, width) for _ in range(layers)]
        n = rng.randint(1, 6)
        src = torch.tensor(rng.sample(range(rows), n), dtype=torch.int64)
        tgt = torch.tensor(rng.sample(range(rows), n), dtype=torch.int64)
        return (n, bufs, src, tgt)

    # The KV copy works on raw addresses: check it on buffers of its own.
    ref = kernel("copy_all_layer_kv_cache_tiled")
    if ref is None:
        print("copy_all_layer_kv_cache_cpu: this release has no copy_all_layer_kv_cache_tiled")
    else:
        rng = random.Random(0)
        for i in range(40):
            n, bufs, src, tgt = kv(rng)
            theirs = [b.clone() for b in bufs]
            for side in (bufs, theirs):
                ptrs = torch.tensor([b.data_ptr() for b in side], dtype=torch.uint64)
                strides = torch.tensor(
                    [b.stride(0) * b.element_size() for b in side], dtype=torch.int64
                )
                if side is bufs:
                    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
                else:
                    tile = 128
                    grid = (len(side), -(-int(strides.max()) // tile))
                    ref[grid](ptrs, strides, tgt, src, n, next_pow2(n), BYTES_PER_TILE=tile)
            for a, b in zip(bufs, theirs, strict=True):
                if not torch.equal(a, b):
                    raise SystemExit(f"copy_all_layer_kv_cache_cpu: case {i} differs")
        print(
            "copy_all_layer_kv_cache_cpu: 40 cases equal to the release's "
            "copy_all_layer_kv_cache_tiled"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
