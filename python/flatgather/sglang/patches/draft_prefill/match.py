"""Where the rotation loop is: a structural matcher over the syntax tree of
``EagleDraftWorker._draft_extend_for_prefill`` that finds the release's
per-request loop in whichever of its shapes the releases use, binds its
parts (the lengths, the source, the destination, the tails, the loop's own
names), and says why when there is no loop it can replace.

What the rewrite does with a match is told in
:mod:`flatgather.sglang.patches.draft_prefill`.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
from dataclasses import dataclass

from flatgather.sglang import source

__all__ = ["NAMES", "REFS", "Loop", "as_load", "find_loop", "top_index", "walk_scope"]


# Templates of the loop's statements, matched node by node. A NAME placeholder
# matches a plain variable and binds its identifier; a REF placeholder matches
# a plain variable or an attribute chain on one (``batch.input_ids``) and
# binds the expression. A placeholder binds the same thing wherever it
# appears; any other name or constant must be there as written.
NAMES = ("I", "LEN", "TMP", "PT")
REFS = ("LENS", "SRC", "DST", "TAILS", "MM", "MM_DST")

_TEMPLATES = {
    key: ast.parse(text).body[0]
    for key, text in {
        "head": "for I, LEN in enumerate(LENS): pass",
        "take": "TMP = SRC[PT:PT + LEN]",
        "assign": "SRC[PT:PT + LEN] = torch.cat((TMP[1:], TAILS[I].reshape(1)))",
        "copy": "DST[PT:PT + LEN].copy_(torch.cat((TMP[1:], TAILS[I].reshape(1))))",
        "mm": "if MM is not None:\n    MM_DST[PT:PT + LEN - 1].copy_(MM[PT + 1:PT + LEN])",
        "step": "PT += LEN",
    }.items()
}
_IGNORED_FIELDS = frozenset({"ctx", "type_comment", "kind"})


class _NoMatch(Exception):
    pass


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def as_load(expr: ast.expr) -> ast.expr:
    """A copy of ``expr`` to be read (every context ``Load``)."""
    expr = copy.deepcopy(expr)
    for n in ast.walk(expr):
        if hasattr(n, "ctx"):
            n.ctx = ast.Load()
    return expr


def _key(node: ast.AST) -> str:
    """The expression, whatever its context and place in the file."""
    return ast.dump(as_load(node), annotate_fields=False)


def _match(pattern, node, binds: dict) -> None:
    if isinstance(pattern, ast.Name) and pattern.id in NAMES:
        if not isinstance(node, ast.Name) or binds.setdefault(pattern.id, node.id) != node.id:
            raise _NoMatch
    elif isinstance(pattern, ast.Name) and pattern.id in REFS:
        if not isinstance(_root(node), ast.Name):
            raise _NoMatch
        if binds.setdefault(pattern.id, (_key(node), node))[0] != _key(node):
            raise _NoMatch
    elif isinstance(pattern, list):
        if not isinstance(node, list) or len(pattern) != len(node):
            raise _NoMatch
        for p, n in zip(pattern, node, strict=True):
            _match(p, n, binds)
    elif isinstance(pattern, ast.AST):
        if type(node) is not type(pattern):
            raise _NoMatch
        for name in pattern._fields:
            if name not in _IGNORED_FIELDS:
                _match(getattr(pattern, name), getattr(node, name, None), binds)
    elif type(pattern) is not type(node) or pattern != node:
        raise _NoMatch


def _matches(pattern, node, binds: dict) -> bool:
    """Whether ``node`` matches ``pattern``; ``binds`` grows only on a match."""
    trial = dict(binds)
    try:
        _match(pattern, node, trial)
    except _NoMatch:
        return False
    binds.update(trial)
    return True


@dataclass
class Loop:
    """A rotation loop: its ``for`` statement, what each placeholder bound
    (the destination is the source where the loop rotates in place), and
    whether it rotates ``mm_input_embeds`` too."""

    node: ast.For
    binds: dict
    in_place: bool
    rotates_mm: bool

    def name(self, key: str) -> str:
        return self.binds[key]

    def ref(self, key: str) -> ast.expr:
        return self.binds[key][1]

    def local(self, key: str) -> str | None:
        """The variable a REF placeholder bound, when it is a plain one."""
        node = self.binds.get(key, (None, None))[1]
        return node.id if isinstance(node, ast.Name) else None


def _rotation_shape(loop: ast.For) -> Loop | str | None:
    """``loop`` as a rotation loop; None when its head is not ``for <i>,
    <len> in enumerate(<lengths>)``, else what differs."""
    binds: dict = {}
    head = _TEMPLATES["head"]
    if not (_matches(head.target, loop.target, binds) and _matches(head.iter, loop.iter, binds)):
        return None
    line = f"the loop at line {loop.lineno}"
    body = loop.body
    if loop.orelse:
        return f"{line} has an else clause"
    if len(body) not in (3, 4):
        return f"{line} has {len(body)} statements, not 3 or 4"
    if not _matches(_TEMPLATES["take"], body[0], binds):
        return f"line {body[0].lineno} is not `<tmp> = <ids>[<pt>:<pt> + <len>]`"
    in_place = _matches(_TEMPLATES["assign"], body[1], binds)
    if not in_place and not _matches(_TEMPLATES["copy"], body[1], binds):
        return (
            f"line {body[1].lineno} is neither `<ids>[<pt>:<pt> + <len>] = torch.cat((<tmp>[1:], "
            "<tails>[<i>].reshape(1)))` nor `<dst>[<pt>:<pt> + <len>].copy_(<the same cat>)`"
        )
    rotates_mm = len(body) == 4
    if rotates_mm and not _matches(_TEMPLATES["mm"], body[2], binds):
        return f"line {body[2].lineno} is not the `mm_input_embeds` rotation"
    if not _matches(_TEMPLATES["step"], body[-1], binds):
        return f"line {body[-1].lineno} is not `<pt> += <len>`"
    names = [binds[k] for k in NAMES]
    if len(set(names)) != len(names):
        return f"{line} gives one variable two roles ({', '.join(names)})"
    for key in REFS:
        if key in binds and _root(binds[key][1]).id in names:
            return f"{line}: `{ast.unparse(binds[key][1])}` changes inside the loop"
    if in_place:
        binds["DST"] = binds["SRC"]
    return Loop(loop, binds, in_place, rotates_mm)


# --- scopes and places -----------------------------------------------------------------------

_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def walk_scope(root: ast.AST, skip: ast.AST | None = None) -> Iterator[ast.AST]:
    """The nodes of the method's own scope under ``root``, without ``skip``'s
    subtree: nested functions and classes are yielded but not entered, and
    the variables a comprehension binds are not the method's."""
    stack = [(root, frozenset())]
    while stack:
        node, shadowed = stack.pop()
        if node is skip or (isinstance(node, ast.Name) and node.id in shadowed):
            continue
        yield node
        if node is not root and isinstance(node, _NESTED_SCOPES):
            continue
        if isinstance(node, _COMPREHENSIONS):
            shadowed |= {
                n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)
            }
        stack.extend((child, shadowed) for child in ast.iter_child_nodes(node))


def _contains(tree: ast.AST, target: ast.AST) -> bool:
    return any(n is target for n in ast.walk(tree))


def top_index(tree: ast.FunctionDef, target: ast.AST) -> int:
    """The index of the statement of the method's body that holds ``target``."""
    return next(i for i, stmt in enumerate(tree.body) if _contains(stmt, target))


# --- the one loop of the method --------------------------------------------------------------


def find_loop(method: source.Method, tree: ast.FunctionDef) -> Loop | str:
    """The one rotation loop of ``tree`` (a copy of the method's tree), or
    why there is none to replace."""
    found, problems = [], []
    for node in walk_scope(tree):
        if isinstance(node, ast.For):
            shape = _rotation_shape(node)
            if isinstance(shape, Loop):
                found.append(shape)
            elif shape is not None:
                problems.append(shape)
    if not found:
        return problems[0] if problems else "no `for <i>, <len> in enumerate(...)` loop"
    if len(found) > 1:
        lines = ", ".join(str(loop.node.lineno) for loop in found)
        return f"more than one loop of the rotation's shape (lines {lines})"
    loop = found[0]
    own = {loop.name("I"), loop.name("LEN"), loop.name("TMP")}
    shared = own & set(method.function.__code__.co_cellvars)
    if shared:
        return f"the loop's variables {sorted(shared)} are shared with a nested function"
    for node in walk_scope(tree, skip=loop.node):
        if isinstance(node, (ast.Global, ast.Nonlocal)) and own & set(node.names):
            return f"line {node.lineno} declares the loop's variables global or nonlocal"
        if isinstance(node, ast.Name) and node.id in own and not isinstance(node.ctx, ast.Store):
            return (
                f"line {node.lineno} reads `{node.id}`, which the loop binds and the gather "
                "would not"
            )
    return loop
