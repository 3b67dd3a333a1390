"""Section ``pruned-states``: ``LogitsProcessor._get_pruned_states`` on an
EXTEND batch with input logprobs, SGLang's own against flatgather's, with a
NumPy anchor and the memory-copy bound."""

from __future__ import annotations

import functools
from collections.abc import Callable

from flatgather.bench.batches import metadata
from flatgather.bench.cases import (
    Grid,
    Shape,
    gathered_bytes,
    make_inputs,
    make_numpy_anchor,
    memcpy_bound,
)
from flatgather.bench.sections import SECTIONS, Case, Planned
from flatgather.bench.targets import at_least, speedups
from flatgather.bench.timing import Context, Mismatch, same

SECTION = SECTIONS["pruned-states"]

GRIDS = {
    "quick": Grid(
        batches=(1, 64, 256),
        mean_extends=(16,),
        hiddens=(1024,),
        dtypes=("bf16",),
        aux=((0, "none"), (3, "list")),
        max_tokens=16384,
    ),
    "default": Grid(
        batches=(1, 8, 64, 256, 1024),
        mean_extends=(16, 256),
        hiddens=(1024,),
        dtypes=("bf16",),
        aux=((0, "none"), (3, "list"), (3, "packed")),
        max_tokens=32768,
    ),
    "full": Grid(
        batches=(1, 8, 64, 256, 1024),
        mean_extends=(16, 128, 512, 2048),
        hiddens=(1024, 4096),
        dtypes=("bf16", "fp32"),
        aux=((0, "none"), (3, "list"), (3, "packed")),
        max_tokens=65536,
    ),
}


def calls(ctx: Context, inputs, anchor) -> dict:
    """stock, flatgather and numpy on the same tensors, each with its own
    metadata (the logprob branch may write on it)."""
    sg = ctx.sglang
    h, aux = inputs.hidden, inputs.aux
    md = {k: metadata(inputs.extend, inputs.start) for k in ("stock", "flatgather", "numpy")}
    return {
        "stock": lambda: sg.stock_pruned_states(h, None, aux, md["stock"]),
        "flatgather": lambda: sg.fg_pruned_states(h, None, aux, md["flatgather"]),
        "numpy": lambda: anchor(None, h, None, aux, md["numpy"]),
    }


def check(ctx: Context, fns: dict, inputs, label: str) -> dict:
    """Every variant's result, each checked against stock's: nothing is
    timed that does not compute what SGLang computes."""
    results = {k: fn() for k, fn in fns.items()}
    drops_aux = not ctx.sglang.contract.prunes_aux and isinstance(inputs.aux, list)
    for k in results:
        if k == "stock":
            continue
        a, b = results[k], results["stock"]
        if drops_aux:
            # A release without SGLang PR #21589 drops list aux layers, which
            # flatgather (and the anchor) prune: compared without them.
            a, b = (*a[:2], *a[3:]), (*b[:2], *b[3:])
        if not same(a, b):
            raise Mismatch(f"{k} differs from SGLang's own result on {label}: a bug")
    return results


def measure(ctx: Context, grid: Grid, shape: Shape, anchor) -> dict:
    inputs = make_inputs(shape, grid.max_tokens, ctx.device)
    fns = calls(ctx, inputs, anchor)
    results = check(ctx, fns, inputs, f"B={shape.batch}, {shape.series}")
    kept = results["flatgather"][0].shape[0]
    fns["memcpy"] = memcpy_bound(inputs, kept)
    row = {
        "batch": shape.batch,
        "series": shape.series,
        "params": shape.to_dict(),
        "info": {
            "tokens": inputs.tokens,
            "kept": kept,
            "mib": round(gathered_bytes(inputs, kept) / 2**20, 1),
        },
    }
    row.update(ctx.timer.measure(fns, SECTION.counted))
    return row


def targets(rows: list[dict]) -> dict:
    b256 = speedups(rows, "stock", "flatgather", lambda r: r["batch"] == 256)
    anchor = speedups(rows, "numpy", "flatgather")
    b1 = speedups(rows, "stock", "flatgather", lambda r: r["batch"] == 1)
    out = [
        *at_least(">= 6x stock at B = 256", b256, 6),
        *at_least(">= 1.2x the NumPy anchor at every shape", anchor, 1.2),
        *at_least("never slower than stock at B = 1", b1, 1.0, span=False),
    ]
    if rows:
        largest = max(r["info"]["mib"] for r in rows)
        top = speedups(rows, "flatgather", "memcpy", lambda r: r["info"]["mib"] >= largest / 2)
        out.append(
            {
                "name": "largest shapes within 1.3x of the memory-copy bound",
                "met": max(top) <= 1.3,
                "got": f"{min(top):.2f}x to {max(top):.2f}x",
            }
        )
    return {"targets": out}


def shape_cases(
    ctx: Context, grid: Grid, measure: Callable, series: Callable[[Shape], str]
) -> list[Case]:
    """A case a shape of ``grid`` (packed aux layers where the release has
    them), each run as ``measure(ctx, grid, shape, anchor)`` with the NumPy
    anchor of the release's contract."""
    contract = ctx.sglang.contract
    anchor = make_numpy_anchor(contract.writes_cpu_indices, contract.trailing_token_to_seq)
    return [
        Case(
            f"B={shape.batch} {series(shape)}",
            functools.partial(measure, ctx, grid, shape, anchor),
        )
        for shape in grid.shapes(contract.packed_aux)
    ]


def plan(ctx: Context, size: str) -> Planned:
    cases = shape_cases(ctx, GRIDS[size], measure, lambda shape: shape.series)
    return Planned(cases, finish=targets, notes=ctx.sglang.stock_notes())
