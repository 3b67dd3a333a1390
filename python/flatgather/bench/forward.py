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
  it (``_get_pruned_states`` alone, from the same verified contract).

Every output field of the three is checked bit-identical before timing.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import types

import torch

from flatgather.bench.cases import DTYPES, Shape, lengths
from flatgather.bench.sections import SECTIONS, Case, Planned
from flatgather.bench.timing import Context, Mismatch, same

SECTION = SECTIONS["forward"]

VOCAB = 32
HIDDEN = 1024
DTYPE = "bf16"
LAYERS = 3


@dataclasses.dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    mean_extends: tuple[int, ...]
    captures: tuple[str, ...]
    aux: tuple[str, ...]
    max_tokens: int


GRIDS = {
    "quick": Grid((1, 64, 256), (16,), ("LAST", "NULL"), ("list",), 16384),
    "default": Grid((1, 8, 64, 256, 1024), (16,), ("LAST", "NULL", "FULL"), ("list",), 32768),
    "full": Grid(
        (1, 8, 64, 256, 1024), (16, 256), ("LAST", "NULL", "FULL"), ("list", "packed"), 32768
    ),
}


def publish_server_args() -> None:
    """Dummy server arguments, published the way the release publishes them:
    through its runtime context where it has one (0.5.22 on), else the
    global setter."""
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy")
    try:
        context = importlib.import_module("sglang.srt.runtime_context")
    except ImportError:
        context = None
    if context is not None and hasattr(context, "publish"):
        context.reset_context()
        context.publish(server_args, role="bench", ranks=context.SpawnRanks(world_rank=0))
    else:
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(server_args)


def processor_classes(ctx: Context) -> dict[str, type]:
    from flatgather.sglang.pruned_states import make_pruned_states

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


def next_token_ids(extend: list[int], start: list[int], input_ids: torch.Tensor) -> list[int]:
    """The ids whose input logprobs are asked for, as the scheduler lists them."""
    ids = input_ids.tolist()
    out, pt = [], 0
    for e, s in zip(extend, start, strict=True):
        seq = [*ids[pt : pt + e], 0]
        out += seq[s + 1 : e + 1]
        pt += e
    return out


def metadata(ctx: Context, extend, start, capture: str, input_ids):
    sg = ctx.sglang
    b = len(extend)
    return sg.lp.LogitsMetadata(
        forward_mode=sg.ForwardMode.EXTEND,
        capture_hidden_mode=getattr(sg.CaptureHiddenMode, capture),
        extend_return_logprob=True,
        extend_return_top_logprob=False,
        extend_token_ids_logprob=False,
        extend_seq_lens=torch.tensor(extend, dtype=torch.int32, device=ctx.device),
        extend_seq_lens_cpu=list(extend),
        extend_logprob_start_lens_cpu=list(start),
        extend_logprob_pruned_lens_cpu=[e - s for e, s in zip(extend, start, strict=True)],
        top_logprobs_nums=[0] * b,
        token_ids_logprobs=[None] * b,
        extend_input_logprob_token_ids_gpu=torch.tensor(
            next_token_ids(extend, start, input_ids), dtype=torch.int64, device=ctx.device
        ),
    )


def series(capture: str, mean: int, aux: str) -> str:
    return f"capture {capture}, mean prompt {mean} tokens, {LAYERS} aux layers ({aux})"


def outputs(output) -> dict:
    return {f.name: getattr(output, f.name) for f in dataclasses.fields(output)}


def measure(ctx: Context, grid: Grid, classes, batch, mean, capture, aux_kind) -> dict:
    label = series(capture, mean, aux_kind)
    shape = Shape(batch, mean, HIDDEN, DTYPE, LAYERS, aux_kind)
    extend, start = lengths(shape, grid.max_tokens)
    rows = sum(extend)
    gen = torch.Generator().manual_seed(batch)
    dtype = DTYPES[DTYPE]
    device = ctx.device

    def tensor(*size):
        return torch.randn(*size, generator=gen).to(dtype=dtype, device=device)

    input_ids = torch.randint(0, VOCAB, (rows,), generator=gen)
    hidden = tensor(rows, HIDDEN)
    layers = [tensor(rows, HIDDEN) for _ in range(LAYERS)]
    aux = layers if aux_kind == "list" else torch.cat(layers, dim=-1)
    lm_head = types.SimpleNamespace(weight=tensor(VOCAB, HIDDEN))
    config = types.SimpleNamespace(vocab_size=VOCAB, hidden_size=HIDDEN)
    row = {
        "batch": batch,
        "series": label,
        "params": {"batch": batch, "mean_extend": mean, "capture": capture, "aux": aux_kind},
        "info": {"tokens": rows},
    }
    fns, results = {}, {}
    for name, cls in classes.items():
        processor = cls(config, skip_all_gather=True)
        md = metadata(ctx, extend, start, capture, input_ids)
        ids = input_ids.to(device)

        def call(processor=processor, md=md, ids=ids):
            return processor.forward(ids, hidden, lm_head, md, aux_hidden_states=aux)

        try:
            results[name] = outputs(ctx.sglang.run_stock(call) if name == "stock" else call())
        except Exception as exc:
            if name != "stock":
                raise
            # 0.5.10 without SGLang PR #21589: LAST capture with list aux
            # layers crashes in its own forward. Nothing to compare with.
            row["skipped"] = f"SGLang's own forward raises {type(exc).__name__}: {exc}"
            return row
        # The same metadata serves every timed call: a second call must
        # give the same answer.
        again = outputs(ctx.sglang.run_stock(call) if name == "stock" else call())
        if not same(again, results[name]):
            raise Mismatch(f"{name}: a second forward on the same metadata differs ({label})")
        fns[name] = (lambda call=call: ctx.sglang.run_stock(call)) if name == "stock" else call
    for name in ("flatgather", "eager"):
        if not same(results[name], results["stock"]):
            raise Mismatch(f"{name} forward differs from SGLang's own on B={batch}, {label}")
    row["info"]["logprobs"] = int(results["stock"]["input_token_logprobs"].shape[0])
    row.update(ctx.timer.measure(fns, SECTION.counted))
    return row


def finish(rows: list[dict]) -> dict:
    measured = [r for r in rows if "ratios" in r]
    out = []
    if measured:
        slower = [r for r in measured if r["ratios"]["stock/flatgather"]["high"] < 1.0]
        worst = min(r["ratios"]["stock/flatgather"]["median"] for r in measured)
        out.append(
            {
                "name": "the whole forward never slower than stock (interval below 1x)",
                "met": not slower,
                "got": f"min {worst:.2f}x" + (f", {len(slower)} slower" if slower else ""),
            }
        )
        lazy = [r for r in measured if r["params"]["capture"] != "FULL"]
        if lazy:
            lost = [r for r in lazy if r["ratios"]["eager/flatgather"]["high"] < 1.0]
            gain = [r["ratios"]["eager/flatgather"]["median"] for r in lazy]
            out.append(
                {
                    "name": "lazy aux pruning never slower than eager (LAST, NULL capture)",
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
        "input logprobs for every request, no top-k or token-id logprobs."
    ]
    if not sg.report.lazy_aux:
        notes.append(
            "Lazy aux pruning is off on this release (the probe did not verify it): "
            "**fg** and **fg eager** run the same code."
        )
    notes += sg.stock_notes()
    cases = [
        Case(
            f"B={b} {series(capture, mean, aux)}",
            functools.partial(measure, ctx, grid, classes, b, mean, capture, aux),
        )
        for aux in aux_kinds
        for capture in grid.captures
        for mean in grid.mean_extends
        for b in grid.batches
    ]
    return Planned(cases, finish=finish, notes=notes)
