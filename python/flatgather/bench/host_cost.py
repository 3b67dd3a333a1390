"""Section ``host-cost``: the ``pruned-states`` calls on zero-width tensors.

With ``hidden_states`` and every aux layer of shape ``[N, 0]`` no byte is
copied, so the time left is the dispatch and Python work of each call:
exactly what a GPU cannot hide behind its kernels. The index plans alone
(flatgather's and the NumPy anchor's) are timed next to it.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from flatgather.bench import prune_section
from flatgather.bench.cases import Grid, Shape, make_inputs, numpy_indices
from flatgather.bench.prune_section import calls, check
from flatgather.bench.sections import SECTIONS, TIMINGS, Planned
from flatgather.bench.stats import measure_side_by_side
from flatgather.bench.targets import at_least, speedups
from flatgather.bench.timing import Context

SECTION = SECTIONS["host-cost"]

# The pruned-states section's shapes at zero width (so in one dtype: no byte
# is copied), and one batch size more at full size.
GRIDS = {
    size: dataclasses.replace(grid, hiddens=(0,), dtypes=("bf16",))
    for size, grid in prune_section.GRIDS.items()
}
GRIDS["full"] = dataclasses.replace(GRIDS["full"], batches=(*GRIDS["full"].batches, 4096))


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
    big = speedups(rows, "stock", "plan", lambda r: r["info"]["tokens"] >= 30000)
    small = speedups(rows, "numpy_plan", "plan", lambda r: r["batch"] <= 64)
    out = [
        *at_least("plan >= 100x SGLang's loop at >= 30k tokens", big, 100, span=False, digits=0),
        *at_least("plan >= 4x NumPy's index at B <= 64", small, 4, span=False, digits=1),
    ]
    fixed = binding_fixed_cost(ctx) * 1e6
    out.append({"name": "binding fixed cost <= 2 µs", "met": fixed <= 2, "got": f"{fixed:.2f} µs"})
    notes = [f"Binding fixed cost (`PrunePlan([1], [0]).fill(...)`): {fixed:.2f} µs."]
    return {"targets": out, "notes": notes}


def plan(ctx: Context, size: str) -> Planned:
    return Planned(
        prune_section.shape_cases(ctx, GRIDS[size], measure, series),
        finish=functools.partial(finish, ctx),
        notes=ctx.sglang.stock_notes(),
    )
