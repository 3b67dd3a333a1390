"""The code flatgather has seen: fingerprints of the release functions it
replaces whole.

flatgather replaces ``LogitsProcessor._get_pruned_states`` whole (its
logprob branch; the others call the release's own code), behind a
behavioural probe. A probe proves what it tries and nothing more: a release
or fork whose function differs from every one flatgather was tested on only
where the probe's batches do not reach (a length rule changed for one
relation of ``extend`` and ``start``, or only for long requests) would pass
it and then be patched wrongly. So the function must also be one flatgather
knows: the syntax tree of its source, proven to be the code that runs
(:func:`flatgather.sglang.source.parse_method`), written canonically (no
docstring, no line numbers, no fields that differ between Python versions),
together with what each global name it reads resolves to (a builtin, a
module, a function by its qualified name), hashed. The test matrix runs
flatgather against every release of the table with exactly that code, so a
known fingerprint means the proof covers every input the tests cover; an
unknown one is refused and the release runs as shipped.

Where this is not a proof: the function's behaviour also depends on what it
reads, the ``LogitsMetadata`` that the release's ``from_forward_batch``
builds and the functions it calls (here only ``is_pin_memory_available``,
which decides pinning and no value); those are checked by the probe, on its
batches.

Lazy aux pruning (``install(lazy_aux=True)``) hands the release's
``_get_hidden_states_to_store`` an aux result holding only the rows the
probe saw it read, and ``sample_indices=None`` under LAST capture: a store
that reads other rows, or treats ``None`` otherwise, only past the probe's
batches would store the wrong rows. So lazy aux pruning also needs a known
store (:data:`STORE`); with an unknown one it stays off, and the rest is
patched. (``forward``, between the two, is read off its bytecode: the aux
result flows into the store and nowhere else.)

The same holds for the module-level functions it replaces whole (the
token-id input logprobs, the output logprobs' top-k and token-id helpers,
:data:`FUNCTIONS`), each behind its own side-by-side check: an unknown one is
left stock with a note, and the other patches go on.

The table below is generated, one line per release of the release table:

    for v in $(python python/flatgather/sglang/releases.py versions); do

"""

from __future__ import annotations

import ast
import builtins
import dis
import hashlib
import types

from flatgather.sglang import source
from flatgather.sglang.known_shapes import KNOWN

__all__ = ["COPY_HELPER", "KNOWN", "PRUNED_STATES", "STORE", "UnknownShape", "fingerprint", "known"]

PRUNED_STATES = "LogitsProcessor._get_pruned_states"
STORE = "LogitsProcessor._get_hidden_states_to_store"
COPY_HELPER = "GenerationBatchResult._async_d2h"
"""The host copy the output chain's ``copy_to_cpu`` applies to each row
(0.5.15 on): flatgather calls it once on a flat tensor instead."""

# Fields that say nothing about what the code does, or that one Python
# version has and another lacks.
_SKIPPED = frozenset(
    {"ctx", "type_comment", "type_params", "kind", "lineno", "col_offset", "end_lineno"}
)


class UnknownShape(Exception):
    """The running function is not one flatgather has seen."""


def _canonical(node) -> str:
    if isinstance(node, ast.AST):
        fields = [
            f"{name}={_canonical(getattr(node, name, None))}"
            for name in sorted(node._fields)
            if name not in _SKIPPED
        ]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(n) for n in node) + "]"
    return f"{type(node).__name__}:{node!r}"


def _without_docstring(tree: ast.FunctionDef) -> ast.FunctionDef:
    body = tree.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    out = ast.FunctionDef(
        name=tree.name,
        args=tree.args,
        body=body,
        decorator_list=tree.decorator_list,
        returns=tree.returns,
    )
    return out


def _resolved(
    function: types.FunctionType, seen: frozenset = frozenset(), callee: bool = False
) -> list[str]:
    """What each global name the function reads is bound to. A plain
    function of the same module is named by its fingerprint too, computed
    the same way, so that an edit of a helper the function calls (where its
    logic may live: ``get_top_logprobs`` is one call of
    ``get_top_logprobs_raw``) is an edit of the function; one whose source
    cannot be proven to be the code that runs is marked so. A function of
    another module is named by its qualified name alone (reading a module as
    large as ``sglang.srt.utils.common`` would cost more than the rest)."""
    out = []
    names = sorted(
        {
            str(i.argval)
            for i in dis.get_instructions(function)
            if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")
        }
    )
    for name in names:
        if name in function.__globals__:
            value = function.__globals__[name]
        else:
            value = getattr(builtins, name, None)
            if value is not None:
                out.append(f"{name}=builtin")
                continue
        if isinstance(value, types.ModuleType):
            what = f"module {value.__name__}"
        elif getattr(value, "__module__", None) == function.__module__ and hasattr(
            value, "__qualname__"
        ):
            # Not by its module's name: the fingerprint of a function is the
            # same wherever its module is imported from. A function by its code.
            what = f"(its module).{value.__qualname__}"
            if _same_module(value, function) and HELPERS_BY_CODE and value.__code__ not in seen:
                what += f" {_callee(value, seen | {function.__code__})}"
        elif callable(value) and hasattr(value, "__qualname__"):
            what = f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
        elif callee:
            # What a helper's other globals hold can depend on the process
            # (``current_platform`` is one class in a test, another in a
            # CPU engine): named, not typed, so one release has one print.
            what = "bound"
        else:
            what = type(value).__name__
        out.append(f"{name}={what}")
    return out


HELPERS_BY_CODE = True
"""Off only in the test that shows what naming a helper alone let through."""


def _same_module(value, function: types.FunctionType) -> bool:
    return (
        isinstance(value, types.FunctionType)
        and value.__module__ == function.__module__
        and value.__code__.co_filename == function.__code__.co_filename
    )


def _callee(function: types.FunctionType, seen: frozenset) -> str:
    try:
        tree = source.parse_function(function)
    except source.SourceMismatch:
        return "(source not proven)"
    text = _canonical(_without_docstring(tree)) + "|" + ";".join(_resolved(function, seen, True))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _hash(tree: ast.FunctionDef, function: types.FunctionType) -> str:
    text = _canonical(_without_docstring(tree)) + "|" + ";".join(_resolved(function))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(owner: type | None, name: str | types.FunctionType) -> str:
    """The fingerprint of method ``owner.<name>``, or, with ``owner`` None,
    of the module-level function ``name``. Raises
    :class:`flatgather.sglang.source.SourceMismatch` when its source is not
    the code that runs."""
    if owner is None:
        return _hash(source.parse_function(name), name)
    method = source.parse_method(owner, name)
    return _hash(method.tree, method.function)


def known(where: str, owner: type | None, name: str | types.FunctionType) -> str:
    """The fingerprint of ``owner.<name>`` (of function ``name`` where
    ``owner`` is None) if flatgather knows it under ``where``; raises
    :class:`UnknownShape` otherwise, naming what it found."""
    try:
        found = fingerprint(owner, name)
    except source.SourceMismatch as exc:
        raise UnknownShape(f"{where} is not code flatgather has seen: {exc}") from None
    seen = KNOWN.get(where, {})
    if found not in seen:
        raise UnknownShape(
            f"{where} is not code flatgather has seen (fingerprint {found}; known: "
            f"{', '.join(sorted(seen)) or 'none'}): its probe's batches cannot prove "
            "it for every input"
        )
    return found
