"""Section ``host-cost``: the ``pruned-states`` calls on zero-width tensors.

With ``hidden_states`` and every aux layer of shape ``[N, 0]`` no byte is
copied, so the time left is the dispatch and Python work of each call:
exactly what a GPU cannot hide behind its kernels. The index plans alone
(flatgather's and the NumPy anchor's) are timed next to it.
"""

from __future__ import annotations

import functools

import numpy as np

from flatgather.bench.cases import Grid, Shape, make_inputs, make_numpy_anchor, numpy_indices
from flatgather.bench.prune_section import _speedups, calls, check
from flatgather.bench.sections import SECTIONS, TIMINGS, Case, Planned
from flatgather.bench.stats import measure_side_by_side
from flatgather.bench.timing import Context

SECTION = SECTIONS["host-cost"]

GRIDS = {
    "quick": Grid(
        batches=(1, 64, 256),
        mean_extends=(16,),
        hiddens=(0,),
        dtypes=("bf16",),
        aux=((0, "none"), (3, "list")),
        max_tokens=16384,
    ),
    "default": Grid(
        batches=(1, 8, 64, 256, 1024),
        mean_extends=(16, 256),
        hiddens=(0,),
        dtypes=("bf16",),
        aux=((0, "none"), (3, "list"), (3, "packed")),
        max_tokens=32768,
    ),
    "full": Grid(
        batches=(1, 8, 64, 256, 1024, 4096),
        mean_extends=(16, 128, 512, 2048),
        hiddens=(0,),
        dtypes=("bf16",),
        aux=((0, "none"), (3, "list"), (3, "packed")),
        max_tokens=65536,
    ),
}


def series(shape: Shape) -> str:
    return f"mean prompt {shape.mean_extend} tokens, {shape.aux_words}"


def measure(ctx: Context, grid: Grid, shape: Shape, anchor) -> dict:
    from flatgather._core import PrunePlan

    inputs = make_inputs(shape, grid.max_tokens, ctx.device)
    fns = calls(ctx, inputs, anchor)
    check(ctx, fns, inputs, f"B={shape.batch}, {series(shape)}, zero width")
    extend, start = inputs.extend, inputs.start

    def rust_plan():
        plan = PrunePlan(extend, start)
        plan.fill(np.empty(plan.buffer_len(False), dtype=np.int64), False)

    fns["plan"] = rust_plan
    fns["numpy_plan"] = lambda: numpy_indices(extend, start)
    row = {
        "batch": shape.batch,
        "series": series(shape),
        "params": shape.to_dict(),
        "info": {"tokens": inputs.tokens},
    }
    row.update(ctx.timer.measure(fns, SECTION.counted))
    return row


def binding_fixed_cost(ctx: Context) -> float:
    """Seconds per ``PrunePlan([1], [0]).fill(...)``: the binding's floor."""
    from flatgather._core import PrunePlan

    out = np.empty(8, dtype=np.int64)
    one, zero = [1], [0]

    def call():
        PrunePlan(one, zero).fill(out, False)

    t = TIMINGS[ctx.size]
    stats = measure_side_by_side(
        {"binding": call}, samples=t.samples, warmup_s=t.warmup_s, sample_s=t.sample_s
    )
    return stats["binding"].median


def finish(ctx: Context, rows: list[dict]) -> dict:
    out = []
    big = _speedups(rows, "stock", "plan", lambda r: r["info"]["tokens"] >= 30000)
    if big:
        out.append(
            {
                "name": "plan >= 100x SGLang's loop at >= 30k tokens",
                "met": min(big) >= 100,
                "got": f"min {min(big):.0f}x",
            }
        )
    small = _speedups(rows, "numpy_plan", "plan", lambda r: r["batch"] <= 64)
    if small:
        out.append(
            {
                "name": "plan >= 4x NumPy's index at B <= 64",
                "met": min(small) >= 4,
                "got": f"min {min(small):.1f}x",
            }
        )
    fixed = binding_fixed_cost(ctx) * 1e6
    out.append({"name": "binding fixed cost <= 2 µs", "met": fixed <= 2, "got": f"{fixed:.2f} µs"})
    notes = [f"Binding fixed cost (`PrunePlan([1], [0]).fill(...)`): {fixed:.2f} µs."]
    return {"targets": out, "notes": notes}


def plan(ctx: Context, size: str) -> Planned:
    grid = GRIDS[size]
    contract = ctx.sglang.contract
    anchor = make_numpy_anchor(contract.writes_cpu_indices, contract.trailing_token_to_seq)
    cases = [
        Case(
            f"B={shape.batch} {series(shape)}",
            functools.partial(measure, ctx, grid, shape, anchor),
        )
        for shape in grid.shapes(contract.packed_aux)
    ]
    return Planned(
        cases,
        finish=functools.partial(finish, ctx),
        notes=ctx.sglang.stock_notes(),
    )
