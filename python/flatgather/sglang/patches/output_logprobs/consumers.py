"""The chain's check: ``copy_to_cpu`` and the scheduler's methods, rebuilt
with their per-row loops over the logprob lists replaced
(:mod:`~flatgather.sglang.patches.output_logprobs.loops`), against the
release's own loops; which methods have such loops (see the package's
docstring, where the patch is)."""

from __future__ import annotations

import ast
import copy
import importlib
import sys
import types
from collections.abc import Callable

import torch

from flatgather.sglang import shapes, source
from flatgather.sglang.patches.output_logprobs import runtime as flat_logprobs
from flatgather.sglang.patches.output_logprobs.loops import (
    FIELDS,
    TO_HOST,
    TOLIST,
    Rewrite,
    helper_call,
)
from flatgather.sglang.patches.output_logprobs.producers import (
    difference,
    producer_calls,
    tolist_each,
)
from flatgather.sglang.patching import release_function

Producer = Callable[[Callable, str], tuple[Callable | None, str | None]]
"""flatgather's replacement of a release's producer (the function, its
name), verified, or None and why not: the producers' verdict of the
installation (:func:`flatgather.sglang.patches.output_logprobs.producer`)."""

COPY_HELPERS = shapes.KNOWN[shapes.COPY_HELPER]
"""The per-tensor host copies flatgather knows (``_async_d2h`` of
``managers/utils`` from 0.5.15, ``utils.common.async_d2h`` imported under
that name from 0.5.21), by fingerprint, and the releases that have each: one
table with the other fingerprints, regenerated with them (``known_shapes.py``).
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
    :func:`verify_chain` cannot tell a helper of other code from the
    release's."""
    for text, (kind, fn) in result.elts.items():
        if kind != TO_HOST:
            continue
        name = helper_call(fn.body.body, fn.args.args[0].arg)
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


HELPERS = {TO_HOST: flat_logprobs.rows_to_host, TOLIST: flat_logprobs.rows_tolist}
"""flatgather's helper for each kind of comprehension: the names the rebuilt
methods call, bound to them."""
_LOGPROB_MODULES = ("sglang.srt.layers.logprob_processor", "sglang.srt.layers.utils.logprob")


def _chain_lists(producer: Producer) -> list[tuple[list, list]]:
    """``(release's list, flatgather's list)`` of every list of tensors the
    producers hand on in the producer cases, flatgather's registered (made
    anew for each check: the check's ``.tolist()`` takes them out of the
    registry), with each producer's replacement as ``producer`` gives it
    (the installation's verdict, reached once by whichever patch meets it
    first)."""
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
        original = release_function(module, name)
        replacement, problem = producer(original, name) if original else (None, "not found")
        if replacement is None:
            raise LookupError(f"{module.__name__}.{name}: {problem}")
        for call in producer_calls(name):
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


def verify_chain(method: source.Method, result: Rewrite, producer: Producer) -> str | None:
    """Each replaced comprehension against the release's, on every list
    both producers make: the same answer, and the next stage's ``.tolist()``
    of it; flatgather's lists stay registered through the copy."""
    for text, (kind, fn) in result.elts.items():
        elt = _compile_elt(method, fn)
        helper = HELPERS[kind]
        for n, (release_rows, flat_rows) in enumerate(_chain_lists(producer)):
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
                        flat_logprobs.rows_tolist(actual, tolist_each),
                        [v.tolist() for v in expected],
                        f"{where}, then .tolist()",
                    )
                    if found:
                        return found
            # The registrations made here must not outlive the check.
            flat_logprobs.rows_tolist(flat_rows, tolist_each)
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
