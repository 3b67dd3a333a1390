"""The rewrite of ``EagleDraftWorker._draft_extend_for_prefill``'s syntax
tree: the rotation loop :mod:`~flatgather.sglang.patches.draft_prefill.match` found becomes
the call of :func:`~flatgather.sglang.patches.draft_prefill.runtime.rotate` with the loop as
its fallback (:func:`replace_loop`), and ``<fb>.return_logprob = False`` goes
in after ``ForwardBatch.init_new`` where the release lacks it
(:func:`add_no_logprob`, SGLang PR #21589's second fix). Each edits a copy of
the release's tree in place; new statements carry the line of the release's
statement they stand for.

Why the method is rewritten and not copied is told in
:mod:`flatgather.sglang.patches.draft_prefill`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from flatgather.sglang import source
from flatgather.sglang.patches.draft_prefill.match import Loop, as_load, walk_scope

__all__ = ["Names", "add_no_logprob", "replace_loop"]


def _splice(tree: ast.AST, target: ast.stmt, replacement: list[ast.stmt]) -> None:
    for node in ast.walk(tree):
        for _, value in ast.iter_fields(node):
            if isinstance(value, list) and any(item is target for item in value):
                i = next(i for i, item in enumerate(value) if item is target)
                value[i : i + 1] = replacement
                return
    raise LookupError("statement not found")


def _placed(node: ast.AST, at: ast.AST) -> ast.AST:
    """New code gets the position of the release's statement it stands for,
    so a traceback points at that line."""
    for n in ast.walk(node):
        if "lineno" in n._attributes:
            n.lineno, n.col_offset = at.lineno, at.col_offset
            n.end_lineno, n.end_col_offset = at.end_lineno, at.end_col_offset
    return node


def _taken_names(method: source.Method) -> set[str]:
    code = method.function.__code__
    names = {n.id for n in ast.walk(method.tree) if isinstance(n, ast.Name)}
    names |= {a.arg for a in ast.walk(method.tree) if isinstance(a, ast.arg)}
    return names | {*code.co_varnames, *code.co_names, *code.co_cellvars, *code.co_freevars}


def _fresh(base: str, taken: set[str]) -> str:
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


@dataclass(frozen=True)
class Names:
    """The fresh names the rewrite introduces."""

    rotate: str
    takes: str
    lens: str
    end: str

    @classmethod
    def fresh(cls, method: source.Method) -> Names:
        """``flatgather_rotate`` and so on, each with a number added where
        the method (its source or its code) has the name already."""
        taken = _taken_names(method)
        return cls(*(_fresh(f"flatgather_{n}", taken) for n in ("rotate", "takes", "lens", "end")))


def replace_loop(tree: ast.FunctionDef, loop: Loop, names: Names) -> ast.If:
    """Put the call of :func:`~flatgather.sglang.patches.draft_prefill.runtime.rotate` (by
    ``names.rotate``), with the release's loop as its fallback, in place of
    the loop; returns the new ``if``::

        LENS_VAR = LENS
        END = rotate(src=SRC, ...) if takes(LENS_VAR) else None
        if END is None:
            for I, LEN in enumerate(LENS_VAR): ...   # the release's loop
        else:
            PT = END

    The lengths are evaluated once, first, as the release's ``for`` does;
    the loop's other expressions only where the release's loop iterates at
    least once, in the order its first iteration evaluates them."""
    node = loop.node

    def load(name: str) -> ast.Name:
        return ast.Name(name, ast.Load())

    def ref(key: str) -> ast.expr:
        return as_load(loop.ref(key))

    # Evaluated as the first iteration does: the source is sliced, then the
    # destination's slice is looked up before the cat of the tails (copy_),
    # or the cat comes before the store into the source (in place); then the
    # mm_input_embeds test, and their destination.
    keywords = [("src", ref("SRC"))]
    if loop.in_place:
        keywords += [("tails", ref("TAILS")), ("dst", ref("DST"))]
    else:
        keywords += [("dst", ref("DST")), ("tails", ref("TAILS"))]
    if loop.rotates_mm:
        # MM_DST exists only where the release's loop would write it.
        mm_dst = ast.IfExp(
            test=ast.Compare(ref("MM"), [ast.IsNot()], [ast.Constant(None)]),
            body=ref("MM_DST"),
            orelse=ast.Constant(None),
        )
        keywords += [("mm", ref("MM")), ("mm_dst", mm_dst)]
    else:
        keywords += [("mm", ast.Constant(None)), ("mm_dst", ast.Constant(None))]
    keywords += [("lens", load(names.lens)), ("pt", load(loop.name("PT")))]
    lens = ast.Assign(targets=[ast.Name(names.lens, ast.Store())], value=ref("LENS"))
    call = ast.Assign(
        targets=[ast.Name(names.end, ast.Store())],
        value=ast.IfExp(
            test=ast.Call(load(names.takes), [load(names.lens)], []),
            body=ast.Call(load(names.rotate), [], [ast.keyword(k, v) for k, v in keywords]),
            orelse=ast.Constant(None),
        ),
    )
    branch = ast.If(
        test=ast.Compare(load(names.end), [ast.Is()], [ast.Constant(None)]),
        body=[ast.Pass()],
        orelse=[ast.Assign([ast.Name(loop.name("PT"), ast.Store())], load(names.end))],
    )
    for new in (lens, call, branch):
        _placed(new, node)
    node.iter.args[0] = _placed(load(names.lens), node.iter.args[0])
    branch.body = [node]
    _splice(tree, node, [lens, call, branch])
    return branch


def _is_init_new(stmt: ast.AST) -> bool:
    return (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == "init_new"
        and isinstance(stmt.value.func.value, ast.Name)
        and stmt.value.func.value.id == "ForwardBatch"
    )


def _sets_no_logprob(stmt: ast.AST, target: str | None = None) -> bool:
    """``<target>.return_logprob = False`` (any variable when target is None)."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
        return False
    lhs = stmt.targets[0]
    return (
        isinstance(lhs, ast.Attribute)
        and lhs.attr == "return_logprob"
        and isinstance(lhs.value, ast.Name)
        and target in (None, lhs.value.id)
        and isinstance(stmt.value, ast.Constant)
        and stmt.value.value is False
    )


def _sets_logprob(stmt: ast.AST, target: str) -> bool:
    """Any assignment to ``<target>.return_logprob``."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else []
    if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        targets = [stmt.target]
    return any(
        isinstance(t, ast.Attribute)
        and t.attr == "return_logprob"
        and isinstance(t.value, ast.Name)
        and t.value.id == target
        for t in targets
    )


def add_no_logprob(tree: ast.FunctionDef) -> bool | str:
    """Insert ``<fb>.return_logprob = False`` right after ``<fb> =
    ForwardBatch.init_new(...)`` where the method lacks it. True when
    inserted, False when the method has it, else why it cannot be."""
    statements = [n for n in walk_scope(tree) if isinstance(n, ast.stmt)]
    inits = [s for s in statements if _is_init_new(s)]
    if len(inits) != 1:
        if any(_sets_no_logprob(s) for s in statements):
            return False
        return f"expected one `<fb> = ForwardBatch.init_new(...)` statement, found {len(inits)}"
    init = inits[0]
    fb = init.targets[0].id
    if any(_sets_no_logprob(s, fb) and s.lineno > init.lineno for s in statements):
        return False
    if any(_sets_logprob(s, fb) for s in statements):
        # The method decides the draft forward's logprobs itself: a False
        # inserted before its own assignment would be overwritten.
        return f"it sets {fb}.return_logprob itself, to something other than False"
    fix = ast.Assign(
        [ast.Attribute(ast.Name(fb, ast.Load()), "return_logprob", ast.Store())],
        ast.Constant(False),
    )
    _splice(tree, init, [init, _placed(fix, init)])
    return True
