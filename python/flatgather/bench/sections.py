"""The bench's sections: one registry, so that a new measurement is one more
entry and a module with a ``plan`` function.

Each :class:`Section` says what it measures (for the report), which
variants it times side by side, which ratios of them it reports, and which
module runs it. That module's ``plan(ctx, size)`` returns a :class:`Planned`
(the cases, each run later with progress shown), or raises
:class:`Unavailable` to be listed as not measured, with the reason.

Nothing here imports torch or SGLang: ``flatgather report`` reads the
registry to know nothing more than the saved JSON holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

SIZES = ("quick", "default", "full")


class Unavailable(Exception):
    """The section cannot run here; the message says why."""


@dataclass(frozen=True)
class Timing:
    samples: int
    """Rounds; each round takes one sample of every variant."""
    warmup_s: float
    sample_s: float
    """Target length of one sample (calls per sample are calibrated)."""


TIMINGS = {
    "quick": Timing(samples=5, warmup_s=0.02, sample_s=0.005),
    "default": Timing(samples=15, warmup_s=0.05, sample_s=0.01),
    "full": Timing(samples=25, warmup_s=0.1, sample_s=0.02),
}


@dataclass(frozen=True)
class Ratio:
    num: str
    den: str
    header: str
    """Column header, e.g. ``stock/fg``."""
    meaning: str
    """What a value above 1 means, in words (for the report's legend)."""
    decisive: bool = True
    """An interval holding 1.0 is worth a warning (it is for speed-ups, not
    for the distance to a bound)."""
    plot: str | None = None
    """Plotted, with this suffix on the legend ("" for none)."""

    @property
    def key(self) -> str:
        return f"{self.num}/{self.den}"


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    about: str
    """One paragraph for the report: what is timed, on what."""
    module: str
    variants: dict[str, str]
    """Variant key -> short column name."""
    ratios: tuple[Ratio, ...]
    info: tuple[tuple[str, str], ...] = ()
    """(key, header) of per-row facts shown before the times."""
    counted: tuple[str, ...] = ("stock", "flatgather")
    """Variants whose aten ops (and, on CUDA, GPU launches) are counted."""

    def meta(self) -> dict:
        out = asdict(self)
        out["ratios"] = [{**asdict(r), "key": r.key} for r in self.ratios]
        return out


@dataclass
class Case:
    label: str
    """Shown in the progress line."""
    run: Callable[[], dict]
    """Measures and returns the row: ``batch``, ``series`` (words, parts
    joined by ", "), ``info``, ``time`` (variant -> stats dict) and
    optionally ``host_time``, ``launches``, ``aten_ops``, ``skipped``."""


@dataclass
class Planned:
    cases: list[Case]
    finish: Callable[[list[dict]], dict] = field(default=lambda rows: {})
    """Called with the rows (ratios added): returns ``notes`` and ``targets``
    (each ``{"name", "met", "got"}``)."""
    notes: list[str] = field(default_factory=list)


STOCK_FG = Ratio(
    "stock", "flatgather", "stock/fg", "flatgather is faster than SGLang's own code", plot=""
)
NUMPY_FG = Ratio("numpy", "flatgather", "numpy/fg", "flatgather beats the NumPy anchor")

SECTIONS: dict[str, Section] = {
    s.name: s
    for s in (
        Section(
            name="pruned-states",
            title="`_get_pruned_states`: the logprob prefill branch",
            about=(
                "`LogitsProcessor._get_pruned_states` on an EXTEND batch with input logprobs: "
                "SGLang's own function (**stock**), flatgather installed (**fg**), a "
                "NumPy-vectorised index with one `index_select` per tensor (**numpy**), and a "
                "contiguous copy of the same bytes into fresh tensors (**memcpy**, the bound). "
                "Batches are serving-like: extend lengths uniform around the mean prompt, a "
                "quarter chunked-prefill chunks, a quarter scored from their first token."
            ),
            module="flatgather.bench.prune_section",
            variants={"stock": "stock", "flatgather": "fg", "numpy": "numpy", "memcpy": "memcpy"},
            ratios=(
                STOCK_FG,
                NUMPY_FG,
                Ratio(
                    "flatgather",
                    "memcpy",
                    "fg/memcpy",
                    "distance to the memory-copy bound (1 = at the bound)",
                    decisive=False,
                ),
            ),
            info=(("tokens", "tokens"), ("kept", "kept rows"), ("mib", "MiB gathered")),
        ),
        Section(
            name="host-cost",
            title="Host cost: the same calls on zero-width tensors",
            about=(
                "The same `_get_pruned_states` calls with `hidden_states` and every aux layer of "
                "shape `[N, 0]`: nothing is copied, so what is left is the dispatch and Python "
                "work that a GPU cannot hide behind its kernels. Also timed: flatgather's index "
                "plan alone (**plan**: `PrunePlan` + `fill`) and the NumPy anchor's index "
                "computation alone (**numpy plan**)."
            ),
            module="flatgather.bench.host_cost",
            variants={
                "stock": "stock",
                "flatgather": "fg",
                "numpy": "numpy",
                "plan": "plan",
                "numpy_plan": "numpy plan",
            },
            ratios=(
                STOCK_FG,
                NUMPY_FG,
                Ratio("stock", "plan", "stock/plan", "SGLang's loop vs flatgather's plan"),
                Ratio("numpy_plan", "plan", "numpy plan/plan", "the plan beats NumPy's index"),
            ),
            info=(("tokens", "tokens"),),
        ),
        Section(
            name="forward",
            title="`LogitsProcessor.forward`: the whole prefill step",
            about=(
                "The release's whole `LogitsProcessor.forward` on a CPU-sized processor (tiny "
                "vocabulary, so the LM head does not drown the rest), input logprobs asked for "
                "(alone, or with top-5 and token-id logprobs), 3 EAGLE3 aux layers, under each "
                "capture mode of the hidden states: SGLang as shipped (**stock**), flatgather "
                "as `install()` patches it (**fg**, lazy aux pruning on) and as "
                "`install(lazy_aux=False)` patches it (**fg eager**); under FULL capture also "
                "its **floor**: flatgather's forward under NULL capture plus the release's own "
                "FULL store (the unpruned aux layers packed), which nothing may skip."
            ),
            module="flatgather.bench.forward",
            variants={"stock": "stock", "flatgather": "fg", "eager": "fg eager", "floor": "floor"},
            ratios=(
                Ratio(
                    "stock",
                    "flatgather",
                    "stock/fg",
                    "flatgather (lazy aux on) is faster than SGLang",
                    plot=", lazy aux on",
                ),
                Ratio(
                    "stock",
                    "eager",
                    "stock/eager",
                    "flatgather (lazy aux off) is faster than SGLang",
                    plot=", lazy aux off",
                ),
                Ratio("eager", "flatgather", "eager/fg", "lazy aux pruning saves time"),
                Ratio(
                    "flatgather",
                    "floor",
                    "fg/floor",
                    "distance to the floor (1 = at it)",
                    decisive=False,
                ),
            ),
            info=(("tokens", "tokens"), ("logprobs", "input logprobs"), ("chunks", "chunks")),
        ),
        Section(
            name="logprobs",
            title="Token-id input logprobs",
            about=(
                "The token-id input-logprob functions `install()` replaced, called as the "
                "release's input-logprob code calls them on one chunk: SGLang's own (**stock**) "
                "against flatgather's one plan, one gather and one `.tolist()` (**fg**). Every "
                "request asks for three token ids at each scored row. Where the release ships "
                "the unused `get_token_ids_logprobs_batch_optimized`, it is timed on the "
                "one-row-per-request series (**batch_opt**; its answer holds tensors, so it is "
                "not compared)."
            ),
            module="flatgather.bench.logprobs",
            variants={"stock": "stock", "flatgather": "fg", "batch_opt": "batch_opt"},
            ratios=(
                STOCK_FG,
                Ratio(
                    "batch_opt",
                    "flatgather",
                    "batch_opt/fg",
                    "flatgather beats the release's unused vectorised function",
                ),
            ),
            info=(("rows", "rows"), ("values", "values")),
            counted=("stock", "flatgather", "batch_opt"),
        ),
        Section(
            name="spec-logprobs",
            title="Output logprobs of a speculative verify step",
            about=(
                "The chain of one EAGLE spec-v2 verify step whose requests ask for top-5 "
                "logprobs (and token-id logprobs) at each of A = 4 positions, driven on the "
                "release's own objects: its spec logprob function, "
                "`GenerationBatchResult.copy_to_cpu` and the scheduler's "
                "`_normalize_decode_outputs`. SGLang as shipped (**stock**: a view, a host copy "
                "and a `.tolist()` per row) against flatgather installed (**fg**: one gather, one "
                "copy and one `.tolist()` per tensor)."
            ),
            module="flatgather.bench.spec_logprobs",
            variants={"stock": "stock", "flatgather": "fg"},
            ratios=(STOCK_FG,),
            info=(("rows", "rows"), ("copies_stock", "copies stock"), ("copies_fg", "copies fg")),
        ),
        Section(
            name="rotation",
            title="The V2 draft worker's prefill rotation",
            about=(
                "`EagleDraftWorker._draft_extend_for_prefill` of the release, driven by "
                "`flatgather.bench.draft_harness` up to `ForwardBatch.init_new` on a fresh batch "
                "per call: SGLang's per-request rotation of `input_ids` (and of "
                "`mm_input_embeds` where the release rotates them) (**stock**) against the "
                "method `install()` patched, one plan and one gather (**fg**). **harness** is "
                "the harness alone (a method that goes straight to `ForwardBatch.init_new`): "
                "its cost is in both, and is most of it at small batches."
            ),
            module="flatgather.bench.rotation",
            variants={"stock": "stock", "flatgather": "fg", "harness": "harness"},
            ratios=(STOCK_FG,),
            info=(("tokens", "tokens"),),
        ),
    )
}


def resolve(names: list[str] | None) -> list[Section]:
    """The sections asked for (all when None), in registry order."""
    if not names:
        return list(SECTIONS.values())
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise KeyError(
            f"unknown section {', '.join(unknown)}; the sections are {', '.join(SECTIONS)}"
        )
    return [s for s in SECTIONS.values() if s.name in names]
