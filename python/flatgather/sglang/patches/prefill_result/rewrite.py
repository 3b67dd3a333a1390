"""The one change the #36938 patch makes: the release's advance, placed
in the skip branch before its ``continue``."""

from __future__ import annotations

import ast
import copy

from flatgather.sglang.patches.prefill_result.match import Shape


def _placed(node: ast.AST, like: ast.AST) -> ast.AST:
    for n in ast.walk(node):
        if "lineno" in n._attributes:
            ast.copy_location(n, like)
    return node


def advance_in_skip(shape: Shape) -> None:
    """Put the advance before the skip branch's ``continue`` (in place)."""
    a, loop = shape.advance, shape.loop

    def load(name: str) -> ast.Name:
        return ast.Name(name, ast.Load())

    present = [
        ast.Compare(load(n), [ast.IsNot()], [ast.Constant(None)]) for n in (a.lens, a.starts)
    ]
    step = ast.AugAssign(
        ast.Name(a.pt, ast.Store()),
        ast.Add(),
        ast.Call(
            copy.deepcopy(a.count),
            [
                load(loop.req),
                ast.Subscript(load(a.lens), load(loop.i), ast.Load()),
                ast.Subscript(load(a.starts), load(loop.i), ast.Load()),
            ],
            [],
        ),
    )
    guard = ast.If(ast.BoolOp(ast.And(), [*copy.deepcopy(a.guards), *present]), [step], [])
    shape.skip.body.insert(0, _placed(guard, shape.skip))
