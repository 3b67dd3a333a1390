"""Section ``forward``: the release's whole ``LogitsProcessor.forward``.

A CPU-sized processor of the release (nothing loaded: dummy server
arguments, one rank, a bare LM-head weight of a tiny vocabulary), driven
with EXTEND batches that ask for input logprobs and carry EAGLE3 aux layers,
under each capture mode. Three processors run side by side:

* **stock**: a subclass holding the release's own ``forward``,
  ``_get_pruned_states`` and ``_get_hidden_states_to_store``, as shipped;
* **flatgather**: ``LogitsProcessor`` as ``install()`` left it (lazy aux
  pruning on where the probe verified it);
* **eager**: a subclass patched the way ``install(lazy_aux=False)`` patches
  it (``_get_pruned_states`` alone, from the same verified contract);
* **floor** (FULL capture only): what no patch of the logits step can skip,
  flatgather's forward under NULL capture plus the release's own FULL store
  (which packs the unpruned aux layers).

Batches ask for input logprobs only, or also for the top-5 and three
token-id logprobs of every request. Every output field of the processors is
checked bit-identical before timing.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from flatgather import prune_plan
from flatgather.bench.batches import (
    forward_metadata,
    lm_head,
    make_forward_inputs,
    new_processor,
    output_fields,
    publish_server_args,
)
from flatgather.bench.cases import DTYPES, Shape, lengths
from flatgather.bench.sections import SECTIONS, Case, Planned
from flatgather.bench.stats import Scoped
from flatgather.bench.targets import never_slower
from flatgather.bench.timing import Context, Mismatch, same

SECTION = SECTIONS["forward"]

VOCAB = 32
HIDDEN = 1024
DTYPE = "bf16"
LAYERS = 3


# What each request asks for: input logprobs only, or with its top-5 and
# the logprobs of three token ids at every scored row.
INPUT, TOP_IDS = "input logprobs", "top-5 + 3 token ids"
TOP_K, TOKEN_IDS = 5, [1, 2, 3]


@dataclasses.dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    mean_extends: tuple[int, ...]
    captures: tuple[str, ...]
    aux: tuple[str, ...]
    max_tokens: int
    logprobs: tuple[str, ...] = (INPUT, TOP_IDS)


GRIDS = {
    "quick": Grid((1, 64, 256), (16,), ("LAST", "FULL"), ("list",), 16384, (TOP_IDS,)),
    "default": Grid((1, 16, 256, 1024), (16,), ("LAST", "NULL", "FULL"), ("list",), 32768),
    "full": Grid(
        (1, 8, 64, 256, 1024), (16, 256), ("LAST", "NULL", "FULL"), ("list", "packed"), 32768
    ),
}


def processor_classes(ctx: Context) -> dict[str, type]:
    from flatgather.sglang.patches.pruned_states import make_pruned_states

    sg = ctx.sglang
    installed = sg.lp.LogitsProcessor
    stock = type("StockLogitsProcessor", (installed,), dict(sg.stock))
    eager = type(
        "EagerLogitsProcessor",
        (installed,),
        {
            **sg.stock,
            "_get_pruned_states": make_pruned_states(
                sg.stock["_get_pruned_states"], sg.contract, None
            ),
        },
    )
    return {"stock": stock, "flatgather": installed, "eager": eager}


def metadata(ctx: Context, extend, start, capture: str, input_ids, logprobs: str):
    """The forward's metadata on the bench's device: every request asks for
    input logprobs, and in the ``TOP_IDS`` series for its top-k and token ids."""
    b, more = len(extend), logprobs == TOP_IDS
    top = [TOP_K if more else 0] * b
    token_ids = [list(TOKEN_IDS) if more else None for _ in range(b)]
    return forward_metadata(extend, start, capture, input_ids, top, token_ids, device=ctx.device)


def series(capture: str, mean: int, aux: str, logprobs: str) -> str:
    return f"capture {capture}, {logprobs}, mean prompt {mean} tokens, {LAYERS} aux layers ({aux})"


def measure(ctx: Context, grid: Grid, classes, batch, mean, capture, aux_kind, logprobs) -> dict:
    label = series(capture, mean, aux_kind, logprobs)
    shape = Shape(batch, mean, HIDDEN, DTYPE, LAYERS, aux_kind)
    extend, start = lengths(shape, grid.max_tokens)
    rows = sum(extend)
    gen = torch.Generator().manual_seed(batch)
    dtype, device = DTYPES[DTYPE], ctx.device
    input_ids, hidden, _, aux = make_forward_inputs(
        extend, gen, VOCAB, dtype, HIDDEN, False, aux_kind, LAYERS, device=device
    )
    head = lm_head(torch.randn(VOCAB, HIDDEN, generator=gen).to(dtype=dtype, device=device))
    row = {
        "batch": batch,
        "series": label,
        "params": {
            "batch": batch,
            "mean_extend": mean,
            "capture": capture,
            "aux": aux_kind,
            "logprobs": logprobs,
        },
        "info": {"tokens": rows},
    }
    fns, results = {}, {}
    for name, cls in classes.items():
        processor = new_processor(cls, VOCAB, HIDDEN)
        md = metadata(ctx, extend, start, capture, input_ids, logprobs)
        ids = input_ids.to(device)

        def call(processor=processor, md=md, ids=ids):
            return processor.forward(ids, hidden, head, md, aux_hidden_states=aux)

        # Each side as it runs: stock with the release's module functions,
        # flatgather's under the same pinning stand-in (where it needs one);
        # the scope is entered once per timed sample, outside the time.
        scope = ctx.sglang.stock_scope if name == "stock" else ctx.sglang.fg_scope
        run = Scoped(call, scope)
        try:
            results[name] = output_fields(run())
        except Exception as exc:
            if name != "stock":
                raise
            # 0.5.10 without SGLang PR #21589: LAST capture with list aux
            # layers crashes in its own forward. Nothing to compare with.
            row["skipped"] = f"SGLang's own forward raises {type(exc).__name__}: {exc}"
            return row
        # The same metadata serves every timed call: a second call must
        # give the same answer.
        again = output_fields(run())
        if not same(again, results[name]):
            raise Mismatch(f"{name}: a second forward on the same metadata differs ({label})")
        fns[name] = run
    for name in ("flatgather", "eager"):
        if not same(results[name], results["stock"]):
            raise Mismatch(f"{name} forward differs from SGLang's own on B={batch}, {label}")
    if capture == "FULL":
        fns["floor"] = floor(
            ctx,
            classes["flatgather"],
            extend,
            start,
            input_ids,
            logprobs,
            hidden,
            head,
            aux,
        )
    row["info"]["logprobs"] = int(results["stock"]["input_token_logprobs"].shape[0])
    kept = prune_plan(extend, start).num_pruned
    row["info"]["chunks"] = logprob_chunks(new_processor(classes["stock"], VOCAB, HIDDEN), kept)
    row.update(ctx.timer.measure(fns, SECTION.counted))
    return row


def floor(ctx, cls, extend, start, input_ids, logprobs, hidden, head, aux):
    """flatgather's forward under NULL capture, then the release's own FULL
    store of the same batch: what a FULL forward cannot do without."""
    sg = ctx.sglang
    name = "_get_hidden_states_to_store"
    store = sg.stock.get(name) or vars(sg.lp.LogitsProcessor)[name]
    processor = new_processor(cls, VOCAB, HIDDEN)
    null = metadata(ctx, extend, start, "NULL", input_ids, logprobs)
    full = metadata(ctx, extend, start, "FULL", input_ids, logprobs)
    ids = input_ids.to(ctx.device)

    def call():
        processor.forward(ids, hidden, head, null, aux_hidden_states=aux)
        return store(processor, hidden, None, aux, None, None, None, None, full)

    return Scoped(call, sg.fg_scope)


def _constant_in_batch(measured: list[dict], key: str) -> tuple[bool, str]:
    """Whether flatgather's ``key`` count (aten ops, host syncs) is the
    same at every B >= 2 of each series with as many logprob chunks, and the
    counts seen (by chunks)."""
    by: dict[tuple, dict[int, int]] = {}
    for r in measured:
        by.setdefault((r["series"], r["info"]["chunks"]), {})[r["batch"]] = r[key]["flatgather"]
    constant = all(len({n for b, n in counts.items() if b >= 2}) <= 1 for counts in by.values())
    seen: dict[int, set] = {}
    for (_, chunks), counts in by.items():
        seen.setdefault(chunks, set()).update(counts.values())
    text = "; ".join(
        f"{chunks} chunk{'s' if chunks > 1 else ''}: {', '.join(map(str, sorted(ns)))}"
        for chunks, ns in sorted(seen.items())
    )
    return constant, text


def logprob_chunks(processor, kept: int) -> int:
    """How many chunks the release's input-logprob code cuts ``kept`` rows
    into (its own settings: chunked from 0.5.16 on by default)."""
    owner = getattr(processor, "input_logprob_processor", processor)
    size = getattr(owner, "logprobs_chunk_size", 0)
    if not getattr(owner, "enable_logprobs_chunk", False) or kept <= size:
        return 1
    return -(-kept // size)


def finish(rows: list[dict]) -> dict:
    measured = [r for r in rows if "ratios" in r]
    out = []
    for key, what in (("aten_ops", "non-view aten ops"), ("syncs", "host syncs")):
        if measured:
            constant, seen = _constant_in_batch(measured, key)
            out.append(
                {
                    "name": (
                        f"flatgather's {what} per forward the same at every B >= 2 "
                        "(for as many logprob chunks)"
                    ),
                    "met": constant,
                    "got": f"{seen} (per series)",
                }
            )
    floors = [
        r
        for r in measured
        if "flatgather/floor" in r["ratios"]
        and r["params"]["logprobs"] == TOP_IDS
        and r["batch"] in (256, 1024)
    ]
    if floors:
        worst = max(r["ratios"]["flatgather/floor"]["median"] for r in floors)
        out.append(
            {
                "name": "FULL, top-5 + token ids: fg within 1.2x of its floor at B 256 and 1024",
                "met": worst <= 1.2,
                "got": f"at most {worst:.2f}x",
            }
        )
    if measured:
        out.append(
            never_slower(measured, "the whole forward never slower than stock (interval below 1x)")
        )
        lazy = [r for r in measured if "eager/flatgather" in r["ratios"]]
        if lazy:
            lost = [r for r in lazy if r["ratios"]["eager/flatgather"]["high"] < 1.0]
            gain = [r["ratios"]["eager/flatgather"]["median"] for r in lazy]
            out.append(
                {
                    "name": "lazy aux pruning never slower than eager",
                    "met": not lost,
                    "got": f"{min(gain):.2f}x to {max(gain):.2f}x",
                }
            )
    return {"targets": out}


def plan(ctx: Context, size: str) -> Planned:
    grid = GRIDS[size]
    sg = ctx.sglang
    publish_server_args()
    classes = processor_classes(ctx)
    aux_kinds = [a for a in grid.aux if a != "packed" or sg.contract.packed_aux]
    notes = [
        f"Processor: hidden {HIDDEN}, {DTYPE}, vocabulary {VOCAB}, {LAYERS} aux layers; "
        f"input logprobs for every request, and in the `{TOP_IDS}` series its top-{TOP_K} "
        f"and the logprobs of token ids {TOKEN_IDS} at every scored row. **floor** (FULL "
        "capture): flatgather's forward under NULL capture plus the release's own FULL store "
        "(the unpruned aux layers packed), which no patch of this step can skip."
    ]
    if not sg.report.lazy_aux:
        notes.append(
            "Lazy aux pruning is off on this release (the probe did not verify it): "
            "**fg** and **fg eager** run the same code."
        )
    notes += sg.stock_notes()
    cases = [
        Case(
            f"B={b} {series(capture, mean, aux, kind)}",
            functools.partial(measure, ctx, grid, classes, b, mean, capture, aux, kind),
        )
        for aux in aux_kinds
        for kind in grid.logprobs
        for capture in grid.captures
        for mean in grid.mean_extends
        for b in grid.batches
    ]
    return Planned(cases, finish=finish, notes=notes)
