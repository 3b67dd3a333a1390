"""Section ``rotation``: the V2 draft worker's prefill rotation.

The release's own ``EagleDraftWorker._draft_extend_for_prefill`` against the
one ``install()`` patched, each driven through
:mod:`flatgather.bench.draft_harness` up to ``ForwardBatch.init_new``: a
fresh batch per call, the per-request rotation of ``input_ids`` (and of
``mm_input_embeds`` where the release rotates them), the tail tokens, the
spec info. The harness's own cost (the fresh batch, the stand-ins) is in
both, so it is timed alone too (**harness**): at small batches it is most of
what both variants cost.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

from flatgather.bench.sections import SECTIONS, Case, Planned, Unavailable
from flatgather.bench.timing import Context, Mismatch, same

SECTION = SECTIONS["rotation"]


@dataclasses.dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    mean_extends: tuple[int, ...]
    mm_widths: tuple[int | None, ...]
    """Widths of ``mm_input_embeds``; None: without them."""
    max_tokens: int


GRIDS = {
    "quick": Grid((1, 64, 256), (16,), (None,), 16384),
    "default": Grid((1, 8, 64, 256, 1024), (16, 256), (None,), 32768),
    "full": Grid((1, 8, 64, 256, 1024, 4096), (16, 256, 2048), (None, 1024), 65536),
}


def lens_for(batch: int, mean: int, max_tokens: int) -> list[int]:
    """Extend lengths uniform around the mean (at least 1), cut to the
    token budget as a scheduler's budget would."""
    rng = np.random.default_rng([batch, mean, 7])
    lens = rng.integers(1, 2 * mean, size=batch, endpoint=False)
    if lens.sum() > max_tokens:
        lens = np.maximum(1, (lens * (max_tokens / lens.sum())).astype(np.int64))
    return lens.tolist()


def series(mean: int, mm: int | None) -> str:
    mm_words = "no mm_input_embeds" if mm is None else f"mm_input_embeds of width {mm}"
    return f"mean prompt {mean} tokens, {mm_words}"


def _on(device, inputs):
    if device.type == "cpu":
        return inputs
    return dataclasses.replace(
        inputs,
        input_ids=inputs.input_ids.to(device),
        next_token_ids=inputs.next_token_ids.to(device),
        mm_input_embeds=None
        if inputs.mm_input_embeds is None
        else inputs.mm_input_embeds.to(device),
    )


def _seen(seen) -> tuple:
    """What must be identical: the ids and mm rows the draft forward gets."""
    return (seen.input_ids_values, seen.mm_input_embeds)


def calls(ctx: Context, harness, inputs) -> dict:
    sg = ctx.sglang
    module = sg.draft_module

    def floor(self, batch, hidden, tails, **kwargs):
        # Straight to the draft forward: the harness alone.
        module.ForwardBatch.init_new(batch, None)

    run = harness.run
    return {
        "stock": lambda: run(module, inputs, method=sg.draft_stock),
        "flatgather": lambda: run(module, inputs, method=sg.draft_fg),
        "harness": lambda: run(module, inputs, method=floor),
    }


def check(fns: dict, lens: list[int], label: str) -> None:
    stock, ours = fns["stock"](), fns["flatgather"]()
    if not same(ours.input_ids_values, stock.input_ids_values):
        raise Mismatch(f"flatgather's rotation differs from SGLang's own on {label}: a bug")
    mm, our_mm = stock.mm_input_embeds, ours.mm_input_embeds
    if (mm is None) != (our_mm is None):
        raise Mismatch(f"flatgather's mm_input_embeds differ from SGLang's on {label}")
    if mm is not None:
        # The release leaves the last row of each request unwritten: the
        # other rows are compared.
        defined = torch.ones(mm.shape[0], dtype=torch.bool)
        defined[torch.tensor(lens).cumsum(0) - 1] = False
        if not same(our_mm[defined.to(mm.device)], mm[defined.to(mm.device)]):
            raise Mismatch(f"flatgather's mm_input_embeds differ from SGLang's on {label}")


def measure(ctx: Context, harness, grid: Grid, batch: int, mean: int, mm: int | None) -> dict:
    lens = lens_for(batch, mean, grid.max_tokens)
    inputs = _on(ctx.device, harness.make_inputs(lens, seed=batch, mm_width=mm))
    label = series(mean, mm)
    fns = calls(ctx, harness, inputs)
    check(fns, lens, f"B={batch}, {label}")
    row = {
        "batch": batch,
        "series": label,
        "params": {"batch": batch, "mean_extend": mean, "mm_width": mm},
        "info": {"tokens": sum(lens)},
    }
    row.update(ctx.timer.measure(fns, SECTION.counted))
    return row


def plan(ctx: Context, size: str) -> Planned:
    sg = ctx.sglang
    try:
        from flatgather.bench import draft_harness as harness
    except ImportError as exc:
        raise Unavailable(f"the draft worker's harness does not import: {exc}") from None
    if sg.draft_module is None:
        raise Unavailable(f"{sg.draft_problem or 'the draft worker is not loaded'}")
    if sg.draft_fg is sg.draft_stock:
        left = "; ".join(sg.report.notes) or "no note"
        raise Unavailable(f"flatgather left the rotation stock here ({left})")
    grid = GRIDS[size]
    mm_widths = list(grid.mm_widths)
    # A first, small call on this device: a release or device the harness
    # cannot drive is reported, and the other sections still run.
    try:
        probe = _on(ctx.device, harness.make_inputs([3, 1, 2], seed=0))
        check(calls(ctx, harness, probe), [3, 1, 2], "a probe batch")
        if any(w is not None for w in mm_widths):
            probe = _on(ctx.device, harness.make_inputs([3, 1, 2], seed=0, mm_width=8))
            if harness.run(sg.draft_module, probe, method=sg.draft_stock).mm_input_embeds is None:
                mm_widths = [w for w in mm_widths if w is None]  # not rotated by this release
    except Mismatch:
        raise
    except Exception as exc:
        raise Unavailable(
            f"the harness cannot drive this release on {ctx.device}: {type(exc).__name__}: {exc}"
        ) from None
    notes = list(sg.draft_notes)
    backports = [b for b in sg.report.backports if b == "draft-prefill-no-logprob"]
    if backports:
        notes.append(
            "flatgather also backports `draft-prefill-no-logprob` here: the draft forward "
            "runs without logprobs (not timed: it happens in the forward)."
        )
    cases = [
        Case(
            f"B={b} {series(mean, mm)}",
            functools.partial(measure, ctx, harness, grid, b, mean, mm),
        )
        for mm in mm_widths
        for mean in grid.mean_extends
        for b in grid.batches
    ]
    return Planned(cases, finish=finish, notes=notes)


def finish(rows: list[dict]) -> dict:
    big = [r["ratios"]["stock/flatgather"]["median"] for r in rows if r["batch"] >= 256]
    out = []
    if big:
        out.append(
            {
                "name": "rotation faster than stock at B >= 256 (harness cost included)",
                "met": min(big) > 1,
                "got": f"{min(big):.2f}x to {max(big):.2f}x",
            }
        )
    return {"targets": out}
