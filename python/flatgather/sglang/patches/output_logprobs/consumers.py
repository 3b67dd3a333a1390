"""The chain's patch: ``copy_to_cpu`` and the scheduler's methods rebuilt
with their per-row loops over the logprob lists replaced, each checked
against the release's own loops (see the package's docstring)."""

from __future__ import annotations

import ast
import copy
import importlib
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flatgather.sglang import shapes, source
from flatgather.sglang.patches.output_logprobs import flat_logprobs
from flatgather.sglang.patches.output_logprobs.names import (
    CONSUMER_CLASSES,
    CONSUMERS,
    FIELDS,
    TO_HOST,
    TOLIST,
)
from flatgather.sglang.patches.output_logprobs.producers import (
    _calls,
    _release_function,
    _tolist,
    difference,
    producer,
)
from flatgather.sglang.patching import Candidate, Patch, Refused, Swap, Target, Unneeded

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


COPY_HELPERS = shapes.KNOWN[shapes.COPY_HELPER]
"""The per-tensor host copies flatgather knows (``_async_d2h`` of
``managers/utils`` from 0.5.15, ``utils.common.async_d2h`` imported under
that name from 0.5.21), by fingerprint, and the releases that have each: one
table with the other fingerprints, regenerated with them (``shapes.py``).
Each takes one tensor and returns its host copy (on a GPU: a fresh pinned
tensor, one non-blocking copy, ``record_stream`` on the source), so one call
on the flat tensor is the rows' calls at once."""

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


_HELPERS = {TO_HOST: flat_logprobs.rows_to_host, TOLIST: flat_logprobs.rows_tolist}
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
    for name in (flat_logprobs.TOP, flat_logprobs.TOKEN_IDS):
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
                    if flat and not flat_logprobs.registered(actual):
                        return f"{where}: the host rows are not handed on flat"
                    found = difference(
                        flat_logprobs.rows_tolist(actual, _tolist),
                        [v.tolist() for v in expected],
                        f"{where}, then .tolist()",
                    )
                    if found:
                        return found
            # The registrations made here must not outlive the check.
            flat_logprobs.rows_tolist(flat_rows, _tolist)
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


class Chain(Patch):
    """The methods of each class of :data:`CONSUMER_CLASSES` that copy the
    logprob lists row by row, rebuilt with those comprehensions replaced,
    each method verified on its own."""

    name = CONSUMERS
    modules = tuple(CONSUMER_CLASSES)
    option = "output_logprobs"

    def locate(self, module):
        owner = getattr(module, CONSUMER_CLASSES.get(module.__name__, ""), None)
        if not isinstance(owner, type):
            return []
        return [Target(owner, name, module) for name in methods_with_loops(owner)]

    def prove(self, target):
        """The method's source, proven, and its comprehensions over the
        logprob lists, found (none: :class:`Unneeded`)."""
        try:
            build = source.to_rewrite(target.owner, target.name, decorated=True)
        except source.SourceMismatch as exc:
            raise Refused(str(exc)) from None
        code = build.method.function.__code__
        if {TO_HOST, TOLIST} & {*code.co_names, *code.co_varnames, *build.closure}:
            raise Refused("it uses flatgather's names")
        result = rewrite(build.tree)
        if result is None:
            raise Unneeded
        if isinstance(result, str):
            raise Refused(result)
        return build, result

    def build(self, target, proof):
        build, result = proof
        method = build.method
        built = source.build_method(method, result.tree, {**build.closure, **_HELPERS})
        built.__flatgather__ = CONSUMERS
        # The attribute as shipped (a decorated method's wrapper, not the
        # function under it): what the bench and the tests call as stock.
        shipped = vars(target.owner)[target.name]
        if hasattr(shipped, "__flatgather_build__"):
            # Over another fix, which takes undecorated methods only.
            shipped = method.function
        built.__flatgather_original__ = shipped
        yield Candidate(swaps=(Swap(target.owner, target.name, built),), applied=(CONSUMERS,))

    def check(self, target, proof, candidate):
        """The host copy by what it is, then each comprehension by what it
        gives."""
        build, result = proof
        problem = unknown_copy(build.method, result, build.closure)
        if problem:
            return problem
        problem = _verify_chain(build.method, result)
        return problem and f"checked against the release's loop, {problem}"

    def where(self, module):
        return f"{module.__name__}: the logprob chain"


PATCH = Chain()
