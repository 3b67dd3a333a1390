"""The rewrite of the chain's methods: each per-row comprehension over the
logprob lists found (by its shape: a host copy or a ``.tolist()``) and
replaced by one call of flatgather's helper, which takes the release's own
element expression as a lambda; and the proof that nothing else changed
(the rewritten tree, each call turned back into its comprehension, is the
release's)."""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

__all__ = ["FIELDS", "TOLIST", "TO_HOST", "Rewrite", "helper_call", "rewrite"]

FIELDS = frozenset(
    {
        "next_token_top_logprobs_val",
        "next_token_top_logprobs_idx",
        "next_token_token_ids_logprobs_val",
    }
)
"""The logprob lists whose per-row comprehensions are replaced."""
TO_HOST = "__flatgather_rows_to_host__"
TOLIST = "__flatgather_rows_tolist__"
"""The names a rebuilt method calls flatgather's helpers by, one per kind
of comprehension (the host copy, the ``.tolist()``)."""


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


def helper_call(node, v: str) -> str | None:
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
    if helper_call(node, v) is not None:
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
