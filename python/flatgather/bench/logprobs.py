"""Section ``logprobs``: the token-id input-logprob functions.

Each function ``install()`` replaced (``get_token_ids_logprobs_chunk`` on
every release, ``get_token_ids_logprobs_prefill`` up to 0.5.15), called the
way the release's input-logprob code calls it on one chunk: the release's
own (**stock**) against flatgather's (**fg**), side by side on the same
logprobs. Every request asks for the logprobs of three token ids at each of
its scored rows; where the function takes raw logits and a per-row
normalizer (0.5.18 on, SGLang's default "fast input logprobs"), both ways
are timed.

Where the release ships ``get_token_ids_logprobs_batch_optimized`` (a
vectorised variant nothing calls, with one row per request and tensors per
request in its answer), it is timed too (**batch_opt**) on the same rows
as the other two with one scored row per request, so that its cost and its
host syncs stand beside theirs; its answer is not the same kind of value,
so it is not compared.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types

import numpy as np
import torch

from flatgather.bench.sections import SECTIONS, Case, Planned, Unavailable
from flatgather.bench.targets import never_slower
from flatgather.bench.timing import Context, Mismatch, same

SECTION = SECTIONS["logprobs"]

VOCAB = 1024
TOKEN_IDS = [11, 500, 1023]
OPTIMIZED = "get_token_ids_logprobs_batch_optimized"


@dataclasses.dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    mean_rows: tuple[int, ...]
    """Mean scored rows per request (1: the decode-shaped series)."""


GRIDS = {
    "quick": Grid((1, 64, 256), (16,)),
    "default": Grid((1, 16, 256, 1024), (1, 16)),
    "full": Grid((1, 2, 8, 16, 64, 256, 1024), (1, 16, 64)),
}


def pruned_lens(batch: int, mean: int) -> list[int]:
    """Scored rows per request, uniform around the mean (a quarter of the
    requests with none: chunks with nothing left to score)."""
    if mean == 1:
        return [1] * batch
    rng = np.random.default_rng([batch, mean, 11])
    lens = rng.integers(1, 2 * mean, size=batch)
    lens[1:][rng.random(batch - 1) < 0.25] = 0  # the first always scores
    return lens.tolist()


def series(where: str, mean: int, normalized: bool) -> str:
    kind = "raw logits + normalizer" if normalized else "log-softmax"
    return f"{where.rsplit('.', 1)[-1]}, {kind}, {mean} scored rows per request on average"


def _call(fn, where: str, logprobs, lens, normalizer):
    ids = [list(TOKEN_IDS) for _ in lens]
    if where.endswith("prefill"):
        md = types.SimpleNamespace(token_ids_logprobs=ids, extend_logprob_pruned_lens_cpu=lens)
        return fn(logprobs, md)
    val, idx = [], []
    kwargs = {} if normalizer is None else {"log_normalizer": normalizer}
    end = fn(logprobs, ids, lens, val, idx, 0, **kwargs)
    return end, val, idx


def measure(ctx: Context, where: str, batch: int, mean: int, normalized: bool) -> dict:
    stock, fg = ctx.sglang.token_ids[where]
    lens = pruned_lens(batch, mean)
    rows = sum(lens)
    gen = torch.Generator().manual_seed(batch)
    logprobs = torch.randn(rows, VOCAB, generator=gen).to(ctx.device)
    normalizer = None
    if normalized:
        x = logprobs.float()
        row_max = x.amax(-1)
        normalizer = (row_max, torch.logsumexp(x - row_max[:, None], dim=-1))
    else:
        logprobs = torch.log_softmax(logprobs, dim=-1)
    fns = {
        "stock": functools.partial(_call, stock, where, logprobs, lens, normalizer),
        "flatgather": functools.partial(_call, fg, where, logprobs, lens, normalizer),
    }
    label = series(where, mean, normalized)
    if not same(fns["flatgather"](), fns["stock"]()):
        raise Mismatch(f"flatgather's {where} differs from SGLang's own on B={batch}, {label}")
    optimized = getattr(sys.modules[where.rsplit(".", 1)[0]], OPTIMIZED, None)
    if optimized is not None and mean == 1 and not normalized:
        ids = [list(TOKEN_IDS) for _ in lens]
        fns["batch_opt"] = functools.partial(optimized, logprobs, ids)
    row = {
        "batch": batch,
        "series": label,
        "params": {"batch": batch, "mean_rows": mean, "function": where, "normalized": normalized},
        "info": {"rows": rows, "values": rows * len(TOKEN_IDS)},
    }
    row.update(ctx.timer.measure(fns, SECTION.counted))
    return row


def finish(rows: list[dict]) -> dict:
    measured = [r for r in rows if "ratios" in r]
    out = []
    if not measured:
        return {}
    # One request goes to the release's own function: what is left is the
    # replacement's own call (a fraction of a microsecond), shown, not judged.
    several = [r for r in measured if r["batch"] >= 2]
    if several:
        out.append(never_slower(several, "never slower than stock at B >= 2 (interval below 1x)"))
    flat = {(r["series"], r["aten_ops"]["flatgather"], r["syncs"]["flatgather"]) for r in several}
    series_count = len({r["series"] for r in several})
    out.append(
        {
            "name": "flatgather's aten ops and host syncs per call the same at every B >= 2",
            "met": len(flat) == series_count,
            "got": ", ".join(sorted({f"{ops} ops / {s} syncs" for _, ops, s in flat})),
        }
    )
    return {"targets": out}


def plan(ctx: Context, size: str) -> Planned:
    grid = GRIDS[size]
    functions = ctx.sglang.token_ids
    if not functions:
        raise Unavailable("install() replaced no token-id logprob function on this release")
    cases = []
    for where, (stock, _) in functions.items():
        code = stock.__code__
        takes_normalizer = "log_normalizer" in code.co_varnames[: code.co_argcount]
        for normalized in (False, True) if takes_normalizer else (False,):
            for mean in grid.mean_rows:
                for b in grid.batches:
                    label = f"B={b} {series(where, mean, normalized)}"
                    cases.append(
                        Case(label, functools.partial(measure, ctx, where, b, mean, normalized))
                    )
    notes = [
        f"Logprobs of {VOCAB} columns (float32); every request asks for token ids {TOKEN_IDS}. "
        "A quarter of the requests after the first have no scored row (except in the "
        "one-row series). At B = 1 flatgather hands the call to the release's own function: "
        "the difference is the replacement's own call."
    ]
    return Planned(cases, finish=finish, notes=notes)
