"""Mutants of one function's syntax tree: the kind of one-edit change a fork
or a later release makes to the code flatgather patches.

Each mutant is named by where it edits (the index of a node in
``ast.walk`` order of the function, and a variant there), so the same
release always yields the same list and a sample of it is reproducible.
Equivalent mutants are those equivalent by construction (a list for a
tuple of arguments, a ``pass`` more, the operands of ``==`` swapped, an
unreachable copy of a ``return``): a patch should take them, and every one
it refuses is a refusal a release never needed.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# One flip per comparison: the boundary moved, or the sense reversed.
_COMPARISON = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_ARITHMETIC = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult}
_BOOLEAN = {ast.And: ast.Or, ast.Or: ast.And}
_TERMINAL = (ast.Return, ast.Raise, ast.Continue, ast.Break)
_BODIES = ("body", "orelse", "finalbody")


@dataclass(frozen=True)
class Mutant:
    operator: str
    site: int
    """Index of the edited node in ``ast.walk(function)``."""
    variant: tuple
    equivalent: bool
    description: str

    def apply(self, function: ast.FunctionDef) -> ast.FunctionDef:
        """A copy of ``function`` (the tree the mutant was made from) with the
        edit made."""
        mutated = copy.deepcopy(function)
        node = list(ast.walk(mutated))[self.site]
        _EDITS[self.operator](node, *self.variant)
        return ast.fix_missing_locations(mutated)

    @property
    def key(self) -> str:
        return f"{self.operator}@{self.site}:{','.join(map(str, self.variant))}"


def _plus(expr: ast.expr, delta: int) -> ast.expr:
    op = ast.Add() if delta > 0 else ast.Sub()
    return ast.BinOp(expr, op, ast.Constant(abs(delta)))


def _slice_bound(node: ast.Slice, field: str, delta: int) -> None:
    setattr(node, field, _plus(getattr(node, field), delta))


def _comparison(node: ast.Compare) -> None:
    node.ops[0] = _COMPARISON[type(node.ops[0])]()


def _operands_swapped(node: ast.Compare) -> None:
    node.left, node.comparators[0] = node.comparators[0], node.left


def _arithmetic(node: ast.BinOp) -> None:
    node.op = _ARITHMETIC[type(node.op)]()


def _boolean(node: ast.BoolOp) -> None:
    node.op = _BOOLEAN[type(node.op)]()


def _constant(node: ast.Constant, value) -> None:
    node.value = value


def _arguments_swapped(node: ast.Call) -> None:
    node.args[0], node.args[1] = node.args[1], node.args[0]


def _not_dropped(node: ast.AST, field: str, position: int | None) -> None:
    """``not x`` becomes ``x`` in ``node``'s ``field`` (at ``position`` of a list)."""
    if position is None:
        setattr(node, field, getattr(node, field).operand)
    else:
        items = getattr(node, field)
        items[position] = items[position].operand


def _list_for_tuple(node: ast.Call, position: int) -> None:
    tup = node.args[position]
    node.args[position] = ast.List(tup.elts, ast.Load())


def _statement_dropped(node: ast.AST, field: str, position: int) -> None:
    body = getattr(node, field)
    del body[position]
    if not body and field == "body":
        body.append(ast.Pass())


def _statement_duplicated(node: ast.AST, field: str, position: int) -> None:
    body = getattr(node, field)
    body.insert(position + 1, copy.deepcopy(body[position]))


def _pass_inserted(node: ast.AST, field: str, position: int) -> None:
    getattr(node, field).insert(position, ast.Pass())


_EDITS: dict[str, Callable] = {
    "slice bound": _slice_bound,
    "comparison": _comparison,
    "arithmetic": _arithmetic,
    "boolean": _boolean,
    "constant": _constant,
    "arguments swapped": _arguments_swapped,
    "not dropped": _not_dropped,
    "statement dropped": _statement_dropped,
    "statement duplicated": _statement_duplicated,
    "equivalent: operands of == swapped": _operands_swapped,
    "equivalent: list for a tuple argument": _list_for_tuple,
    "equivalent: pass inserted": _pass_inserted,
}


def _line(node: ast.AST) -> int:
    return getattr(node, "lineno", 0)


def _short(node: ast.AST) -> str:
    text = ast.unparse(node).splitlines()[0]
    return text if len(text) <= 60 else text[:57] + "..."


def _sites(function: ast.FunctionDef) -> Iterator[tuple[str, int, tuple, bool, str]]:
    nodes = list(ast.walk(function))
    for site, node in enumerate(nodes):
        where = f"line {_line(node)}: `{_short(node)}`" if hasattr(node, "lineno") else ""
        if isinstance(node, ast.Slice):
            for field in ("lower", "upper"):
                if getattr(node, field) is not None:
                    for delta in (1, -1):
                        what = f"{where} {field}{delta:+d}"
                        yield "slice bound", site, (field, delta), False, what
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            if type(node.ops[0]) in _COMPARISON:
                flipped = _COMPARISON[type(node.ops[0])].__name__
                yield "comparison", site, (), False, f"{where} -> {flipped}"
            if isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
                yield "equivalent: operands of == swapped", site, (), True, where
        elif isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            yield "arithmetic", site, (), False, where
        elif isinstance(node, ast.BoolOp):
            yield "boolean", site, (), False, where
        elif isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool):
                yield "constant", site, (not value,), False, f"{where} -> {not value}"
            elif isinstance(value, int):
                for new in sorted({value + 1, value - 1 if value > 0 else value + 2}):
                    yield "constant", site, (new,), False, f"{where} -> {new}"
        elif isinstance(node, ast.Call):
            positional = [a for a in node.args if not isinstance(a, ast.Starred)]
            if len(positional) == len(node.args) >= 2:
                yield "arguments swapped", site, (), False, where
            for position, arg in enumerate(node.args):
                if isinstance(arg, ast.Tuple) and not any(
                    isinstance(e, ast.Starred) for e in arg.elts
                ):
                    yield "equivalent: list for a tuple argument", site, (position,), True, where
        for field, value in ast.iter_fields(node):
            for position, child in enumerate(value) if isinstance(value, list) else [(None, value)]:
                if isinstance(child, ast.UnaryOp) and isinstance(child.op, ast.Not):
                    at = f"line {_line(child)}: `{_short(child)}`"
                    yield "not dropped", site, (field, position), False, at
        for field in _BODIES:
            body = getattr(node, field, None)
            if not isinstance(body, list) or not body or not isinstance(body[0], ast.stmt):
                continue
            for position, stmt in enumerate(body):
                if isinstance(stmt, ast.Pass) or _is_docstring(node, field, position):
                    continue
                here = f"line {_line(stmt)}: `{_short(stmt)}`"
                yield "statement dropped", site, (field, position), False, here
                yield (
                    "statement duplicated",
                    site,
                    (field, position),
                    isinstance(stmt, _TERMINAL),
                    here,
                )
            if field == "body":
                yield (
                    "equivalent: pass inserted",
                    site,
                    (field, 0),
                    True,
                    f"line {_line(body[0])}: before `{_short(body[0])}`",
                )


def _is_docstring(node: ast.AST, field: str, position: int) -> bool:
    if field != "body" or position != 0 or not isinstance(node, ast.FunctionDef):
        return False
    stmt = node.body[0]
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def mutants(function: ast.FunctionDef) -> list[Mutant]:
    """Every mutant of ``function`` (the syntax tree of one function: the
    edits reach its body, never its name or signature)."""
    found = (
        Mutant(operator, site, variant, equivalent, description.strip())
        for operator, site, variant, equivalent, description in _sites(function)
    )
    return [m for m in found if _in_body(function, m)]


def _in_body(function: ast.FunctionDef, mutant: Mutant) -> bool:
    """Whether ``mutant`` edits the body (not a default value, an annotation
    or a decorator: where the function is found, not what it computes)."""
    node = list(ast.walk(function))[mutant.site]
    signature = [*function.args.defaults, *function.args.kw_defaults, *function.decorator_list]
    signature += [a.annotation for a in function.args.args if a.annotation is not None]
    if function.returns is not None:
        signature.append(function.returns)
    return not any(node is n for s in signature if s is not None for n in ast.walk(s))
