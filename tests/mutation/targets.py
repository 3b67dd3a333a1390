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
import importlib
import importlib.util
import itertools
import random
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from _modules import module_from_tree

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


@dataclass
class Target:
    name: str
    module: str
    owner: str | None
    function: str
    trial: Callable[[types.ModuleType, types.FunctionType, random.Random, int], Trial]
    """``trial(copy, mutant, rng, cases)``: install ``mutant`` (defined in
    the module ``copy``), judge it on ``cases`` random inputs, put back what
    was there."""
    whole_module: bool = True
    """The copy holds the whole release module (else its imports and the
    one class or function)."""
    always_compared: bool = False
    """What is in place runs with flatgather's other code even where the
    patch refuses the mutant (the stages of a chain): compared either way."""
    whole_function: bool = False
    """Replaced whole behind its known shape: the suite has no oracle for
    it, and any mutant patched counts as silently different."""


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


def _draft_trial(copy, mutant, rng: random.Random, cases: int) -> Trial:
    from flatgather.bench import draft_harness
    from flatgather.sglang.patches import draft_prefill

    result = draft_prefill.PATCH.prepare(copy)
    trial = Trial(patched=draft_prefill.ROTATION in result.applied, note="; ".join(result.notes))
    new = [p.new for p in result.swaps if p.name == draft_prefill.METHOD]
    if not new:
        return trial  # the mutant itself stays: nothing to tell apart
    (in_place,) = new
    backport = draft_prefill.BACKPORT in result.applied
    for _ in range(cases):
        inputs = _draft_inputs(rng)
        stock = _outcome(draft_harness.run, copy, inputs, mutant)
        ours = _outcome(draft_harness.run, copy, inputs, in_place)
        trial.compared += 1
        trial.raised += isinstance(stock, type)
        found = _draft_difference(inputs, ours, stock, backport)
        if found:
            trial.difference = f"lens {list(inputs.lens)}: {found}"
            break
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


def _prefill_trial(copy, mutant, rng: random.Random, cases: int) -> Trial:
    from flatgather.sglang.patches import prefill_result

    result = prefill_result.PATCH.prepare(copy)
    trial = Trial(patched=prefill_result.FIX in result.applied, note="; ".join(result.notes))
    new = [p.new for p in result.swaps if p.name == prefill_result.METHOD]
    if not new:
        return trial
    (in_place,) = new
    harness = prefill_result.Harness(prefill_result.owner_of(copy), copy)
    for _ in range(cases):
        specs = [_prefill_request(rng) for _ in range(rng.choice([1, 2, 3, 8, 24]))]
        return_logprob = rng.random() < 0.85
        trial.compared += 1
        # The contract flatgather changes on purpose (SGLang #36938): each
        # request gets what the mutant gives it without the skipped ones.
        found = prefill_result.compare_without_skipped(
            harness, in_place, mutant, specs, return_logprob
        )
        if found and found.startswith("the release's own method fails"):
            trial.raised += 1
        elif found:
            trial.difference = found
            break
    return trial


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


def _pruned_trial(copy, mutant, rng: random.Random, cases: int) -> Trial:
    import flatgather.sglang as fs
    from flatgather.sglang.patches.pruned_states import probe
    from sglang.srt.layers import logits_processor as lp

    cls = lp.LogitsProcessor
    shipped = vars(cls)["_get_pruned_states"]
    cls._get_pruned_states = mutant
    try:
        try:
            with _shape_gate():
                fs.install(input_logprobs=False, output_logprobs=False)
        except fs.UnsupportedRelease as exc:
            return Trial(patched=False, note=str(exc))
        try:
            in_place = vars(cls)["_get_pruned_states"]
            trial = Trial(patched=in_place is not mutant)
            if trial.patched:
                _compare_pruned(trial, in_place, mutant, rng, cases, probe)
            return trial
        finally:
            fs.uninstall()
    finally:
        cls._get_pruned_states = shipped


def _compare_pruned(trial: Trial, ours, mutant, rng: random.Random, cases: int, probe) -> None:
    from flatgather.bench.batches import make_states, metadata
    from flatgather.sglang.compare import first_difference
    from flatgather.sglang.unpinned import unpinned_without_cuda

    for _ in range(cases):
        extend, start = _lengths(rng)
        capture = rng.choice(["NULL", "LAST", "FULL"])
        states = make_states(extend, rng.randint(0, 2**16), torch.float32, 4, True, "list", 2, 0)
        got = _outcome(ours, None, *states, metadata(extend, start, capture))
        with unpinned_without_cuda():
            want = _outcome(mutant, None, *states, metadata(extend, start, capture))
        trial.compared += 1
        trial.raised += isinstance(want, type)
        if isinstance(want, tuple) and want[2] is None and isinstance(got, tuple):
            # Where the mutant drops list aux layers, flatgather backports
            # SGLang PR #21589: each layer pruned as the mutant prunes hidden states.
            with unpinned_without_cuda():
                fixed = [
                    _outcome(mutant, None, layer, None, None, metadata(extend, start))
                    for layer in states[2]
                ]
            fixed = [f[0] if isinstance(f, tuple) else f for f in fixed]
            want = (*want[:2], fixed, *want[3:])
        found = first_difference(got, want, "result")
        if found:
            trial.difference = f"extend {extend} start {start}: {found}"
            return


# --- _get_hidden_states_to_store, under lazy aux pruning --------------------------------------


def _store_trial(copy, mutant, rng: random.Random, cases: int) -> Trial:
    """Lazy aux pruning hands the release's store an aux result that holds
    only the rows flatgather proved it reads; a store that reads others
    must turn lazy aux off."""
    import flatgather.sglang as fs
    from flatgather.sglang import installer
    from sglang.srt.layers import logits_processor as lp

    cls = lp.LogitsProcessor
    shipped = vars(cls)["_get_hidden_states_to_store"]
    stock_pruned = vars(cls)["_get_pruned_states"]
    cls._get_hidden_states_to_store = mutant
    try:
        try:
            with _shape_gate():
                report = fs.install(input_logprobs=False, output_logprobs=False)
        except fs.UnsupportedRelease as exc:
            return Trial(patched=False, note=str(exc))
        try:
            trial = Trial(patched=report.lazy_aux, note="; ".join(report.notes))
            if trial.patched:
                pruned = vars(cls)["_get_pruned_states"]
                store = vars(cls)["_get_hidden_states_to_store"]
                sides = (
                    pruned,
                    store,
                    stock_pruned,
                    mutant,
                    installer._state.about("pruned-states").gate,
                )
                _compare_stores(trial, sides, rng, cases)
            return trial
        finally:
            fs.uninstall()
    finally:
        cls._get_hidden_states_to_store = shipped


def _compare_stores(trial: Trial, sides, rng: random.Random, cases: int) -> None:
    from flatgather.bench.batches import make_states, metadata
    from flatgather.sglang.compare import first_difference
    from flatgather.sglang.patches.pruned_states import LazyAuxPruned, lazy_scope
    from flatgather.sglang.unpinned import unpinned_without_cuda
    from sglang.srt.layers import logits_processor as lp

    pruned, store, stock_pruned, mutant, gate = sides
    # Lazy aux pruning applies to a processor whose class's store is the
    # installed one, as in a real forward.
    processor = object.__new__(lp.LogitsProcessor)
    for _ in range(cases):
        extend, start = _lengths(rng)
        capture = rng.choice(["NULL", "LAST", "FULL"])
        before_norm = rng.random() < 0.5
        h, b, aux = make_states(
            extend,
            rng.randint(0, 2**16),
            torch.float32,
            4,
            before_norm,
            "list",
            rng.randint(1, 3),
            0,
        )
        md = metadata(extend, start, capture)
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
        md = metadata(extend, start, capture)
        with unpinned_without_cuda():
            result = _outcome(stock_pruned, None, h, b, aux, md)
            if isinstance(result, tuple) and result[2] is None:
                layers = [
                    stock_pruned(None, a, None, None, metadata(extend, start))[0] for a in aux
                ]
                result = (*result[:2], layers, *result[3:])
        want = (
            result
            if isinstance(result, type)
            else _outcome(mutant, None, h, b, aux, *result[:4], md)
        )
        trial.compared += 1
        trial.raised += isinstance(want, type)
        found = first_difference(got, want, "stored")
        if found:
            trial.difference = f"extend {extend} start {start} {capture}: {found}"
            return


def _lengths(rng: random.Random) -> tuple[list[int], list[int]]:
    b = rng.choice([1, 2, 3, rng.randint(1, 12), rng.randint(1, 12), rng.randint(1, 64)])
    extend = [rng.choice([1, 2, 3, rng.randint(1, 80)]) for _ in range(b)]
    start = [rng.choice([0, 1, e - 1, e, rng.randint(0, e)]) for e in extend]
    return extend, start


# --- the output-logprob chain's consumers ----------------------------------------------------


def _chain_trial(stage: str, module_name: str):
    """``stage``: the chain's key for the method (``copy_to_cpu``, or
    ``normalize`` for the scheduler's ``_normalize_decode_outputs``). The
    stages work together, so whatever flatgather does with the mutant, it
    runs with flatgather's other stages installed, as on a server, against
    the release's chain with the mutant in its place."""

    def trial(copy, mutant, rng: random.Random, cases: int) -> Trial:
        import flatgather.sglang as fs
        from flatgather.bench import spec_chain as sc
        from flatgather.sglang.patches import output_logprobs

        chain = sc.find()
        real = chain.result_cls if stage == "copy_to_cpu" else chain.processor
        owner = getattr(copy, real.__name__)
        holder = types.SimpleNamespace(__name__=module_name, **{real.__name__: owner})
        result = output_logprobs.CHAIN.prepare(holder)
        ours = [p.new for p in result.swaps if p.name == mutant.__name__]
        trial = Trial(patched=bool(ours), note="; ".join(result.notes))
        in_place = ours[0] if ours else mutant
        saved = chain.stock[stage]
        chain.stock[stage] = mutant
        fs.install(input_logprobs=False)
        try:
            installed = vars(real)[mutant.__name__]
            setattr(real, mutant.__name__, in_place)
            try:
                with sc.emulated_copies():
                    _compare_chains(trial, sc, rng, cases)
            finally:
                setattr(real, mutant.__name__, installed)
        finally:
            fs.uninstall()
            chain.stock[stage] = saved
        return trial

    return trial


def _compare_chains(trial: Trial, sc, rng: random.Random, cases: int) -> None:
    from flatgather.sglang.patches.output_logprobs import difference

    vocab = 48
    for _ in range(cases):
        b, a = rng.randint(1, 24), rng.randint(1, 8)
        top = [rng.choice([0, 0, 1, 3, 20]) for _ in range(b)]
        if rng.random() < 0.2:
            ids = [None] * b
        else:
            ids = [
                [rng.randint(-vocab, vocab - 1) for _ in range(rng.randint(0, 5))] for _ in range(b)
            ]
        accept = [rng.randint(1, a) for _ in range(b)]
        dtype = rng.choice([torch.float32, torch.bfloat16])
        step = sc.make_step(
            b, a, top, ids, accept, vocab=vocab, dtype=dtype, seed=rng.randint(0, 999)
        )
        want = _outcome(sc.run, step, True)
        got = _outcome(sc.run, step, False)
        trial.compared += 1
        trial.raised += isinstance(want, type)
        found = (
            (None if got is want else f"raised {got}, the mutant {want}")
            if isinstance(want, type) or isinstance(got, type)
            else difference(got, want)
        )
        if found:
            trial.difference = f"{b} requests x {a} positions, top {top}: {found}"
            return


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
    def trial(copy, mutant, rng: random.Random, cases: int) -> Trial:
        with _shape_gate():
            result = prepare(copy)
        ours = [p for p in result.swaps if p.name == mutant.__name__]
        # No oracle of its own here: a patched mutant counts as not shown exact.
        return Trial(patched=bool(ours), note="; ".join(result.notes))

    return trial


def _callee_trial(caller: str, prepare):
    """A helper of the module that a function replaced whole calls, mutated
    in a copy of the whole module: the caller is then a fork's."""

    def trial(copy, mutant, rng: random.Random, cases: int) -> Trial:
        with _shape_gate():
            result = prepare(copy)
        ours = [p for p in result.swaps if p.name == caller]
        return Trial(patched=bool(ours), note="; ".join(result.notes))

    return trial


def _callees(function: types.FunctionType) -> list[str]:
    """The functions of ``function``'s own module that it calls by name."""
    import dis

    names = {i.argval for i in dis.get_instructions(function) if i.opname == "LOAD_GLOBAL"}
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


def _stand_ins() -> None:
    """The CPU stand-in for sgl_kernel, which the draft worker and the
    scheduler modules import; after logits_processor, which must not see it."""
    importlib.import_module("sglang.srt.layers.logits_processor")
    from flatgather.testing import install_sgl_kernel_stand_in

    install_sgl_kernel_stand_in()


def targets() -> list[Target]:
    """The patched functions of the running release that the suite mutates."""
    from flatgather.sglang import shapes
    from flatgather.sglang.patches import (
        draft_prefill,
        input_logprobs,
        output_logprobs,
        prefill_result,
    )
    from flatgather.sglang.patches.output_logprobs import runtime as flat_logprobs

    _stand_ins()
    replaced_whole = []
    for name, fn in shapes.release_functions().items():
        if name in (flat_logprobs.TOP, flat_logprobs.TOKEN_IDS):
            prepare = output_logprobs.PRODUCER.prepare
        else:
            assert name in (input_logprobs.CHUNK, input_logprobs.PREFILL), name
            prepare = input_logprobs.PATCH.prepare
        replaced_whole.append(
            Target(
                name,
                fn.__module__,
                None,
                name,
                _replaced_whole_trial(prepare),
                whole_function=True,
            )
        )
        replaced_whole += [
            Target(
                f"{callee} (called by {name})",
                fn.__module__,
                None,
                callee,
                _callee_trial(name, prepare),
                whole_function=True,
            )
            for callee in _callees(fn)
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
        ),
        Target(
            "LogitsProcessor._get_hidden_states_to_store",
            "sglang.srt.layers.logits_processor",
            "LogitsProcessor",
            "_get_hidden_states_to_store",
            _store_trial,
            whole_module=False,
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
        *replaced_whole,
        *_chain_targets(),
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
    return found
