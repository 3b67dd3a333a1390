"""What the mutation suite mutates, how each mutant goes in, and the oracle
that tells whether what is then in place answers as the mutant does.

A mutant is the release's own function with one edit, in a module of its
own whose source file says so (flatgather reads and proves the source of
what it patches). flatgather's patcher of that function is handed the
mutant as it would be handed a fork's code; whatever it leaves in place (its
replacement, or the mutant itself when it refuses) is then run side by side
with the mutant on random inputs it has never seen.
"""

from __future__ import annotations

import ast
import contextlib
import copy as copy_module
import dataclasses
import functools
import importlib
import importlib.util
import itertools
import random
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from _modules import module_from_tree
from flatgather.sglang.compare import first_difference
from flatgather.sglang.patches.pruned_states import Pruning
from flatgather.testing import fingerprints

_serial = itertools.count()

SHAPE_GATE = True
"""Off (``--no-shape-gate``): what the probe and the side-by-side checks
alone would let through, the known-code gate (``shapes.known``) answering
yes to every fingerprint."""


@dataclass
class Trial:
    """One mutant, in place and judged."""

    patched: bool
    """The patch under test took the mutant (else it refused it, or the
    whole install was refused)."""
    difference: str | None = None
    """The first input on which what is in place answers otherwise than
    the mutant; None when none of the inputs tried tells them apart."""
    compared: int = 0
    """Inputs compared."""
    raised: int = 0
    """Of those, inputs on which the mutant itself raised (compared by the
    exception's type)."""
    reached: int | None = None
    """Of those, inputs that took the path under test where the target has
    one apart (the store: a lazy aux result handed to it)."""
    note: str = ""
    distinguished: bool | None = None
    """Whether some input tried tells the mutant apart from the unmodified
    release (each run as the mutant runs, side by side); None where the
    suite runs the target on no inputs."""
    told: str = ""
    """The first input that tells them apart, and how."""
    unchecked: str = ""
    """Why flatgather's answer could not be held to the mutant's on some
    input (the first such input)."""

    def tell(self, found: str | None, where: str = "") -> None:
        """Record one input's comparison of the mutant with the release."""
        if self.distinguished is None:
            self.distinguished = False
        if found and not self.distinguished:
            self.distinguished, self.told = True, f"{where}: {found}" if where else found


GROW = 4
"""A mutant that ``cases`` inputs do not tell apart from the release gets
up to ``GROW`` times as many before it is counted not distinguished (one
equivalent by construction, or argued, ``cases`` only)."""
GROWING = GROW
"""The factor for the mutant being judged."""


def tries(trial: Trial, cases: int, alone: bool):
    """Input numbers for ``trial``: ``cases`` of them, more while the mutant
    is not told apart from the release, none after a silent difference;
    with ``alone`` (what is in place is the mutant itself, and nothing of
    flatgather's runs with it) none once it is told apart."""
    n = 0
    while trial.difference is None:
        told = bool(trial.distinguished)
        if (told and (alone or n >= cases)) or n >= cases * (1 if told else GROWING):
            return
        yield n
        n += 1


@dataclass
class Inputs:
    """The inputs of one target: input ``n`` is drawn from its own seeded
    generator, so every mutant of the target meets the same inputs, and the
    unmodified release's outcome on each is computed once."""

    prefix: str
    outcomes: dict = field(default_factory=dict)

    def rng(self, n: int) -> random.Random:
        return random.Random(f"{self.prefix}/{n}")

    def release(self, n: int, compute: Callable, *args):
        """The release's outcome on input ``n``: ``compute(*args)``, once."""
        if n not in self.outcomes:
            self.outcomes[n] = compute(*args)
        return self.outcomes[n]


@dataclass
class Target:
    name: str
    module: str
    owner: str | None
    function: str
    trial: Callable[..., Trial]
    """``trial(copy, mutant, release, inputs, cases)``: install ``mutant``
    (defined in the module ``copy``), judge it on ``cases`` random inputs
    (more where they do not tell it from ``release``, the function unedited
    in a module of its own), put back what was there."""
    whole_module: bool = True
    """The copy holds the whole release module (else its imports and the
    one class or function)."""
    always_compared: bool = False
    """What is in place runs with flatgather's other code even where the
    patch refuses the mutant (the stages of a chain): compared either way."""
    whole_function: bool = False
    """Replaced whole behind its known shape: the suite has no oracle for
    it, and any mutant patched counts as silently different."""
    gated: bool = False
    """Replaced whole only where its code is known (``shapes.known``): with
    the gate on, every edit is refused by construction (any edit changes the
    fingerprint)."""
    release_raises: bool = False
    """Some of its inputs are calls the release itself fails on, on purpose
    (the front end's assertion of a tokenizer): the unchanged function
    raises on those, and returns on the others."""
    through: str | None = None
    """The caller it is judged through (a helper of its module, mutated in
    a copy of the whole module), where it has no trial of its own."""


# --- the mutant in a module of its own -------------------------------------------------------


def release_tree(target: Target) -> tuple[types.ModuleType, ast.Module, ast.FunctionDef]:
    module = importlib.import_module(target.module)
    path = Path(module.__file__)
    tree = ast.parse(path.read_text(), str(path))
    return module, tree, _find(tree, target)


def _find(tree: ast.Module, target: Target) -> ast.FunctionDef:
    body = tree.body
    if target.owner is not None:
        (cls,) = [n for n in body if isinstance(n, ast.ClassDef) and n.name == target.owner]
        body = cls.body
    (fn,) = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == target.function]
    return fn


def module_with(target: Target, tree: ast.Module, mutated: ast.FunctionDef, where: Path):
    """A module whose source file is the release module's with ``target``'s
    function replaced by ``mutated``; with ``whole_module`` off, only the
    release module's globals (taken from it) and the one class, holding the
    one method, or the one function."""
    import copy

    tree = copy.deepcopy(tree)
    original = _find(tree, target)
    if target.whole_module:
        holder = tree.body
        if target.owner is not None:
            (cls,) = [
                n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == target.owner
            ]
            holder = cls.body
        holder[holder.index(original)] = mutated
        new = tree
    else:
        take = ast.parse(
            f"import {target.module} as flatgather_release\n"
            "globals().update({k: v for k, v in vars(flatgather_release).items() "
            "if not k.startswith('__')})\n"
        ).body
        # A module of its own reads annotations as the release's does.
        take = [
            *(n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"),
            *take,
        ]
        if target.owner is None:
            new = ast.Module([*take, mutated], [])
        else:
            cls = ast.ClassDef(target.owner, [], [], [mutated], [])
            new = ast.Module([*take, cls], [])
    return module_from_tree(new, where, f"flatgather_mutant_{next(_serial)}")


def function_of(target: Target, module: types.ModuleType) -> types.FunctionType:
    holder = module if target.owner is None else getattr(module, target.owner)
    return vars(holder)[target.function]


# --- the draft worker's prefill --------------------------------------------------------------


def _draft_trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
    from flatgather.bench import draft_harness
    from flatgather.sglang.patches import draft_prefill

    result = draft_prefill.PATCH.prepare(copy)
    trial = Trial(patched=draft_prefill.ROTATION in result.applied, note="; ".join(result.notes))
    new = [p.new for p in result.swaps if p.name == draft_prefill.METHOD]
    backport = draft_prefill.BACKPORT in result.applied
    for n in tries(trial, cases, alone=not new):
        batch = _draft_inputs(inputs.rng(n))
        where = f"lens {list(batch.lens)}"
        base = inputs.release(n, _outcome, draft_harness.run, copy, batch, release)
        stock = _outcome(draft_harness.run, copy, batch, mutant)
        trial.compared += 1
        trial.raised += isinstance(stock, type)
        trial.tell(_draft_difference(batch, stock, base, False), where)
        if new:
            ours = _outcome(draft_harness.run, copy, batch, new[0])
            found = _draft_difference(batch, ours, stock, backport)
            if found:
                trial.difference = f"{where}: {found}"
    return trial


def _draft_inputs(rng: random.Random):
    from flatgather.bench.draft_harness import make_inputs

    b = rng.choice([1, 2, 3, rng.randint(1, 8), rng.randint(1, 40)])
    longest = rng.choice([1, 2, 8, 64])
    lens = [1 if rng.random() < 0.2 else rng.randint(1, longest) for _ in range(b)]
    chunked = rng.choice([None, None, rng.randint(0, b)])
    return make_inputs(
        lens,
        seed=rng.randint(0, 2**16),
        mm_width=rng.choice([None, None, 3]),
        chunked=chunked,
        next_prompt_token=None if chunked is None else rng.randint(0, 60_000),
        idle=rng.random() < 0.1,
        tails_dtype=rng.choice([torch.int64, torch.int32]),
    )


def _draft_difference(inputs, ours, stock, backport: bool) -> str | None:
    if isinstance(stock, type) or isinstance(ours, type):
        return None if ours is stock else f"raised {ours} where the mutant gives {stock}"
    if ours.input_ids.dtype != stock.input_ids.dtype:
        return f"input_ids {ours.input_ids.dtype} != {stock.input_ids.dtype}"
    if ours.input_ids_values.shape != stock.input_ids_values.shape or not torch.equal(
        ours.input_ids_values, stock.input_ids_values
    ):
        return "input_ids differ"
    for name in ("ids_in_place", "mm_in_place", "target_return_logprob", "stopped_at"):
        if getattr(ours, name) != getattr(stock, name):
            return f"{name}: {getattr(ours, name)} != {getattr(stock, name)}"
    # The backport's one intended change: the draft forward returns no logprob.
    expected = False if backport else stock.return_logprob
    if ours.return_logprob != expected:
        return f"the draft forward's return_logprob is {ours.return_logprob}, not {expected}"
    if (ours.mm_input_embeds is None) != (stock.mm_input_embeds is None):
        return "mm_input_embeds set on one side only"
    if stock.mm_input_embeds is not None:
        a, b = ours.mm_input_embeds, stock.mm_input_embeds
        if a.shape != b.shape:
            return f"mm_input_embeds {tuple(a.shape)} != {tuple(b.shape)}"
        rows = slice(None)
        if not stock.mm_in_place and inputs.lens:
            # A new tensor: the release leaves each request's last row unwritten.
            rows = torch.ones(b.shape[0], dtype=torch.bool)
            ends = torch.tensor(inputs.lens, dtype=torch.int64).cumsum(0) - 1
            rows[ends[ends < b.shape[0]]] = False
        if not torch.equal(a[rows], b[rows]):
            return "mm_input_embeds differ"
    return None


# --- the scheduler's prefill results ---------------------------------------------------------


def _prefill_trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
    from flatgather.sglang.patches import prefill_result

    result = prefill_result.PATCH.prepare(copy)
    trial = Trial(patched=prefill_result.FIX in result.applied, note="; ".join(result.notes))
    new = [p.new for p in result.swaps if p.name == prefill_result.METHOD]
    _compare_prefills(trial, copy, new[0] if new else None, mutant, release, inputs, cases)
    return trial


def _prefill_chained_trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
    """Up to 0.5.12 as installed: the #36938 fix's method, then the output
    chain's rebuild of it (its ``.tolist()`` loops replaced)."""
    from flatgather.sglang.patches import output_logprobs, prefill_result

    owner = prefill_result.owner_of(copy)
    result = prefill_result.PATCH.prepare(copy)
    fixed = [p.new for p in result.swaps if p.name == prefill_result.METHOD]
    shipped = vars(owner)[prefill_result.METHOD]
    if fixed:
        setattr(owner, prefill_result.METHOD, fixed[0])
    try:
        holder = types.SimpleNamespace(__name__=_MIXIN, **{owner.__name__: owner})
        chained = output_logprobs.CHAIN.prepare(holder)
    finally:
        setattr(owner, prefill_result.METHOD, shipped)
    rebuilt = [p.new for p in chained.swaps if p.name == prefill_result.METHOD]
    trial = Trial(patched=bool(fixed or rebuilt), note="; ".join([*result.notes, *chained.notes]))
    in_place = (rebuilt or fixed or [None])[0]
    _compare_prefills(trial, copy, in_place, mutant, release, inputs, cases, fixed=bool(fixed))
    return trial


_MIXIN = "sglang.srt.managers.scheduler_output_processor_mixin"


def _compare_prefills(trial, copy, in_place, mutant, release, inputs, cases, fixed=True) -> None:
    """``in_place`` (None: the mutant stays) against the mutant under the
    #36938 contract where the fix is in it (else the whole batch alike), and
    the mutant against the release on the same batches."""
    from flatgather.sglang.patches import prefill_result

    harness = prefill_result.Harness(prefill_result.owner_of(copy), copy)
    for n in tries(trial, cases, alone=in_place is None):
        rng = inputs.rng(n)
        specs = [_prefill_request(rng) for _ in range(rng.choice([1, 2, 3, 8, 24]))]
        return_logprob = rng.random() < 0.85
        trial.compared += 1
        release_runs = inputs.release(n, _prefill_runs, harness, release, specs, return_logprob)
        mutant_runs = _prefill_runs(harness, mutant, specs, return_logprob)
        trial.raised += any(isinstance(r, prefill_result.Raised) for r in mutant_runs)
        where = prefill_result.harness.describe(specs, return_logprob)
        trial.tell(_first_of(mutant_runs, release_runs), where)
        if in_place is None:
            continue
        if not fixed:
            got = harness.run(in_place, specs, return_logprob=return_logprob)
            found = first_difference(got, mutant_runs[0], "batch")
        else:
            # The contract flatgather changes on purpose (SGLang #36938): each
            # request gets what the mutant gives it without the skipped ones.
            found = prefill_result.compare_without_skipped(
                harness, in_place, mutant, specs, return_logprob
            )
            if found and found.startswith("the release's own method fails"):
                found = _where_the_mutant_raises(
                    trial, harness, in_place, mutant, specs, return_logprob
                )
        if found:
            trial.difference = f"{where}: {found}" if not found.startswith("on ") else found


def _prefill_runs(harness, function, specs, rl, skipped=None) -> tuple:
    """``function`` on the whole batch, and on the batch without the
    ``skipped`` requests (by default those marked so)."""
    if skipped is None:
        skipped = [k for k, s in enumerate(specs) if s.skipped]
    whole = harness.run(function, specs, return_logprob=rl)
    kept = [k for k in range(len(specs)) if k not in skipped]
    alone = harness.run(function, specs, kept, rl) if skipped else whole
    return whole, alone


def _first_of(mutant_runs, release_runs) -> str | None:
    names = ("whole batch", "without the skipped")
    for name, m, r in zip(names, mutant_runs, release_runs, strict=True):
        found = first_difference(m, r, name)
        if found:
            return found
    return None


def _where_the_mutant_raises(trial, harness, in_place, mutant, specs, rl) -> str | None:
    """flatgather's answer where the mutant raises on the batch or on it
    without its skipped requests: the same exception; where only the whole
    batch raises and flatgather answers, each kept request what the mutant
    gives it without the skipped ones, and the trial says what is left
    unchecked (the skipped requests' state)."""
    from flatgather.sglang.patches.prefill_result import Raised

    # The requests the mutant itself skips, as the contract's check finds them.
    whole, alone = _prefill_runs(harness, mutant, specs, rl, harness.skipped(mutant, specs))
    raised = {o.type for o in (whole, alone) if isinstance(o, Raised)}
    got = harness.run(in_place, specs, return_logprob=rl)
    if isinstance(got, Raised):
        return None if got.type in raised else f"raised {got.type}, the mutant {sorted(raised)}"
    if isinstance(alone, Raised):
        return f"answered where the mutant without the skipped requests raises {alone.type}"
    for k in alone:
        found = first_difference(got[k], alone[k], f"request {k}")
        if found:
            return found
    if not trial.unchecked:
        trial.unchecked = (
            f"the mutant raises {whole.type} on the whole batch only; flatgather gives each "
            "kept request what the mutant gives it without the skipped ones, and the skipped "
            "requests' state has nothing to be held to"
        )
    return None


def _prefill_request(rng: random.Random):
    from flatgather.sglang.patches.prefill_result import Request

    extend = rng.randint(1, 6)
    return Request(
        extend,
        rng.choice([0, extend, rng.randint(0, extend)]),
        return_logprob=rng.random() < 0.8,
        top=rng.choice([0, 0, 1, 2]),
        token_ids=rng.random() < 0.5,
        middle_chunk=rng.random() < 0.15,
        skipped=rng.choice([None, None, None, "retracted", "finished"]),
    )


# --- _get_pruned_states ----------------------------------------------------------------------


def _pruned_trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
    import flatgather.sglang as fs
    from sglang.srt.layers import logits_processor as lp

    cls = lp.LogitsProcessor
    shipped = vars(cls)["_get_pruned_states"]
    cls._get_pruned_states = mutant
    try:
        try:
            with _shape_gate():
                fs.install(input_logprobs=False, output_logprobs=False)
        except fs.UnsupportedRelease as exc:
            trial = Trial(patched=False, note=str(exc))
        else:
            try:
                in_place = vars(cls)["_get_pruned_states"]
                trial = Trial(patched=in_place is not mutant)
                if trial.patched:
                    _compare_pruned(trial, in_place, mutant, release, inputs, cases)
                    return trial
            finally:
                fs.uninstall()
    finally:
        cls._get_pruned_states = shipped
    _compare_pruned(trial, None, mutant, release, inputs, cases)
    return trial


def _compare_pruned(trial: Trial, ours, mutant, release, inputs: Inputs, cases: int) -> None:
    """``ours`` (None: the mutant stays) against the mutant, and the mutant
    against the release, on the same batches."""
    from flatgather.sglang.unpinned import unpinned_without_cuda

    for n in tries(trial, cases, alone=ours is None):
        batch = _PrunedBatch.draw(inputs.rng(n))
        states = batch.states(layers=2)
        with unpinned_without_cuda():
            # Each side on states of its own: a mutant may write into them.
            fresh = batch.states(layers=2)
            base = inputs.release(n, _pruned_call, release, fresh, batch.metadata())
            want, wrote = _pruned_call(mutant, batch.states(layers=2), batch.metadata())
        trial.compared += 1
        trial.raised += isinstance(want, type)
        trial.tell(first_difference((want, wrote), base, "result"), batch.where)
        if ours is None:
            continue
        got, got_wrote = _pruned_call(ours, states, batch.metadata())
        found = first_difference(got_wrote, wrote, "logits_metadata")
        if found:
            trial.difference = f"{batch.where}: {found}"
            return
        if (
            isinstance(want, tuple)
            and want[2] is None
            and isinstance(states[2], list)
            and isinstance(got, tuple)
        ):
            # Where the mutant drops list aux layers, flatgather backports
            # SGLang PR #21589: each layer pruned as the mutant prunes hidden states.
            with unpinned_without_cuda():
                fixed = [
                    _outcome(mutant, None, layer, None, None, batch.metadata("NULL"))
                    for layer in states[2]
                ]
            fixed = [f[0] if isinstance(f, tuple) else f for f in fixed]
            want = (*want[:2], fixed, *want[3:])
        found = first_difference(got, want, "result")
        if found:
            trial.difference = f"{batch.where}: {found}"


def _pruned_call(fn, states, md) -> tuple:
    """``fn``'s outcome, and the metadata's fields after it: the release
    writes the index sets it computed there (``sample_indices_cpu`` and the
    like), which the logits processor reads next."""
    outcome = _outcome(fn, None, *states, md)
    return outcome, {f.name: getattr(md, f.name) for f in dataclasses.fields(md)}


# --- _get_hidden_states_to_store, under lazy aux pruning --------------------------------------


def _store_trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
    """Lazy aux pruning hands the release's store an aux result that holds
    only the rows flatgather proved it reads; a store that reads others
    must turn lazy aux off."""
    import flatgather.sglang as fs
    from flatgather.sglang import installer
    from sglang.srt.layers import logits_processor as lp

    cls = lp.LogitsProcessor
    shipped = vars(cls)["_get_hidden_states_to_store"]
    stock_pruned = vars(cls)["_get_pruned_states"]
    sides = [None, None, stock_pruned, mutant, release, None]
    cls._get_hidden_states_to_store = mutant
    try:
        try:
            with _shape_gate():
                report = fs.install(input_logprobs=False, output_logprobs=False)
        except fs.UnsupportedRelease as exc:
            trial = Trial(patched=False, note=str(exc))
        else:
            try:
                trial = Trial(patched=report.lazy_aux, note="; ".join(report.notes))
                if trial.patched:
                    sides[0] = vars(cls)["_get_pruned_states"]
                    sides[1] = vars(cls)["_get_hidden_states_to_store"]
                    (pruning,) = [s for s in installer.in_service() if isinstance(s, Pruning)]
                    sides[5] = pruning.gate
                    _compare_stores(trial, sides, inputs, cases)
                    return trial
            finally:
                fs.uninstall()
    finally:
        cls._get_hidden_states_to_store = shipped
    _compare_stores(trial, sides, inputs, cases)
    return trial


def _compare_stores(trial: Trial, sides, inputs: Inputs, cases: int) -> None:
    """flatgather's pruning and store (when lazy aux is on) against the
    release's pruning and the mutant store, and the mutant store against the
    release's, on the same batches."""
    from flatgather.sglang.patches.pruned_states import LazyAuxPruned, lazy_scope
    from sglang.srt.layers import logits_processor as lp

    pruned, store, stock_pruned, mutant, release, gate = sides
    # Lazy aux pruning applies to a processor whose class's store is the
    # installed one, as in a real forward.
    processor = object.__new__(lp.LogitsProcessor)
    for n in tries(trial, cases, alone=store is None):
        rng = inputs.rng(n)
        batch = _PrunedBatch.draw(rng, store=True)
        layers = rng.randint(1, 3)
        where = batch.where
        # Each side on states of its own: a mutant may write into them.
        fresh = batch.states(layers)
        base = inputs.release(n, _stock_store, stock_pruned, release, batch, *fresh)
        want = _stock_store(stock_pruned, mutant, batch, *batch.states(layers))
        trial.compared += 1
        trial.raised += isinstance(want, type)
        h, b, aux = batch.states(layers)
        trial.tell(first_difference(want, base, "stored"), where)
        if store is None:
            continue
        md = batch.metadata()
        with lazy_scope(gate):
            result = _outcome(pruned, processor, h, b, aux, md)
            trial.reached = (trial.reached or 0) + (
                isinstance(result, tuple) and type(result[2]) is LazyAuxPruned
            )
            got = (
                result
                if isinstance(result, type)
                else _outcome(store, processor, h, b, aux, *result[:4], md)
            )
        found = first_difference(got, want, "stored")
        if found:
            trial.difference = f"{where}: {found}"


def _stock_store(stock_pruned, store, batch, h, b, aux):
    """The release's pruning, then ``store``, on fresh metadata."""
    from flatgather.sglang.unpinned import unpinned_without_cuda

    md = batch.metadata()
    with unpinned_without_cuda():
        result = _outcome(stock_pruned, None, h, b, aux, md)
        if isinstance(result, tuple) and result[2] is None and isinstance(aux, list):
            layers = [stock_pruned(None, a, None, None, batch.metadata("NULL"))[0] for a in aux]
            result = (*result[:2], layers, *result[3:])
    if isinstance(result, type):
        return result
    return _outcome(store, None, h, b, aux, *result[:4], md)


def _lengths(rng: random.Random) -> tuple[list[int], list[int]]:
    b = rng.choice([1, 2, 3, rng.randint(1, 12), rng.randint(1, 12), rng.randint(1, 64)])
    extend = [rng.choice([1, 2, 3, rng.randint(1, 80)]) for _ in range(b)]
    start = [rng.choice([0, 1, e - 1, e, rng.randint(0, e)]) for e in extend]
    return extend, start


def _aux_kinds(store: bool) -> list[str]:
    """Aux layers as a forward hands them on: a model without them has None
    (never an empty list) at the store, and only a release that packs them
    (``pack_aux_hidden_states``) stores a packed tensor."""
    from sglang.srt.layers import logits_processor as lp

    if not store:
        return ["list", "list", "list", "packed", "none", "empty"]
    packs = "pack_aux_hidden_states" in vars(lp)
    return ["list", "list", "none", "none"] + (["packed"] if packs else [])


_OTHER_MODES = ("DECODE", "IDLE", "TARGET_VERIFY", "DRAFT_EXTEND", "DRAFT_EXTEND_V2", "MIXED")


@dataclass
class _PrunedBatch:
    """One forward's batch as the logits processor's pruning sees it: a
    prefill with input logprobs most often, else one without, or a decode,
    verify or draft-extend step (with or without the draft-extend graph's
    selected rows, where the release has them); the aux layers as a list, a
    packed tensor, an empty list or None."""

    extend: list[int]
    start: list[int]
    capture: str
    mode: str | None
    logprob: bool
    select: list[int] | None
    aux: str
    before_norm: bool
    seed: int
    padded: int | None = None

    @classmethod
    def draw(cls, rng: random.Random, store: bool = False) -> _PrunedBatch:
        """``store``: a batch whose aux layers a forward hands the store (a
        model without them has None, never an empty list)."""
        from sglang.srt.layers.logits_processor import LogitsMetadata
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        extend, start = _lengths(rng)
        mode, logprob, select = None, True, None
        kind, padded = rng.random(), None
        if kind < 0.15:
            logprob = False
            fields = getattr(LogitsMetadata, "__dataclass_fields__", {})
            if "padded_static_len" in fields and rng.random() < 0.5:
                # Each request's rows padded to one static length (0.5.10's graphs).
                padded = max(extend) + rng.randint(0, 3)
        elif kind < 0.35:
            mode = rng.choice([m for m in _OTHER_MODES if hasattr(ForwardMode, m)])
            fields = getattr(LogitsMetadata, "__dataclass_fields__", {})
            if "draft_extend_select_index" in fields and rng.random() < 0.5:
                rows = sum(extend)
                select = sorted(rng.sample(range(rows), rng.randint(1, rows)))
        return cls(
            extend,
            start,
            rng.choice(["NULL", "LAST", "FULL"]),
            mode,
            logprob,
            select,
            # The store's LAST capture keeps the rows it returns apart only
            # without aux layers and before-norm states: drawn as often.
            rng.choice(_aux_kinds(store)),
            rng.random() < (0.5 if store else 0.7),
            rng.randint(0, 2**16),
            padded,
        )

    @property
    def where(self) -> str:
        mode = self.mode or ("EXTEND" if self.logprob else "EXTEND without logprobs")
        extra = f" select {self.select}" if self.select is not None else ""
        extra += f" padded to {self.padded}" if self.padded is not None else ""
        return (
            f"{mode} extend {self.extend} start {self.start} {self.capture}{extra}, "
            f"aux {self.aux}{'' if self.before_norm else ', no before-norm'}"
        )

    def states(self, layers: int):
        from flatgather.bench.batches import make_states

        aux = "empty-list" if self.aux == "empty" else self.aux
        rows = self.extend if self.padded is None else [self.padded] * len(self.extend)
        return make_states(rows, self.seed, torch.float32, 4, self.before_norm, aux, layers, 0)

    def metadata(self, capture: str | None = None):
        from flatgather.bench.batches import metadata
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        mode = None if self.mode is None else getattr(ForwardMode, self.mode)
        extra = {}
        if self.select is not None:
            extra["draft_extend_select_index"] = torch.tensor(self.select, dtype=torch.int64)
        if self.padded is not None:
            extra["padded_static_len"] = self.padded
        md = metadata(self.extend, self.start, capture or self.capture, mode, **extra)
        md.extend_return_logprob = self.logprob
        return md


# --- the output-logprob chain's consumers ----------------------------------------------------


def _chain_trial(stage: str, module_name: str, compare=None):
    """``stage``: the chain's key for the method (``copy_to_cpu``,
    ``normalize`` for the scheduler's ``_normalize_decode_outputs``, or a
    name of a method no stage of :mod:`flatgather.bench.spec_chain` runs:
    ``compare`` then drives it). The stages work together, so whatever
    flatgather does with the mutant, it runs with flatgather's other stages
    installed, as on a server, against the release's chain with the mutant
    in its place."""

    def trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
        import flatgather.sglang as fs
        from flatgather.bench import spec_chain as sc
        from flatgather.sglang.patches import output_logprobs

        chain = sc.find()
        real = {
            "copy_to_cpu": chain.result_cls,
            "normalize": chain.processor,
            "move_logprobs_to_cpu": chain.processor,
        }.get(stage)
        if real is None:  # up to 0.5.12: the mixin
            real = importlib.import_module(module_name).SchedulerOutputProcessorMixin
        owner = getattr(copy, real.__name__)
        holder = types.SimpleNamespace(__name__=module_name, **{real.__name__: owner})
        result = output_logprobs.CHAIN.prepare(holder)
        ours = [p.new for p in result.swaps if p.name == mutant.__name__]
        trial = Trial(patched=bool(ours), note="; ".join(result.notes))
        in_place = ours[0] if ours else mutant
        saved = chain.stock.get(stage)
        fs.install(input_logprobs=False)
        try:
            installed = vars(real)[mutant.__name__]
            setattr(real, mutant.__name__, in_place)
            try:
                with sc.emulated_copies():
                    if compare is not None:
                        compare(trial, sc, chain, mutant, release, inputs, cases)
                        return trial
                    sides = {"mutant": mutant, "release": release}
                    _compare_chains(trial, sc, chain, stage, sides, inputs, cases)
            finally:
                setattr(real, mutant.__name__, installed)
        finally:
            fs.uninstall()
            if saved is not None:
                chain.stock[stage] = saved
        return trial

    return trial


def _chain_step(sc, rng: random.Random, vocab: int, positions: int = 8):
    b, a = rng.randint(1, 24), rng.randint(1, positions)
    top = [rng.choice([0, 0, 1, 3, 20]) for _ in range(b)]
    if rng.random() < 0.2:
        ids = [None] * b
    else:
        ids = [[rng.randint(-vocab, vocab - 1) for _ in range(rng.randint(0, 5))] for _ in range(b)]
    accept = [rng.randint(1, a) for _ in range(b)]
    dtype = rng.choice([torch.float32, torch.bfloat16])
    step = sc.make_step(b, a, top, ids, accept, vocab=vocab, dtype=dtype, seed=rng.randint(0, 999))
    return step, f"{b} requests x {a} positions, top {top}"


def _versus(got, want, difference) -> str | None:
    """Outcomes compared: the same exception (by type), or the same lists."""
    if isinstance(want, type) or isinstance(got, type):
        return None if got is want else f"raised {got}, the mutant {want}"
    return difference(got, want)


def _compare_chains(trial: Trial, sc, chain, stage, sides, inputs: Inputs, cases: int) -> None:
    from flatgather.sglang.patches.output_logprobs import difference

    for n in tries(trial, cases, alone=False):
        step, where = _chain_step(sc, inputs.rng(n), 48)
        chain.stock[stage] = sides["release"]
        base = inputs.release(n, _outcome, sc.run, step, True)
        chain.stock[stage] = sides["mutant"]
        want = _outcome(sc.run, step, True)
        got = _outcome(sc.run, step, False)
        trial.compared += 1
        trial.raised += isinstance(want, type)
        trial.tell(_versus(want, base, difference), where)
        found = _versus(got, want, difference)
        if found:
            trial.difference = f"{where}: {found}"


_MOVED = (
    "next_token_logprobs",
    "input_token_logprobs",
    "next_token_top_logprobs_val",
    "next_token_top_logprobs_idx",
    "next_token_token_ids_logprobs_val",
    "next_token_token_ids_logprobs_idx",
    "input_top_logprobs_val",
    "input_top_logprobs_idx",
    "input_token_ids_logprobs_val",
)


def _moved(sc, chain, method, step, stock: bool, how: dict) -> dict | type:
    """Stages 1 and 2 (the release's, or what is installed), then ``method``
    (``move_logprobs_to_cpu``, the prefill's stage 3) on their output, with
    the input logprobs a prefill also hands it: every list it leaves."""
    one, two, _, state = sc.stages(chain, step, stock)
    one()
    if how["copy"]:
        two()
    lo = state["result"].logits_output
    if how["input"] is not None:
        lo.input_token_logprobs = how["input"].clone()
    if how["no next"]:
        lo.next_token_logprobs = None
    if how["borrowed"] is not None and hasattr(lo, "finalize_input_logprobs"):
        # Input logprobs borrowed from a device copy: per request, spans of rows.
        lo.input_logprobs_copy_done = sc._Event()
        lo.input_top_logprobs_val = [[t.clone() for t in spans] for spans in how["borrowed"]]
        lo.input_top_logprobs_idx = [[t.clone() for t in spans] for spans in how["borrowed"]]
    batch = types.SimpleNamespace(return_logprob=how["return_logprob"])
    try:
        with torch.inference_mode():
            method(None, batch=batch, logits_output=lo)
    except Exception as exc:  # compared by type: the same failure, or none
        return type(exc)
    moved = {name: getattr(lo, name, None) for name in _MOVED}
    moved["input copy pending"] = getattr(lo, "input_logprobs_copy_done", None) is not None
    return moved


def _randn(rng: random.Random, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(rng.randint(0, 2**16)))


def _compare_moves(trial, sc, chain, mutant, release, inputs: Inputs, cases: int) -> None:
    from flatgather.sglang.patches.output_logprobs import difference

    in_place = vars(chain.processor)[mutant.__name__]
    for n in tries(trial, cases, alone=False):
        rng = inputs.rng(n)
        step, where = _chain_step(sc, rng, 48, positions=rng.choice([1, 1, 4]))
        how = {
            "copy": rng.random() < 0.7,
            "input": None if rng.random() < 0.5 else _randn(rng, rng.randint(0, 9)),
            "no next": rng.random() < 0.15,
            "return_logprob": rng.random() < 0.85,
            "borrowed": None,
        }
        if rng.random() < 0.3:
            how["borrowed"] = [
                [_randn(rng, rng.randint(1, 3)).view(-1, 1) for _ in range(rng.randint(0, 2))]
                for _ in range(rng.randint(1, 4))
            ]
        base = inputs.release(n, _moved, sc, chain, release, step, True, how)
        want = _moved(sc, chain, mutant, step, True, how)
        got = _moved(sc, chain, in_place, step, False, how)
        trial.compared += 1
        trial.raised += isinstance(want, type)
        where = f"{where}, {how}"
        trial.tell(_versus(want, base, difference), where)
        found = _versus(got, want, difference)
        if found:
            trial.difference = f"{where}: {found}"


def _compare_decodes(trial, sc, chain, mutant, release, inputs: Inputs, cases: int) -> None:
    """Up to 0.5.12 stage 3 is the mixin's ``process_batch_result_decode``,
    driven as ``tests/test_spec_logprobs.py`` drives it (the chain's real
    stages 1 and 2, stand-ins for the scheduler, the batch and its
    requests, retracted and finished ones among them)."""
    from flatgather.sglang.patches.output_logprobs import difference
    from test_spec_logprobs import _decode_result

    owner = importlib.import_module(_MIXIN).SchedulerOutputProcessorMixin
    in_place = vars(owner)[mutant.__name__]
    for n in tries(trial, cases, alone=False):
        rng = inputs.rng(n)
        spec = rng.random() < 0.7
        step, where = _chain_step(sc, rng, 48, positions=8 if spec else 1)
        skipped = {
            i: rng.choice(["retracted", "finished"]) for i in range(step.B) if rng.random() < 0.2
        }
        where = f"{where}{' (spec v2)' if spec else ''}, skipped {skipped}"
        base = inputs.release(n, _decode_result, release, step, True, spec, skipped)
        want = _decode_result(mutant, step, True, spec, skipped)
        got = _decode_result(in_place, step, False, spec, skipped)
        for side in (want, base, got):
            side.pop("flat", None)
        trial.compared += 1
        trial.raised += "raised" in want
        trial.tell(difference(want, base), where)
        found = difference(got, want)
        if found:
            trial.difference = f"{where}: {found}"


@contextlib.contextmanager
def _shape_gate():
    if SHAPE_GATE:
        yield
        return
    from flatgather.sglang import shapes

    known = shapes.known

    def anything(where, owner, name):
        try:
            return known(where, owner, name)
        except shapes.UnknownShape:
            return next(iter(shapes.KNOWN[where]))

    shapes.known = anything
    try:
        yield
    finally:
        shapes.known = known


# --- the functions replaced whole behind their side-by-side checks -------------------------


def _replaced_whole_trial(prepare):
    def trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
        with _shape_gate():
            result = prepare(copy)
        ours = [p for p in result.swaps if p.name == mutant.__name__]
        # No oracle of its own here: a patched mutant counts as not shown exact.
        return Trial(patched=bool(ours), note="; ".join(result.notes))

    return trial


def _callee_trial(caller: str, prepare):
    """A helper of the module that a function replaced whole calls, mutated
    in a copy of the whole module: the caller is then a fork's."""

    def trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
        with _shape_gate():
            result = prepare(copy)
        ours = [p for p in result.swaps if p.name == caller]
        return Trial(patched=bool(ours), note="; ".join(result.notes))

    return trial


def _callees(function: types.FunctionType) -> list[str]:
    """The functions of ``function``'s own module that it calls by name."""
    import dis

    names, codes = set(), [function.__code__]
    while codes:  # the function's own code and that of the functions it defines
        code = codes.pop()
        names |= {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return sorted(
        n
        for n in names
        if isinstance(function.__globals__.get(n), types.FunctionType)
        and function.__globals__[n].__module__ == function.__module__
    )


def _outcome(function, *args):
    try:
        return function(*args)
    except Exception as exc:  # compared by type: the same failure, or none
        return type(exc)


def _raised(outcome) -> bool:
    """Whether the outcome is an exception's type (what :func:`_outcome`
    gives for a call that raised)."""
    return isinstance(outcome, type)


def _told(mutant, release) -> str | None:
    """The mutant's outcome against the release's: the same exception (by
    type), or the same tuples."""
    if isinstance(mutant, type) or isinstance(release, type):
        return None if mutant is release else f"the mutant gives {mutant}, the release {release}"
    return first_difference(mutant, release)


def _same_as(got, want) -> str | None:
    """flatgather's outcome against the mutant's: the same exception (by
    type), or the same objects."""
    return _versus(got, want, first_difference)


def _prepared(patch, copy, name: str, owner=None) -> tuple[Trial, Callable | None]:
    """``patch`` prepared on the module ``copy`` (the known-code gate as the
    run sets it): the trial that starts (patched or not, with the patch's
    notes) and what the patch put in place of ``name`` on ``owner`` (the
    copy itself where None), or None where it refused it."""
    with _shape_gate():
        result = patch.prepare(copy)
    target = copy if owner is None else owner
    new = [s.new for s in result.swaps if s.name == name and s.target is target]
    return Trial(patched=bool(new), note="; ".join(result.notes)), (new[0] if new else None)


def _judge_calls(
    trial: Trial,
    inputs: Inputs,
    cases: int,
    sides,
    draw,
    outcome,
    *,
    raised=_raised,
    told=_told,
    versus=_same_as,
) -> Trial:
    """The loop of the trials whose target is called directly (the output
    producers, the token-id input logprobs, the front end, the OpenAI
    layer). ``sides`` is the release's
    function, the mutant and what the patch put in place (None where it
    refused the mutant). For each input number, ``draw(n)`` gives where the
    input is told (for the report) and a function that makes the call's
    arguments, anew for each side; ``outcome(function, *arguments)`` is
    what a side answers. Each input gives the release's outcome (once for
    all the target's mutants), the mutant's, whether ``told`` tells them
    apart and whether the mutant ``raised``; then, where the patch took the
    mutant, whether ``versus`` finds flatgather's answer unlike the
    mutant's (a silent difference, the first one kept). By default an
    outcome is what :func:`_outcome` gives: a value, or the type raised."""
    release, mutant, ours = sides
    for n in tries(trial, cases, alone=ours is None):
        where, arguments = draw(n)
        base = inputs.release(n, outcome, release, *arguments())
        theirs = outcome(mutant, *arguments())
        trial.compared += 1
        trial.raised += raised(theirs)
        trial.tell(told(theirs, base), where)
        if ours is not None:
            found = versus(outcome(ours, *arguments()), theirs)
            if found:
                trial.difference = f"{where}: {found}"
    return trial


# --- the output producers (get_top_logprobs, get_token_ids_logprobs) ----------------------


def _producer_trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
    """The mutant in a copy of its whole module; what the patch puts in
    place there is called on the same logprobs and lists. Each input is
    answered as the decode chain reads it (``no_copy_to_cpu``, then the
    chain's host copy and ``.tolist()`` per row, as the patch's own check
    compares) and as the other callers read it (lists at once)."""
    from flatgather.sglang.patches.output_logprobs import PRODUCER, producers

    trial, ours = _prepared(PRODUCER, copy, mutant.__name__)

    def outcome(fn, call):
        at_once = _outcome(fn, call.logprobs, copy_module.deepcopy(call.arg), False)
        return {"chain": producers.answer(fn, call), "lists": at_once}

    def draw(n):
        def call():
            """Input ``n``, made anew for each side: a side may change the
            lists it is given."""
            return (_producer_call(inputs.rng(n), mutant.__name__),)

        (shown,) = call()
        where = f"{shown.name}({shown.arg}), {shown.logprobs.shape[0]} rows, {shown.logprobs.dtype}"
        return where, call

    return _judge_calls(
        trial,
        inputs,
        cases,
        (release, mutant, ours),
        draw,
        outcome,
        raised=lambda out: "raised" in out["chain"],
        told=producers.difference,
        versus=producers.difference,
    )


def _producer_call(rng: random.Random, name: str):
    """One call: 1 to 8 rows of logprobs over 2 to 79 ids, in float32 or
    bfloat16, for as many requests as rows or fewer (the rest padding);
    top-k numbers from 0 to the vocabulary, at times past it or negative;
    id lists (or None, or empty) of ids from either end of the vocabulary,
    repeated at times, at times one past it or a tuple."""
    from flatgather.sglang.patches.output_logprobs import producers
    from flatgather.sglang.patches.output_logprobs import runtime as flat_logprobs

    rows, vocab = rng.randrange(1, 9), rng.choice((rng.randrange(2, 31), rng.randrange(30, 80)))
    dtype = rng.choice((torch.float32, torch.bfloat16))
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    logprobs = (torch.randn(rows, vocab, generator=gen) * 4).to(dtype)
    asked = rng.randrange(1, rows + 1)

    def top() -> int:
        roll = rng.random()
        if roll < 0.05:
            return vocab + 1
        if roll < 0.1:
            return -1
        return rng.choice((0, 1, 2, rng.randrange(vocab + 1), vocab))

    def ids():
        roll = rng.random()
        if roll < 0.2:
            return None
        if roll < 0.3:
            return []
        made = [rng.randrange(-vocab, vocab) for _ in range(rng.randrange(1, 6))]
        if rng.random() < 0.2:
            made.append(made[0])
        if rng.random() < 0.03:
            made.append(vocab)
        return tuple(made) if rng.random() < 0.05 else made

    arg = [top() if name == flat_logprobs.TOP else ids() for _ in range(asked)]
    return producers.ProducerCall(name, logprobs, arg, True)


# --- the token-id input logprobs (get_token_ids_logprobs_chunk, _prefill) ----------------


def _token_ids_trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
    """The mutant in a copy of its whole module; what the patch puts in
    place there (either walk, as its check chose) is called on the same
    chunk: what each returns or raises, and the output lists it leaves, the
    id lists named by the request they belong to (the patch's own check's
    comparison)."""
    from flatgather.sglang.patches import input_logprobs
    from flatgather.sglang.patches.input_logprobs import check

    trial, ours = _prepared(input_logprobs.PATCH, copy, mutant.__name__)
    chunk = mutant.__name__ == input_logprobs.CHUNK
    code = release.__code__
    keywords = set(code.co_varnames[: code.co_argcount])

    def draw(n):
        def call():
            """Input ``n``, made anew for each side: a side appends to its lists."""
            return (_token_ids_call(inputs.rng(n), keywords, chunk),)

        (shown,) = call()
        return f"{mutant.__name__} {check.where(shown)}", call

    return _judge_calls(
        trial,
        inputs,
        cases,
        (release, mutant, ours),
        draw,
        lambda function, call: check.answer(function, call, chunk),
        raised=lambda out: "raised" in out,
    )


def _token_ids_call(rng: random.Random, keywords: set[str], chunk: bool):
    """One call: 1 to 12 requests of 0 to 8 rows each (one of -1 at times, as
    the patch's own check has), their ids None (for the whole-batch function
    mostly where a request has no rows), empty or up to 4 from either end of
    the vocabulary (one past it at times); for the chunk function, as many
    rows as the requests hold or fewer (the chunk ends inside one), none, or
    more (rows to spare), the first request continued from an earlier chunk
    at times, raw logits with a normalizer and the pinned path where the
    release takes them; float32 or bfloat16."""
    from flatgather.sglang.patches.input_logprobs import check

    vocab = check.VOCAB
    n = rng.randrange(1, 13)
    lens = [rng.choice((0, 1, 1, 2, 3, 5, 8)) for _ in range(n)]
    if rng.random() < 0.2:
        lens[rng.randrange(n)] = -1

    def ids(rows: int):
        # The whole-batch function fails on a request of rows without ids
        # (the release's own error): there, mostly the requests of none.
        roll = rng.random()
        if roll < (0.2 if chunk else 0.4 if rows <= 0 else 0.03):
            return None
        if roll < 0.5 and rng.random() < 0.2:
            return []
        made = [rng.randrange(-vocab, vocab) for _ in range(rng.randrange(1, 5))]
        if rng.random() < 0.03:
            made.append(vocab)
        return made

    id_lists = [ids(rows) for rows in lens]
    total = max(sum(lens), 0)
    rows, split, normalizer, pinned = total, 0, None, False
    if chunk:
        rows = rng.choice((total, total, 0, max(total - 1, 0), total // 2, total + 2))
        split = rng.choice((0, 0, 1, 2)) if lens[0] > 2 else 0
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(
        rng.choice((torch.float32, torch.bfloat16))
    )
    if chunk and "log_normalizer" in keywords and rng.random() < 0.5:
        x = logits.float()
        row_max = x.amax(dim=-1) if rows else x.new_zeros(0)
        normalizer = (row_max, torch.logsumexp(x - row_max[:, None], dim=-1))
    if chunk and "copy_to_pinned_cpu" in keywords:
        pinned = rng.random() < 0.5
    return check.Call(logits, id_lists, lens, split, normalizer, pinned, gathers=True)


# --- the front end's logprob tuples ----------------------------------------------------------


@functools.cache
def _front_end_tokenizer():
    """The engine tests' byte-level tokenizer, a ``transformers`` one (the
    kind whose texts flatgather decodes itself)."""
    import tempfile

    from engine import models
    from transformers import AutoTokenizer

    where = Path(tempfile.mkdtemp(prefix="flatgather-mutation-tokenizer-"))
    return AutoTokenizer.from_pretrained(str(models.make_tokenizer(where)))


def _front_end_trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
    """The mutant in a class of its own, beside the release's other
    function (the top function calls the one-position one); what the patch
    puts in place is called on the same manager as the mutant."""
    from flatgather.sglang.patches import front_end
    from flatgather.sglang.patches.front_end import runtime
    from flatgather.sglang.patching import release_function

    real = importlib.import_module(front_end.MODULES[0]).TokenizerManager
    owner = getattr(copy, front_end.OWNER)
    one = release_function(real, runtime.ONE)
    if mutant.__name__ == runtime.TOP:
        owner.detokenize_logprob_tokens = one
    trial, ours = _prepared(front_end.PATCH, copy, mutant.__name__, owner)

    class Manager:
        detokenize_logprob_tokens = one

    top = mutant.__name__ == runtime.TOP

    def draw(n):
        rng = inputs.rng(n)
        manager = Manager()
        # At times no tokenizer (a server started with skip_tokenizer_init).
        manager.tokenizer = _front_end_tokenizer() if rng.random() < 0.85 else None
        args = _front_end_inputs(rng, top)
        where = (
            f"values {args[0]}, ids {args[1]}, texts {args[2]}"
            f"{'' if manager.tokenizer else ', no tokenizer'}"
        )
        return where, lambda: (manager, *args)

    return _judge_calls(
        trial,
        inputs,
        cases,
        (release, mutant, ours),
        draw,
        _outcome,
    )


def _front_end_inputs(rng: random.Random, top: bool) -> tuple[list, list, bool]:
    """One call: values and ids (at times more ids than values, ids
    repeated), with texts or not; for the top function, a list of positions,
    some without values."""
    from engine import models

    def position(k: int) -> tuple[list, list]:
        vals = [rng.choice((-0.0, rng.uniform(-20.0, 0.0))) for _ in range(k)]
        pool = [rng.randrange(models.VOCAB) for _ in range(max(1, k))]
        ids = [rng.choice(pool) for _ in range(k + (rng.random() < 0.2))]
        return vals, ids

    text = rng.random() < 0.6
    if not top:
        vals, ids = position(rng.randrange(0, 9))
        return vals, ids, text
    positions = [position(rng.choice((0, 0, 1, 2, 5))) for _ in range(rng.randrange(0, 7))]
    return [p[0] for p in positions], [p[1] for p in positions], text


def _openai_trial(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
    """The mutant in a copy of its whole module (from 0.5.21 it calls the
    module's ``_lossless_token_text``); what the patch puts in place there
    is called on the same tuples, with the same tokenizer or none."""
    from flatgather.sglang.patches import openai_logprobs
    from flatgather.sglang.patches.openai_logprobs import runtime

    # The module's state as it was made, before the patch's checks run it.
    started = {name: vars(copy)[name] for name in OPENAI_CACHES if name in vars(copy)}
    trial, ours = _prepared(openai_logprobs.PATCH, copy, mutant.__name__)
    lossless = runtime.takes_tokenizer(release)

    def fresh(function, module=None):
        """``function``, its module's state (``module``: the one it was
        defined in) put back as it was made, its caches empty, as in a
        newly started server."""
        scope = function.__globals__ if module is None else vars(module)
        for name, value in started.items():
            scope[name] = type(value)(value)
        return function

    def outcome(function, *args):
        # flatgather's function lives in flatgather's module: the state put
        # back is the copy's, whose helpers it calls.
        return _outcome_object(fresh(function, copy if function is ours else None), *args)

    def draw(n):
        rng = inputs.rng(n)
        if n == 0 and lossless:
            tokenizer, args = _every_byte(rng)
        else:
            tokenizer = _openai_tokenizer(n) if lossless else None
            args = _openai_inputs(rng, tokenizer)
        where = f"to_openai_style_logprobs{args[:4]!r}, {_named(tokenizer)}"
        if lossless:
            args = (*args, tokenizer)
        return where, lambda: args

    return _judge_calls(
        trial,
        inputs,
        cases,
        (release, mutant, ours),
        draw,
        outcome,
    )


OPENAI_CACHES = ("_BYTE_DECODER", "_BYTE_LEVEL_TOKENIZERS")
"""The OpenAI module's state (0.5.21+): the byte decoder, built on first
use, and the ids of the tokenizers found byte-level. Each input starts with
them as the module made them, so that an edit of how they fill is seen."""


def _every_byte(rng: random.Random) -> tuple:
    """The first input: every id of the stand-in whose pieces are each
    byte then 0xFF (never UTF-8, so each comes back as its bytes) and pieces
    of characters past the byte table, each with U+FFFD for its text."""
    from . import pieces

    tokenizer = pieces.every_byte()
    triples = [(-float(i), i, "\ufffd") for i in range(len(tokenizer.pieces))]
    rng.shuffle(triples)
    return tokenizer, (None, triples, None, None)


def _through(caller: str, trial: Callable[..., Trial]) -> Callable[..., Trial]:
    """The trial of a module's function that ``caller`` reaches, run on
    ``caller``: the mutant's is the copy's (it calls the edited function by
    name), the release's is that of the unedited copy."""

    def through(copy, mutant, release, inputs: Inputs, cases: int) -> Trial:
        return trial(copy, getattr(copy, caller), release.__globals__[caller], inputs, cases)

    return through


def _openai_tokenizer(n: int):
    """Input ``n``'s tokenizer, in turn: the tests' byte-level tokenizer,
    none, or one of the stand-ins of ``pieces`` (tokenizers the byte helpers
    read otherwise), so that each meets the mutant before its inputs run out."""
    from . import pieces

    return [_front_end_tokenizer(), None, *pieces.tokenizers()][n % (2 + len(pieces.tokenizers()))]


def _named(tokenizer) -> str:
    if tokenizer is None:
        return "no tokenizer"
    if tokenizer is _front_end_tokenizer():
        return "the tests' byte-level tokenizer"
    return repr(tokenizer)


def _outcome_object(function, *args):
    """The ``LogProbs`` object as its reader sees it (class, fields set at
    construction, every list, each top-k position's dict as its items in
    order: the order of its JSON), or the type of what was raised."""
    out = _outcome(function, *args)
    if isinstance(out, type):
        return out
    if not hasattr(out, "model_fields_set"):  # a mutant that returns something else
        return {"returned": out}
    fields = {
        name: [list(v.items()) if isinstance(v, dict) else v for v in value]
        if isinstance(value, list)
        else value
        for name, value in vars(out).items()
    }
    return {"class": type(out).__name__, "set": sorted(out.model_fields_set), **fields}


def _openai_inputs(rng: random.Random, tokenizer=None) -> tuple:
    """One call's four arguments: token tuples with ``None`` logprobs at
    times; top-k positions of 0 to 5 entries, ``None`` at times. Texts: for
    a stand-in tokenizer of ``pieces``, what :func:`pieces.text_for` draws
    (ids past its vocabulary and ``None`` ids at times); else texts the
    tests' byte-level tokenizer decoded (some U+FFFD fragments), ``None`` or
    U+FFFD at times."""
    from engine import models

    from . import pieces

    decoder = _front_end_tokenizer()
    stand_in = isinstance(tokenizer, pieces.PieceTokenizer)

    def triple() -> tuple:
        value = None if rng.random() < 0.05 else rng.uniform(-20.0, 0.0)
        if stand_in:
            token = None if rng.random() < 0.03 else rng.randrange(len(tokenizer.pieces) + 2)
            return (value, token, pieces.text_for(rng, tokenizer, token))
        token = rng.randrange(models.VOCAB)
        roll = rng.random()
        text = decoder.decode([token]) if roll < 0.8 else None if roll < 0.95 else "\ufffd"
        return (value, token, text)

    def tokens(most: int) -> list:
        return [triple() for _ in range(rng.randrange(0, most))]

    def tops() -> list:
        return [None if rng.random() < 0.15 else tokens(6) for _ in range(rng.randrange(0, 6))]

    return tuple(
        None if rng.random() < 0.2 else make()
        for make in (lambda: tokens(9), lambda: tokens(3), tops, tops)
    )


def _stand_ins() -> None:
    """The CPU stand-in for sgl_kernel, which the draft worker and the
    scheduler modules import; after logits_processor, which must not see it."""
    importlib.import_module("sglang.srt.layers.logits_processor")
    from flatgather.testing import install_sgl_kernel_stand_in

    install_sgl_kernel_stand_in()


def targets() -> list[Target]:
    """The patched functions of the running release that the suite mutates."""
    from flatgather.sglang import patches as rooms
    from flatgather.sglang.patches import (
        draft_prefill,
        input_logprobs,
        output_logprobs,
        prefill_result,
    )

    _stand_ins()
    replaced_whole = []
    # The ones with a trial of their own, against an oracle.
    own_trials = _openai_targets()
    own = {t.function for t in own_trials}
    # Every other function a patch replaces whole, as the patch declares it
    # (the code it vouches for by fingerprint), with that patch's own prepare();
    # the output producers and the helpers they call judged on the producer,
    # the token-id input-logprob functions on chunks, the others without an
    # oracle here.
    oracles = (
        (output_logprobs.PRODUCER, _producer_trial),
        (input_logprobs.PATCH, _token_ids_trial),
    )
    for patch in rooms.patches():
        oracle = next((trial for owner, trial in oracles if owner is patch), None)
        for known in patch.known:
            if known.owner is not None or known.imported:
                continue
            if known.key in own:
                continue
            located = fingerprints.release_function(known)
            if located is None:
                continue
            fn = located[1]
            replaced_whole.append(
                Target(
                    known.key,
                    fn.__module__,
                    None,
                    known.name,
                    oracle or _replaced_whole_trial(patch.prepare),
                    whole_function=oracle is None,
                    gated=True,
                    # A top-k past the vocabulary, an id past it, fewer rows
                    # than a request holds: the release's error.
                    release_raises=oracle is not None,
                )
            )
            replaced_whole += [
                Target(
                    f"{callee} (called by {known.name})",
                    fn.__module__,
                    None,
                    callee,
                    _through(known.name, oracle)
                    if oracle
                    else _callee_trial(known.name, patch.prepare),
                    whole_function=oracle is None,
                    gated=True,
                    release_raises=oracle is not None,
                    through=known.name,
                )
                for callee in _callees(fn)
                if callee not in own
            ]
    prefill_module = prefill_result.release_module().__name__
    owner = prefill_result.owner_of(importlib.import_module(prefill_module))
    return [
        Target(
            "LogitsProcessor._get_pruned_states",
            "sglang.srt.layers.logits_processor",
            "LogitsProcessor",
            "_get_pruned_states",
            _pruned_trial,
            whole_module=False,
            gated=True,
        ),
        Target(
            "LogitsProcessor._get_hidden_states_to_store",
            "sglang.srt.layers.logits_processor",
            "LogitsProcessor",
            "_get_hidden_states_to_store",
            _store_trial,
            whole_module=False,
            gated=True,
        ),
        Target(
            f"{draft_prefill.OWNER}.{draft_prefill.METHOD}",
            draft_prefill.MODULE,
            draft_prefill.OWNER,
            draft_prefill.METHOD,
            _draft_trial,
            whole_module=False,
        ),
        Target(
            f"{owner.__name__}.{prefill_result.METHOD}",
            prefill_module,
            owner.__name__,
            prefill_result.METHOD,
            _prefill_trial,
        ),
        *_chained_prefill(owner, prefill_module),
        *replaced_whole,
        *_chain_targets(),
        *_front_end_targets(),
        *own_trials,
    ]


def _front_end_targets() -> list[Target]:
    """The front end's two methods, replaced whole behind their known code,
    each mutated in a class of its own and compared with what the patch puts
    in place (the gate-off run)."""
    from flatgather.sglang.patches import front_end
    from flatgather.sglang.patches.front_end import runtime

    return [
        Target(
            f"{front_end.OWNER}.{name}",
            front_end.MODULES[0],
            front_end.OWNER,
            name,
            _front_end_trial,
            whole_module=False,
            gated=True,
            release_raises=True,
        )
        for name in (runtime.ONE, runtime.TOP)
    ]


def _openai_targets() -> list[Target]:
    """The OpenAI layer's ``to_openai_style_logprobs``, replaced whole
    behind its known code, mutated in a copy of its module and compared with
    what the patch puts in place there (the gate-off run); and each function
    of its module it reaches (from 0.5.21 ``_lossless_token_text`` and the
    byte helpers under it, whose answers the replacement takes as they
    are), mutated in a copy of the module and judged on the caller."""
    from flatgather.sglang.patches import openai_logprobs
    from flatgather.sglang.patches.openai_logprobs import runtime

    module = openai_logprobs.MODULES[0]
    caller = getattr(importlib.import_module(module), runtime.NAME)
    reached, todo = [], [caller]
    while todo:
        for name in _callees(todo.pop()):
            if name not in reached:
                reached.append(name)
                todo.append(caller.__globals__[name])
    judged = _through(runtime.NAME, _openai_trial)
    return [
        Target(runtime.NAME, module, None, runtime.NAME, _openai_trial, gated=True),
        *(
            Target(name, module, None, name, judged, gated=True, through=runtime.NAME)
            for name in reached
        ),
    ]


def _chained_prefill(owner: type, module: str) -> list[Target]:
    """Up to 0.5.12 the output chain rebuilds the method #36938 fixes (it
    holds ``.tolist()`` loops over the logprob lists): the two as installed."""
    from flatgather.sglang.patches import output_logprobs, prefill_result

    if prefill_result.METHOD not in output_logprobs.methods_with_loops(owner):
        return []
    return [
        Target(
            f"{owner.__name__}.{prefill_result.METHOD} (fixed, then the chain's)",
            module,
            owner.__name__,
            prefill_result.METHOD,
            _prefill_chained_trial,
        )
    ]


def _chain_targets() -> list[Target]:
    from flatgather.bench import spec_chain as sc

    chain = sc.find()
    found = [
        Target(
            "GenerationBatchResult.copy_to_cpu",
            sc.UTILS,
            "GenerationBatchResult",
            "copy_to_cpu",
            _chain_trial("copy_to_cpu", sc.UTILS),
            whole_module=False,
            always_compared=True,
        )
    ]
    if chain.processor is not None:
        found.append(
            Target(
                f"{chain.processor.__name__}._normalize_decode_outputs",
                sc.PROCESSOR,
                chain.processor.__name__,
                "_normalize_decode_outputs",
                _chain_trial("normalize", sc.PROCESSOR),
                whole_module=False,
                always_compared=True,
            )
        )
        found.append(
            Target(
                f"{chain.processor.__name__}.move_logprobs_to_cpu",
                sc.PROCESSOR,
                chain.processor.__name__,
                "move_logprobs_to_cpu",
                _chain_trial("move_logprobs_to_cpu", sc.PROCESSOR, _compare_moves),
                whole_module=False,
                always_compared=True,
            )
        )
    else:
        found.append(
            Target(
                "SchedulerOutputProcessorMixin.process_batch_result_decode",
                _MIXIN,
                "SchedulerOutputProcessorMixin",
                "process_batch_result_decode",
                _chain_trial("decode", _MIXIN, _compare_decodes),
                whole_module=False,
                always_compared=True,
            )
        )
    return found
