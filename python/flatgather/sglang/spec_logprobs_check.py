"""Where the output-logprob chain of the running release lives, and the
proof, before anything is patched, that flatgather's chain gives exactly the
release's answer (see :mod:`flatgather.sglang.spec_logprobs`).

Two kinds of patch, each prepared when its module is imported:

* **producers** (:func:`prepare_producers`): ``get_top_logprobs`` and
  ``get_token_ids_logprobs`` are replaced in the module globals where their
  callers look them up (``logprob_processor`` from 0.5.16 on,
  ``layers/utils/logprob`` and ``sampler`` before, and 0.5.10's
  ``eagle_worker_v2``, whose spec logprobs are a method). Each replacement
  and the release's own function run side by side on small CPU batches (top
  numbers 0, 1 and 20 mixed, all equal, one row, padding rows past the
  lists, a number past the vocabulary; id lists None, empty, ragged and
  negative, all None, an id outside the vocabulary; float32 and bfloat16),
  and everything is compared: what each returns or raises, types, dtypes,
  shapes, strides, bytes, the id lists themselves, and what the rest of the
  chain (a host copy and ``.tolist()`` per row) makes of it. The two ways
  the releases fill a row without ids (an empty list up to 0.5.20, an empty
  tensor since) are both tried; the one that matches is used.
* **the chain** (:func:`prepare_consumers`): ``GenerationBatchResult.copy_to_cpu``
  and the scheduler methods that call ``.tolist()`` per row are rebuilt from
  the release's own source, proven to be the running code
  (:func:`flatgather.sglang.source.parse_method`), with only the per-row
  comprehensions over the three logprob lists replaced, each by a call that
  takes the release's own element expression as a lambda. The rebuilt tree,
  with each call turned back into the comprehension its own list, lambda and
  kind make, must be the release's tree; each element
  expression, compiled on its own in the release's globals, is then run
  through flatgather's helper and through the release's comprehension on the
  lists both producers make, and the results (and the next stage's
  ``.tolist()`` of them) compared. A comprehension over those lists of any
  other shape leaves the method stock, with a note.

  The host copy of ``copy_to_cpu`` is checked before that, by what it is:
  on a CPU every release's copy returns its input (or a plain copy), so the
  comparison never reaches the branch a server runs (a pinned host tensor,
  the copy, ``record_stream``). It must be ``v.to("cpu", non_blocking=True)``
  (up to 0.5.14) or a call of a helper whose fingerprint
  (:func:`flatgather.sglang.shapes.fingerprint`: its proven source and what
  its globals are bound to) is one of :data:`COPY_HELPERS`, the releases'
  ``_async_d2h`` / ``async_d2h``; any other one-argument call leaves the
  method stock, with a note. ``tests/test_spec_logprobs.py`` compares the
  pinned branch itself where a CUDA device is present.
"""

from __future__ import annotations

import ast
import copy
import importlib
import itertools
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from flatgather.sglang import shapes, source, spec_logprobs
from flatgather.sglang.check import Answered, side_by_side
from flatgather.sglang.compare import first_difference
from flatgather.sglang.patching import Patch, Prepared, never_raises

__all__ = [
    "CONSUMERS",
    "COPY_HELPERS",
    "PRODUCERS",
    "prepare_consumers",
    "prepare_producers",
    "rewrite",
    "unknown_copy",
]

PRODUCER_MODULES = (
    "sglang.srt.layers.logprob_processor",
    "sglang.srt.layers.utils.logprob",
    "sglang.srt.layers.sampler",
    "sglang.srt.speculative.eagle_worker_v2",
)
"""Modules whose code calls the two functions through its own globals."""

CONSUMER_CLASSES = {
    "sglang.srt.managers.utils": "GenerationBatchResult",
    "sglang.srt.managers.scheduler_components.batch_result_processor": (
        "SchedulerBatchResultProcessor"
    ),
    "sglang.srt.managers.scheduler_output_processor_mixin": "SchedulerOutputProcessorMixin",
}
"""The classes whose methods copy the logprob lists row by row (0.5.13 on,
the scheduler's part is ``SchedulerBatchResultProcessor``; before, the
mixin, inline in ``process_batch_result_decode`` and ``_prefill``)."""

PRODUCERS = "output-logprobs"
CONSUMERS = "output-logprobs-chain"
"""The names of the two patches in the install report."""

FIELDS = frozenset(
    {
        "next_token_top_logprobs_val",
        "next_token_top_logprobs_idx",
        "next_token_token_ids_logprobs_val",
    }
)
TO_HOST = "__flatgather_rows_to_host__"
TOLIST = "__flatgather_rows_tolist__"

VOCAB = 24

# (top-k numbers, rows of the logprobs, whether flatgather answers)
_TOP_CASES = (
    ([0, 0, 1, 1, 20, 20, 5, 5], 8, True),  # 0 / 1 / 20 mixed, A = 2
    ([3, 3, 3, 3, 3, 3], 6, True),  # every row keeps all: the rows as they are
    ([2, 0, 7], 5, True),  # padding rows past the list
    ([4], 1, False),  # one row: the release's loop is as cheap
    ([2, 25], 2, False),  # past the vocabulary: the release's error
    ([2, -1], 2, False),  # a negative number slices from the end there
)
_IDS = ([3, 1], None, [], [2, -1, 23, 2], [0], [-24, 5, 4])
_ID_CASES = (
    ([_IDS[0], _IDS[0], _IDS[3], _IDS[3], _IDS[4], _IDS[4]], 6, True),  # ragged, A = 2
    ([_IDS[0], _IDS[1], _IDS[2], _IDS[5], _IDS[1]], 5, True),  # None and empty mixed
    ([_IDS[2], _IDS[2]], 4, True),  # nothing to gather, padding rows
    ([_IDS[1], _IDS[1], _IDS[1]], 3, True),  # no row asks
    ([_IDS[3]], 1, False),  # one row
    ([_IDS[0], [24]], 2, False),  # an id past the vocabulary: the release's error
    ([_IDS[0], (1, 2)], 2, False),  # ids as a tuple: the release's own conversion
)


def difference(actual, expected, path: str = "result") -> str | None:
    """:func:`flatgather.sglang.compare.first_difference`, strides included:
    a stage hands its rows on as views, and the next stage's copy keeps
    their layout."""
    return first_difference(actual, expected, path, strides=True)


def _host(v):
    """The release's per-row host copy, as every release writes it (on the
    CPU, the row itself)."""
    return v.to("cpu", non_blocking=True) if torch.is_tensor(v) else v


def _tolist(v):
    return v.tolist()


@dataclass(frozen=True)
class _Call:
    name: str
    logprobs: torch.Tensor
    arg: list
    flat: bool
    """Whether flatgather, not the release, answers."""


_logprobs: dict[tuple[int, torch.dtype], torch.Tensor] = {}


def _calls(name: str) -> Iterator[_Call]:
    cases = _TOP_CASES if name == spec_logprobs.TOP else _ID_CASES
    for (arg, rows, flat), dtype in itertools.product(cases, (torch.float32, torch.bfloat16)):
        logprobs = _logprobs.get((rows, dtype))
        if logprobs is None:
            # Any distinct values do: only where they land is compared.
            gen = torch.Generator().manual_seed(rows)
            logprobs = _logprobs[rows, dtype] = (torch.randn(rows, VOCAB, generator=gen) * 4).to(
                dtype
            )
        yield _Call(name, logprobs, [copy.copy(a) for a in arg], flat)


def _answer(fn, call: _Call):
    """What ``fn`` returns for ``call`` and what the release's chain (a host
    copy and ``.tolist()`` per row) makes of each list; the id lists named by
    the request whose object they are."""
    try:
        lists = fn(call.logprobs, call.arg, no_copy_to_cpu=True)
    except Exception as exc:  # compared by type: the same failure, or none
        return {"raised": type(exc).__name__}
    lists = list(lists)
    if call.name == spec_logprobs.TOKEN_IDS:
        owners = {id(a): f"ids[{i}]" for i, a in enumerate(call.arg) if a}
        lists[1] = [owners.get(id(a), a) for a in lists[1]]
    chain = []
    for rows in lists:
        if call.name == spec_logprobs.TOKEN_IDS and rows is lists[1]:
            continue
        try:
            host = spec_logprobs.rows_to_host(rows, _host)
            chain.append(spec_logprobs.rows_tolist(host, _tolist))
        except Exception as exc:
            chain.append({"raised": type(exc).__name__})
    return {"lists": lists, "chain": chain}


def _verify_producer(original, replacement, answers: Answered, name: str) -> str | None:
    return side_by_side(
        original,
        replacement,
        _calls(name),
        _answer,
        answers,
        flat=lambda call: call.flat,
        where=lambda call: (
            f"{name} on {call.arg}, {call.logprobs.shape[0]} rows, {call.logprobs.dtype}"
        ),
        compare=difference,
    )


_verified: dict[Callable, tuple[Callable | None, str | None]] = {}


def producer(original: Callable, name: str) -> tuple[Callable | None, str | None]:
    """flatgather's replacement of the release's ``original`` (``name``),
    verified against it, or None and the first difference."""
    if original not in _verified:
        _verified[original] = _producer(original, name)
    return _verified[original]


def _producer(original: Callable, name: str) -> tuple[Callable | None, str | None]:
    answers = Answered()
    if name == spec_logprobs.TOP:
        candidates = [(spec_logprobs.make_top_logprobs, ())]
    else:
        candidates = [(spec_logprobs.make_token_ids_logprobs, (walk,)) for walk in (True, False)]
    problem = None
    for make, args in candidates:
        found = _verify_producer(original, make(original, *args, on_answer=answers), answers, name)
        if found is None:
            # The one that goes into service counts nothing.
            return make(original, *args), None
        problem = problem or found
    return None, problem


def _release_function(module, name: str):
    """The release's own function ``name`` of ``module``, under flatgather's
    replacement if one is there."""
    fn = vars(module).get(name)
    # Where flatgather's replacement is installed, the release's is under it.
    while getattr(fn, "__flatgather__", None) is not None:
        fn = fn.__wrapped__
    return fn if isinstance(fn, types.FunctionType) else None


def prepare_producers(module) -> Prepared:
    """The replacements of the two functions in ``module``'s globals, each
    verified against the release's own; never raises."""
    patches, notes = [], []
    for name in (spec_logprobs.TOP, spec_logprobs.TOKEN_IDS):
        original = _release_function(module, name)
        if original is None:
            continue
        if vars(module)[name] is not original:
            # The module imported the name from one flatgather had patched
            # (0.5.10's worker, the sampler, imported after install()): it
            # gets the release's own back first, so that this patch is
            # checked against it and uninstall() restores it.
            setattr(module, name, original)
        where = f"{module.__name__}.{name}"
        try:
            replacement, problem = producer(original, name)
        except Exception as exc:
            replacement, problem = None, f"{type(exc).__name__}: {exc}"
        if replacement is not None:
            # Checked side by side on its cases; the code must also be code
            # the test matrix runs (shapes.py).
            try:
                shapes.known(name, None, original)
            except shapes.UnknownShape as exc:
                replacement, problem = None, str(exc)
        if replacement is None:
            notes.append(f"{where} left stock: {problem}")
        else:
            patches.append(Patch(module, name, replacement))
    return Prepared(patches=patches, applied=(PRODUCERS,) if patches else (), notes=tuple(notes))


# The rewrite of the consumers.


def _is_name(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_method_call(node, owner: str, method: str, args: int = 0) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == method
        and _is_name(node.func.value, owner)
        and len(node.args) == args
    )


def _helper_call(node, v: str) -> str | None:
    """The name ``f`` of a call ``f(v)``, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and len(node.args) == 1
        and not node.keywords
        and _is_name(node.args[0], v)
    ):
        return node.func.id
    return None


def _is_copy(node, v: str) -> bool:
    """``v.to("cpu", non_blocking=True)``, or ``f(v)``: a helper's call,
    which :func:`unknown_copy` then requires to be one of the releases' own
    (:data:`COPY_HELPERS`)."""
    if not isinstance(node, ast.Call):
        return False
    if _helper_call(node, v) is not None:
        return True
    return (
        _is_method_call(node, v, "to", 1)
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "cpu"
        and len(node.keywords) == 1
        and node.keywords[0].arg == "non_blocking"
        and isinstance(node.keywords[0].value, ast.Constant)
        and node.keywords[0].value.value is True
    )


def _kind(comp: ast.ListComp) -> str | None:
    """TO_HOST for ``[copy(v) if torch.is_tensor(v) else v for v in X]``,
    TOLIST for ``[v.tolist() for v in X]``, None for any other shape."""
    if len(comp.generators) != 1:
        return None
    gen = comp.generators[0]
    if gen.ifs or gen.is_async or not isinstance(gen.target, ast.Name):
        return None
    v, elt = gen.target.id, comp.elt
    if _is_method_call(elt, v, "tolist"):
        return TOLIST
    if (
        isinstance(elt, ast.IfExp)
        and _is_name(elt.orelse, v)
        and isinstance(elt.test, ast.Call)
        and isinstance(elt.test.func, ast.Attribute)
        and elt.test.func.attr == "is_tensor"
        and _is_name(elt.test.func.value, "torch")
        and len(elt.test.args) == 1
        and _is_name(elt.test.args[0], v)
        and _is_copy(elt.body, v)
    ):
        return TO_HOST
    return None


def _over_fields(node) -> bool:
    return (
        isinstance(node, ast.ListComp)
        and len(node.generators) >= 1
        and isinstance(node.generators[0].iter, ast.Attribute)
        and node.generators[0].iter.attr in FIELDS
    )


@dataclass
class Rewrite:
    tree: ast.FunctionDef
    """The release's method with its per-row comprehensions replaced."""
    elts: dict[str, tuple[str, ast.Lambda]]
    """Per element expression (by its source): its kind and its lambda."""


class _Replace(ast.NodeTransformer):
    def __init__(self) -> None:
        self.replaced: list[tuple[ast.Call, ast.ListComp]] = []
        self.other: list[str] = []

    def visit_ListComp(self, node: ast.ListComp):
        if not _over_fields(node):
            return self.generic_visit(node)
        kind = _kind(node)
        if kind is None:
            self.other.append(ast.unparse(node))
            return node
        gen = node.generators[0]
        fn = ast.Lambda(
            args=ast.arguments(
                posonlyargs=[],
                args=[ast.arg(arg=gen.target.id)],
                kwonlyargs=[],
                kw_defaults=[],
                defaults=[],
            ),
            body=copy.deepcopy(node.elt),
        )
        call = ast.Call(
            func=ast.Name(kind, ast.Load()), args=[copy.deepcopy(gen.iter), fn], keywords=[]
        )
        ast.copy_location(call, node)
        ast.fix_missing_locations(call)
        self.replaced.append((call, node))
        return call


class _PutBack(ast.NodeTransformer):
    """Each replacing call (by identity) turned back into a comprehension
    rebuilt from the call's own arguments, its list and its lambda, and of
    the call's kind: the comparison with the release's tree then covers
    what each call does, not only what surrounds it."""

    def __init__(self, calls: set[int]) -> None:
        self.calls = calls

    def visit_Call(self, node: ast.Call):
        if id(node) not in self.calls:
            return self.generic_visit(node)
        rows, fn = node.args
        target = ast.Name(fn.args.args[0].arg, ast.Store())
        comp = ast.ListComp(
            elt=fn.body,
            generators=[ast.comprehension(target=target, iter=rows, ifs=[], is_async=0)],
        )
        return comp if _kind(comp) == node.func.id else node


def rewrite(tree: ast.FunctionDef) -> Rewrite | str | None:
    """A copy of ``tree`` with every per-row comprehension over the logprob
    lists replaced; None when it has none, a note when one has another
    shape or the copy, with the comprehensions put back, is not ``tree``."""
    replace = _Replace()
    work = replace.visit(copy.deepcopy(tree))
    if replace.other:
        return f"a comprehension of another shape: {replace.other[0]}"
    if not replace.replaced:
        return None
    memo: dict = {}
    restored = copy.deepcopy(work, memo)
    restored = _PutBack({id(memo[id(call)]) for call, _ in replace.replaced}).visit(restored)
    if ast.dump(restored) != ast.dump(tree):
        return "the rewritten method is not the release's with the loops put back"
    elts = {ast.unparse(call.args[1]): (call.func.id, call.args[1]) for call, _ in replace.replaced}
    return Rewrite(work, elts)


COPY_HELPERS: dict[str, tuple[str, ...]] = {
    "2378479a2a26e13c": (
        "0.5.15",
        "0.5.15.post1",
        "0.5.16",
        "0.5.17",
        "0.5.18",
        "0.5.19",
        "0.5.20",
    ),
    "bbd1a2aa5314e9c3": ("0.5.21", "0.5.22"),
    "233c76c22e1d526f": ("0.5.23",),
}
"""The per-tensor host copies flatgather knows (``_async_d2h`` of
``managers/utils`` from 0.5.15, ``utils.common.async_d2h`` imported under
that name from 0.5.21), by :func:`flatgather.sglang.shapes.fingerprint`, and
the releases that have each. Each takes one tensor and returns its host copy
(on a GPU: a fresh pinned tensor, one non-blocking copy, ``record_stream`` on
the source), so one call on the flat tensor is the rows' calls at once.
Regenerate with ``python -m flatgather.sglang.spec_logprobs_check`` under
each release."""

_copy_fingerprints: dict[types.FunctionType, str] = {}


def _copy_fingerprint(helper: types.FunctionType) -> str:
    """The helper's fingerprint (cached per function: the code, its
    globals' bindings and its file do not change under a running server
    without the function changing)."""
    found = _copy_fingerprints.get(helper)
    if found is None:
        found = _copy_fingerprints[helper] = shapes.fingerprint(None, helper)
    return found


def unknown_copy(method: source.Method, result: Rewrite, closure=()) -> str | None:
    """Why the host copy of a replaced ``TO_HOST`` comprehension is not one
    flatgather knows, or None: a helper call ``f(v)`` must resolve, in the
    method's globals, to a function of :data:`COPY_HELPERS`. On a CPU no
    release's copy takes its device branch, so the check of
    :func:`_verify_chain` cannot tell a helper of other code from the
    release's."""
    for text, (kind, fn) in result.elts.items():
        if kind != TO_HOST:
            continue
        name = _helper_call(fn.body.body, fn.args.args[0].arg)
        if name is None:
            continue  # v.to("cpu", non_blocking=True)
        if name in closure or name in method.function.__code__.co_varnames:
            return f"`{text}` copies with {name}, not a module-level helper"
        helper = method.function.__globals__.get(name)
        where = f"{getattr(helper, '__module__', '?')}.{getattr(helper, '__qualname__', name)}"
        if not isinstance(helper, types.FunctionType):
            return f"`{text}` copies with {name}, which is not a plain function"
        try:
            found = _copy_fingerprint(helper)
        except source.SourceMismatch as exc:
            return f"`{text}` copies with {where}, whose source is not proven: {exc}"
        if found not in COPY_HELPERS:
            return (
                f"`{text}` copies with {where} (fingerprint {found}), not a host copy "
                f"flatgather knows (known: {', '.join(sorted(COPY_HELPERS))}): on a CPU its "
                "device branch cannot be compared"
            )
    return None


_HELPERS = {TO_HOST: spec_logprobs.rows_to_host, TOLIST: spec_logprobs.rows_tolist}
_LOGPROB_MODULES = ("sglang.srt.layers.logprob_processor", "sglang.srt.layers.utils.logprob")


def _chain_lists() -> list[tuple[list, list]]:
    """``(release's list, flatgather's list)`` of every list of tensors the
    producers hand on in the producer cases, flatgather's registered."""
    module = None
    for name in _LOGPROB_MODULES:
        try:
            module = importlib.import_module(name)
            break
        except ImportError:
            continue
    if module is None:
        raise LookupError("neither logprob module of the releases imports")
    pairs = []
    for name in (spec_logprobs.TOP, spec_logprobs.TOKEN_IDS):
        original = _release_function(module, name)
        replacement, problem = producer(original, name) if original else (None, "not found")
        if replacement is None:
            raise LookupError(f"{module.__name__}.{name}: {problem}")
        for call in _calls(name):
            if not call.flat:
                continue
            expected = original(call.logprobs, call.arg, no_copy_to_cpu=True)
            actual = replacement(call.logprobs, call.arg, no_copy_to_cpu=True)
            for e, a in zip(expected, actual, strict=True):
                if all(torch.is_tensor(v) for v in e):
                    pairs.append((e, a))
    return pairs


def _compile_elt(method: source.Method, fn: ast.Lambda) -> Callable:
    """The element expression alone, as a lambda over the release's globals
    (an expression that reads a local of the method fails to run, and the
    method stays stock)."""
    expr = ast.fix_missing_locations(ast.Expression(body=copy.deepcopy(fn)))
    return eval(compile(expr, method.filename, "eval"), method.function.__globals__)


def _verify_chain(method: source.Method, result: Rewrite) -> str | None:
    """Each replaced comprehension against the release's, on every list
    both producers make: the same answer, and the next stage's ``.tolist()``
    of it; flatgather's lists stay registered through the copy."""
    for text, (kind, fn) in result.elts.items():
        elt = _compile_elt(method, fn)
        helper = _HELPERS[kind]
        for n, (release_rows, flat_rows) in enumerate(_chain_lists()):
            expected = [elt(v) for v in release_rows]
            for rows, flat in ((release_rows, False), (flat_rows, True)):
                actual = helper(rows, elt)
                where = f"`{text}` on list {n} ({'flatgather' if flat else 'the release'}'s)"
                found = difference(actual, expected, where)
                if found:
                    return found
                if kind == TO_HOST:
                    if flat and not spec_logprobs.registered(actual):
                        return f"{where}: the host rows are not handed on flat"
                    found = difference(
                        spec_logprobs.rows_tolist(actual, _tolist),
                        [v.tolist() for v in expected],
                        f"{where}, then .tolist()",
                    )
                    if found:
                        return found
            # The registrations made here must not outlive the check.
            spec_logprobs.rows_tolist(flat_rows, _tolist)
    return None


def methods_with_loops(owner: type) -> list[str]:
    """The methods of ``owner`` that may hold a comprehension over the
    logprob lists: their code reads one of the fields and builds a list
    comprehension (a code object of its own before Python 3.12). Read off
    the code objects, so that only those methods' source is parsed."""
    names = []
    for name, attr in vars(owner).items():
        fn = getattr(attr, "__wrapped__", attr)
        code = getattr(fn, "__code__", None)
        if code is None or not FIELDS & set(code.co_names):
            continue
        comprehensions = [c for c in code.co_consts if getattr(c, "co_name", "") == "<listcomp>"]
        if comprehensions or sys.version_info >= (3, 12):
            names.append(name)
    return names


@never_raises(lambda module: f"{module.__name__}: the logprob chain")
def prepare_consumers(module) -> Prepared:
    """The rebuilt methods of ``module``'s class of :data:`CONSUMER_CLASSES`,
    each verified; never raises."""
    return _prepare_consumers(module)


def _prepare_consumers(module) -> Prepared:
    owner = getattr(module, CONSUMER_CLASSES.get(module.__name__, ""), None)
    if not isinstance(owner, type):
        return Prepared()
    patches, notes = [], []
    for name in methods_with_loops(owner):
        where = f"{owner.__qualname__}.{name}"
        try:
            build = source.to_rewrite(owner, name, decorated=True)
        except source.SourceMismatch as exc:
            notes.append(f"{where} left stock: {exc}")
            continue
        method, tree, closure = build.method, build.tree, build.closure
        code = method.function.__code__
        if {TO_HOST, TOLIST} & {*code.co_names, *code.co_varnames, *closure}:
            notes.append(f"{where} left stock: it uses flatgather's names")
            continue
        result = rewrite(tree)
        if result is None:
            continue
        if isinstance(result, str):
            notes.append(f"{where} left stock: {result}")
            continue
        problem = unknown_copy(method, result, closure)
        if problem:
            notes.append(f"{where} left stock: {problem}")
            continue
        problem = _verify_chain(method, result)
        if problem:
            notes.append(f"{where} left stock: checked against the release's loop, {problem}")
            continue
        built = source.build_method(method, result.tree, {**closure, **_HELPERS})
        built.__flatgather__ = CONSUMERS
        # The attribute as shipped (a decorated method's wrapper, not the
        # function under it): what the bench and the tests call as stock.
        shipped = vars(owner)[name]
        if hasattr(shipped, "__flatgather_build__"):
            # Over another fix, which takes undecorated methods only.
            shipped = method.function
        built.__flatgather_original__ = shipped
        patches.append(Patch(owner, name, built))
    return Prepared(patches=patches, applied=(CONSUMERS,) if patches else (), notes=tuple(notes))


def main() -> int:
    """Print the running release's version and the fingerprint of its host
    copy helper, if it has one (for :data:`COPY_HELPERS`)."""
    from flatgather.bench import spec_chain
    from flatgather.sglang.releases import sglang_release

    # Imported as the tests import it (0.5.10's needs the sgl_kernel stand-in).
    helper = vars(sys.modules[spec_chain.find().result_cls.__module__]).get("_async_d2h")
    found = _copy_fingerprint(helper) if isinstance(helper, types.FunctionType) else "none"
    print(sglang_release(), found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
