"""The shape of the release's method the #36938 patch knows: the
generation loop, its skip branch and the release's own advance of the
input-logprob cursor (:func:`find_shape`)."""

from __future__ import annotations

import ast
import copy
import types
from collections.abc import Iterable
from dataclasses import dataclass

from flatgather.sglang import source

COUNT = "calculate_num_input_logprobs"
"""The release's count of a request's input logprobs, the cursor's step (a
method whose name ends so: ``_calculate_num_input_logprobs`` up to 0.5.12)."""

# --- the shape of the method ------------------------------------------------------------------

_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _walk_scope(root: ast.AST):
    """The nodes of ``root``'s own scope: nested functions and classes are
    not entered."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        if node is root or not isinstance(node, _NESTED_SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _name(node: ast.AST | None) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _stored(nodes: Iterable[ast.AST]) -> set[str]:
    return {
        n.id
        for root in nodes
        for n in _walk_scope(root)
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))
    }


@dataclass
class _Loop:
    node: ast.For
    i: str
    req: str
    batch: str


def _loop_shape(node: ast.For) -> _Loop | None:
    """``for <i>, (<req>, <token>) in enumerate(zip(<batch>.reqs, ...))``."""
    t, it = node.target, node.iter
    if not (isinstance(t, ast.Tuple) and len(t.elts) == 2 and _name(t.elts[0])):
        return None
    inner = t.elts[1]
    if not (isinstance(inner, ast.Tuple) and len(inner.elts) == 2 and _name(inner.elts[0])):
        return None
    if not (isinstance(it, ast.Call) and _name(it.func) == "enumerate" and len(it.args) == 1):
        return None
    z = it.args[0]
    if not (isinstance(z, ast.Call) and _name(z.func) == "zip" and z.args):
        return None
    chain = _chain(z.args[0])
    if chain is None or len(chain) != 2 or chain[1] != "reqs":
        return None
    return _Loop(node, t.elts[0].id, inner.elts[0].id, chain[0])


def _reads(node: ast.AST, obj: str, attr: str) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr == attr and _name(n.value) == obj
        for n in ast.walk(node)
    )


@dataclass
class _Advance:
    """The release's advance of the cursor: ``<pt> += <count>(<req>,
    <lens>[<i>], <starts>[<i>])`` under ``guards``, in the method's names."""

    count: ast.expr
    lens: str
    starts: str
    pt: str
    guards: list[ast.expr]
    where: str


def _inline_advance(stmts: list[ast.stmt], req: str, i: str, self_name: str):
    """In one statement list: ``<len> = <lens>[<i>]``, ``<start> =
    <starts>[<i>]``, ``<num> = <count>(<req>, <len>, <start>)`` and, after
    it, ``<pt> += <num>``; as (count, lens, starts, pt) or None."""
    subscripts = {}
    for k, stmt in enumerate(stmts):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            continue
        target, value = _name(stmt.targets[0]), stmt.value
        if target is None:
            continue
        if isinstance(value, ast.Subscript) and _name(value.slice) == i and _name(value.value):
            subscripts[target] = value.value.id
            continue
        if not (isinstance(value, ast.Call) and len(value.args) == 3 and not value.keywords):
            continue
        chain = _chain(value.func)
        if chain is None or chain[0] != self_name or not chain[-1].endswith(COUNT):
            continue
        r, n, s = (_name(a) for a in value.args)
        if r != req or n not in subscripts or s not in subscripts:
            continue
        for later in stmts[k + 1 :]:
            if (
                isinstance(later, ast.AugAssign)
                and isinstance(later.op, ast.Add)
                and _name(later.target)
                and _name(later.value) == target
            ):
                return value.func, subscripts[n], subscripts[s], later.target.id
    return None


def _bind_call(call: ast.Call, tree: ast.FunctionDef) -> dict[str, ast.expr] | None:
    """The helper's parameters (after ``self``) bound to the call's
    arguments; None when they do not bind plainly."""
    a = tree.args
    positional = [p.arg for p in (*a.posonlyargs, *a.args)][1:]
    if a.vararg or a.kwarg or len(call.args) > len(positional):
        return None
    if any(isinstance(x, ast.Starred) for x in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return None
    bound = dict(zip(positional, call.args, strict=False))
    names = set(positional) | {p.arg for p in a.kwonlyargs}
    for kw in call.keywords:
        if kw.arg not in names or kw.arg in bound:
            return None
        bound[kw.arg] = kw.value
    return bound


def _helper_advance(
    owner: type, call: ast.Call, pt: str, loop: _Loop, self_name: str
) -> tuple | str | None:
    """``<pt> = self.<helper>(...)`` where the helper's own top-level
    statements hold the inline advance of its cursor parameter and it ends
    with ``return <that parameter>``."""
    chain = _chain(call.func)
    if chain is None or len(chain) != 2 or chain[0] != self_name:
        return None
    helper = chain[1]
    if not isinstance(vars(owner).get(helper), types.FunctionType):
        return None
    try:
        tree = source.parse_method(owner, helper).tree
    except source.SourceMismatch as exc:
        return f"its helper {helper}: {exc}"
    bound = _bind_call(call, tree)
    params = [p.arg for p in (*tree.args.posonlyargs, *tree.args.args)]
    if bound is None or not params:
        return None
    rev = {p: _name(v) for p, v in bound.items()}
    req_p = next((p for p, v in rev.items() if v == loop.req), None)
    i_p = next((p for p, v in rev.items() if v == loop.i), None)
    if req_p is None or i_p is None:
        return None
    found = _inline_advance(tree.body, req_p, i_p, params[0])
    if found is None:
        return None
    count, lens_p, starts_p, pt_p = found
    last = tree.body[-1]
    if not (isinstance(last, ast.Return) and _name(last.value) == pt_p) or rev.get(pt_p) != pt:
        return None
    stores = [
        n
        for n in _walk_scope(tree)
        if isinstance(n, ast.Name) and n.id == pt_p and isinstance(n.ctx, ast.Store)
    ]
    if len(stores) != 1:
        return None  # the cursor moves elsewhere in the helper too
    lens, starts = rev.get(lens_p), rev.get(starts_p)
    if lens is None or starts is None:
        return None
    count = copy.deepcopy(count)
    root = count
    while isinstance(root, ast.Attribute):
        root = root.value
    root.id = self_name
    return count, lens, starts, pt, helper


def _find_advance(owner, stmts, guards, loop: _Loop, self_name: str) -> _Advance | str | None:
    """The release's advance in the branch ``stmts``, through nested
    ``if``\\ s (their tests become the guards)."""
    found = _inline_advance(stmts, loop.req, loop.i, self_name)
    if found is not None:
        return _Advance(*found, list(guards), "inline")
    for stmt in stmts:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and _name(stmt.targets[0])
            and isinstance(stmt.value, ast.Call)
        ):
            helper = _helper_advance(owner, stmt.value, stmt.targets[0].id, loop, self_name)
            if isinstance(helper, str):
                return helper
            if helper is not None:
                count, lens, starts, pt, name = helper
                return _Advance(count, lens, starts, pt, list(guards), f"{name}()")
        if isinstance(stmt, ast.If):
            for body, test in ((stmt.body, stmt.test), (stmt.orelse, None)):
                negated = ast.UnaryOp(ast.Not(), copy.deepcopy(stmt.test))
                inner = _find_advance(
                    owner, body, [*guards, test if test is not None else negated], loop, self_name
                )
                if inner is not None:
                    return inner
    return None


_PURE = (
    ast.Name,
    ast.Attribute,
    ast.Constant,
    ast.BoolOp,
    ast.UnaryOp,
    ast.Compare,
    ast.Load,
    ast.And,
    ast.Or,
    ast.Not,
    ast.cmpop,
)


@dataclass
class Shape:
    loop: _Loop
    skip: ast.If
    advance: _Advance


def find_shape(owner: type, tree: ast.FunctionDef) -> Shape | str:
    params = [p.arg for p in (*tree.args.posonlyargs, *tree.args.args)]
    if not params:
        return "it has no self parameter"
    self_name = params[0]
    loops = [s for n in _walk_scope(tree) if isinstance(n, ast.For) and (s := _loop_shape(n))]
    loops = [lp for lp in loops if any(_reads(s, lp.req, "is_retracted") for s in lp.node.body)]
    if len(loops) != 1:
        return (
            "expected one loop `for <i>, (<req>, <token>) in enumerate(zip(<batch>.reqs, ...))` "
            f"that skips retracted requests, found {len(loops)}"
        )
    loop = loops[0]
    skips = [
        (k, s)
        for k, s in enumerate(loop.node.body)
        if isinstance(s, ast.If) and _reads(s.test, loop.req, "is_retracted")
    ]
    if len(skips) != 1:
        return f"the loop at line {loop.node.lineno} has {len(skips)} tests of is_retracted, not 1"
    k, skip = skips[0]
    if skip.orelse or len(skip.body) != 1 or not isinstance(skip.body[0], ast.Continue):
        return f"the skip branch at line {skip.lineno} does more than `continue`"
    branches = [
        s
        for s in loop.node.body[k + 1 :]
        if isinstance(s, ast.If)
        and isinstance(s.test, ast.Compare)
        and _name(getattr(s.test.left, "value", None)) == loop.req
        and len(s.test.ops) == 1
        and isinstance(s.test.ops[0], ast.LtE)
        and isinstance(s.test.comparators[0], ast.Constant)
        and s.test.comparators[0].value == 0
        and s.orelse
    ]
    if len(branches) != 1:
        return (
            f"expected one `if {loop.req}.<chunks> <= 0: ... else: ...` after the skip branch, "
            f"found {len(branches)}"
        )
    advance = _find_advance(owner, branches[0].body, [], loop, self_name)
    if advance is None:
        return (
            f"no `<pt> += {COUNT}(...)` of the request's extend and start found in the branch "
            f"at line {branches[0].lineno}, inline or in a helper that returns the cursor"
        )
    if isinstance(advance, str):
        return advance
    body_stores = _stored(loop.node.body)
    ours = {advance.lens, advance.starts, self_name}
    if ours & body_stores:
        return f"the loop rebinds {', '.join(sorted(ours & body_stores))}"
    before = _stored(s for s in tree.body if s.lineno < loop.node.lineno)
    missing = {advance.lens, advance.starts, advance.pt} - before - set(params)
    if missing:
        return f"{', '.join(sorted(missing))} not bound before the loop"
    targets = {loop.i, loop.req, _name(loop.node.target.elts[1].elts[1])}
    for guard in advance.guards:
        if not all(isinstance(n, _PURE) for n in ast.walk(guard)):
            return f"the advance's condition `{ast.unparse(guard)}` is not a plain test"
        names = {n.id for n in ast.walk(guard) if isinstance(n, ast.Name)}
        if names & (body_stores - targets):
            return f"the advance's condition `{ast.unparse(guard)}` reads names the loop binds"
    return Shape(loop, skip, advance)
