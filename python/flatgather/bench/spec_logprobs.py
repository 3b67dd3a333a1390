"""Section ``spec-logprobs``: the output-logprob chain of one EAGLE
spec-v2 verify step.

Every request asks for top-5 logprobs (and, in the second series, the
logprobs of 4 token ids) at each of the ``A = 4`` positions the verify
scores. One call is the whole chain of one step, driven by
:mod:`flatgather.bench.spec_chain` on fresh objects: the release's spec
logprob function (stage 1), ``GenerationBatchResult.copy_to_cpu`` (stage 2)
and the scheduler's ``_normalize_decode_outputs`` (stage 3; inline before
0.5.13, where its comprehensions run alone). **stock** runs the release's
own objects, taken before ``install()``; **fg** what ``install()`` left.
On a CPU the release's host copy hands back the row itself; where the copy
is a module function (0.5.15 on) it is replaced, for both variants, by what
its CUDA branch does (a fresh host tensor and a copy into it), and counted.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from flatgather.bench import spec_chain
from flatgather.bench.sections import SECTIONS, Case, Planned, Unavailable
from flatgather.bench.timing import Context, Mismatch, same

SECTION = SECTIONS["spec-logprobs"]

VOCAB = 32
A = 4
TOP = 5
TOKEN_IDS = [3, 10, 20, 31]


@dataclasses.dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]


GRIDS = {
    "quick": Grid((1, 16, 256)),
    "default": Grid((1, 16, 256, 1024)),
    "full": Grid((1, 4, 16, 64, 256, 1024)),
}

SERIES = {False: f"top-{TOP}, A = {A}", True: f"top-{TOP} + {len(TOKEN_IDS)} token ids, A = {A}"}


def _step(batch: int, ids: bool) -> spec_chain.Step:
    token_ids = [list(TOKEN_IDS) if ids else None for _ in range(batch)]
    return spec_chain.make_step(batch, A, [TOP] * batch, token_ids, vocab=VOCAB, seed=batch)


def _chain(step, stock: bool):
    one, two, three, state = spec_chain.stages(spec_chain.find(), step, stock)

    def call():
        one()
        two()
        return three(), state["result"].logits_output

    return call


def _answer(call):
    logprobs, lo = call()
    return [
        logprobs,
        lo.next_token_top_logprobs_val,
        lo.next_token_top_logprobs_idx,
        lo.next_token_token_ids_logprobs_val,
    ]


def _copies(call) -> int:
    counter: list = []
    with spec_chain.emulated_copies(counter):
        call()
    return len(counter)


def measure(ctx: Context, batch: int, ids: bool) -> dict:
    step = _step(batch, ids)
    fns = {"stock": _chain(step, True), "flatgather": _chain(step, False)}
    with spec_chain.emulated_copies() as emulated:
        if not same(_answer(fns["flatgather"]), _answer(fns["stock"])):
            raise Mismatch(f"flatgather's chain differs from SGLang's own on B={batch}")
        row = {
            "batch": batch,
            "series": SERIES[ids],
            "params": {"batch": batch, "A": A, "top": TOP, "token_ids": len(TOKEN_IDS) * ids},
            "info": {
                "rows": batch * A,
                "copies_stock": _copies(fns["stock"]) if emulated else None,
                "copies_fg": _copies(fns["flatgather"]) if emulated else None,
            },
        }
        row.update(ctx.timer.measure(fns, SECTION.counted))
    return row


def finish(rows: list[dict]) -> dict:
    measured = [r for r in rows if "ratios" in r]
    if not measured:
        return {}
    out = []
    flat = {
        (r["series"], r["aten_ops"]["flatgather"], r["syncs"]["flatgather"], r["info"]["copies_fg"])
        for r in measured
    }
    out.append(
        {
            "name": "fg's aten ops, host copies and host syncs per step the same at every B",
            "met": len(flat) == len({r["series"] for r in measured}),
            "got": ", ".join(sorted({f"{o} ops / {c} copies / {s} syncs" for _, o, s, c in flat})),
        }
    )
    # The step of the issue: top-5 and 4 token ids per request, A = 4.
    at256 = [r for r in measured if r["batch"] == 256 and r["params"]["token_ids"]]
    if at256:
        worst = min(r["ratios"]["stock/flatgather"]["median"] for r in at256)
        out.append(
            {
                "name": f"stock/fg >= 5x at B = 256 ({SERIES[True]})",
                "met": worst >= 5,
                "got": f"{worst:.1f}x",
            }
        )
    at1 = [r for r in measured if r["batch"] == 1]
    if at1:
        slower = [r for r in at1 if r["ratios"]["stock/flatgather"]["high"] < 1.0]
        worst = min(r["ratios"]["stock/flatgather"]["median"] for r in at1)
        out.append(
            {"name": "never slower than stock at B = 1", "met": not slower, "got": f"{worst:.2f}x"}
        )
    return {"targets": out}


def plan(ctx: Context, size: str) -> Planned:
    if ctx.device.type != "cpu":
        raise Unavailable("the chain is driven with CPU stand-ins for the scheduler's objects")
    chain = spec_chain.find()  # imports the modules: their patches land now
    report = ctx.sglang.fs.installed_report()
    if not any("copy_to_cpu" in p for p in report.patched):
        raise Unavailable("install() left GenerationBatchResult.copy_to_cpu stock here")
    torch.manual_seed(0)
    cases = [
        Case(f"B={b} {SERIES[ids]}", functools.partial(measure, ctx, b, ids))
        for ids in (False, True)
        for b in GRIDS[size].batches
    ]
    with spec_chain.emulated_copies() as emulated:
        pass
    notes = [
        f"Logits of {VOCAB} columns (float32), greedy; B requests x A = {A} positions; every "
        "stage in inference mode, as the scheduler's event loop runs it. A small vocabulary "
        "keeps the kernels both variants run alike (log-softmax, top-k) from hiding the host "
        "work that differs; on a GPU they run asynchronously. "
        + (
            "Host copies emulated (a host tensor and a copy each), counted in the info columns."
            if emulated
            else "This release copies with `.to('cpu')` inline: on a CPU it copies nothing, "
            "in both variants."
        )
        + (
            " Stage 3 is the inline comprehensions (0.5.12 and older)."
            if chain.processor is None
            else ""
        )
    ]
    return Planned(cases, finish=finish, notes=notes)
