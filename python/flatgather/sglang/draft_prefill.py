"""The V2 draft worker's prefill: ``EagleDraftWorker._draft_extend_for_prefill``
with its per-request rotation loop replaced by one plan and one gather.

Before the draft model's prefill forward, the method shifts each request's
``input_ids`` left by one and appends the request's tail token (the token the
target sampled or, for a chunk of a chunked prefill, the next prompt token),
one request at a time: a slice, a ``torch.cat`` and a copy per request, two
kernel launches each on a GPU. Since 0.5.20 it rotates ``mm_input_embeds``
the same way. flatgather builds the whole rotation index in Rust
(:class:`flatgather._core.RotationPlan`), stages it with one host-to-device
copy and gathers with one ``index_select`` over ``cat(input_ids, tails)``
(and one over ``mm_input_embeds``), whatever the batch size.

How the method is changed, and why this way
-------------------------------------------
The loop sits in the middle of a long method whose other lines differ from
release to release (spec-info classes, capture modes, KV-slot plans, canary
contexts, DSA seeding, ...). Copying the method into flatgather would freeze
one release's version of all of them. Instead :func:`prepare` rewrites the
installed function's own syntax tree:

1. :func:`flatgather.sglang.source.parse_method` reads the method's source and
   proves that it compiles to the very code object that runs.
2. A small structural matcher finds the rotation loop, in whichever of the
   shapes the releases use (in place into ``batch.input_ids``; into a new
   tensor the release allocated; with or without the ``mm_input_embeds``
   rotation), binding each placeholder (the lengths, the source, the
   destination, the tails, the loop's names) consistently. Any other shape,
   or a loop whose own names are read elsewhere in the method, leaves the
   rotation stock, with a note saying why.
3. Only that ``for`` statement is replaced::

       lens = LENS
       end = flatgather_rotate(src=SRC, ..., lens=lens, pt=pt) if flatgather_takes(lens) else None
       if end is None:
           <the release's for statement, iterating ``lens``>
       else:
           pt = end

   The lengths are evaluated once, as the release's ``for`` evaluates them;
   the source, tails and destinations only where the release's loop would
   iterate at least once (:func:`takes`: two requests or more), in the order
   its first iteration evaluates them.

   :func:`rotate` takes only inputs it reproduces exactly (positive lengths
   that sum to the rows of ``input_ids``, one tail per request, one device,
   and so on); for anything else it returns None before touching a tensor and
   the release's own loop runs; so it does under ``torch.compile`` and
   while a CUDA stream is capturing a graph. Every other line of the method, the tail
   tokens of ``_eagle_prefill_tail_tokens`` included, runs as shipped, with
   the release's line numbers in tracebacks.
4. Before anything is patched, the release's block (the statements of the
   method up to the one holding the loop) and the rewritten block are
   compiled on their own and run side by side on small CPU batches (one
   request, lengths of one, several requests, a chunked request, padding and
   zero lengths that must fall back, an idle batch, with and without
   ``mm_input_embeds``). A difference in the ids, in the ``mm_input_embeds``
   rows the release defines, or in which tensor object ends up where (in
   place or new) leaves the rotation stock, with a note naming it; so does a
   case where the gather should apply and does not. It costs a few
   milliseconds.

The same rewrite carries the second fix of SGLang PR #21589 to releases that
lack it (0.5.10): when no ``<fb>.return_logprob = False`` follows
``<fb> = ForwardBatch.init_new(...)``, that statement is inserted right after
it, so the draft forward does not compute logprobs the target batch asked
for. Either change can be refused on its own; both go into one rebuilt
function, one :class:`~flatgather.sglang.patching.Patch`.
"""

from __future__ import annotations
import __future__

import ast
import copy
import functools
import operator
import types
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from flatgather._core import RotationPlan
from flatgather._staging import stage
from flatgather.sglang import source
from flatgather.sglang.patching import Patch, Prepared

__all__ = ["BACKPORT", "MODULE", "ROTATION", "DraftPatch", "prepare", "rotate", "takes"]

MODULE = "sglang.srt.speculative.eagle_worker_v2"
OWNER = "EagleDraftWorker"
METHOD = "_draft_extend_for_prefill"
WHERE = f"{OWNER}.{METHOD}"

ROTATION = "draft-prefill-rotation"
"""The per-request loop replaced by one plan and one gather."""
BACKPORT = "draft-prefill-no-logprob"
"""SGLang PR #21589's second fix: the draft forward without logprobs."""


DraftPatch = Prepared
"""What :func:`prepare` returns (see :class:`~flatgather.sglang.patching.Prepared`)."""


# --- the gather that replaces the loop ----------------------------------------------------


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _as_list(lens):
    # A tensor of lengths is iterated element by element by the release (one
    # sync each on a GPU); one ``tolist`` reads them all.
    if isinstance(lens, torch.Tensor):
        return lens.tolist() if lens.dim() == 1 else None
    if isinstance(lens, (list, tuple)):
        return lens
    return None


def takes(lens) -> bool:
    """Whether :func:`rotate` may take lengths ``lens`` (a list or tuple, or
    a 1-D tensor, of two or more): the rewritten method evaluates the loop's
    other expressions for :func:`rotate` only then, when the release's loop
    too would evaluate them (it iterates at least once). Anything else goes
    to the release's loop, which evaluates what it evaluates."""
    if isinstance(lens, (list, tuple)):
        return len(lens) >= 2
    return isinstance(lens, torch.Tensor) and lens.dim() == 1 and lens.shape[0] >= 2


def rotate(src, lens, tails, dst, mm, mm_dst, pt) -> int | None:
    """Write the rotated ``src`` into ``dst`` and, when ``mm`` is given, the
    rotated ``mm`` into ``mm_dst``, as the release's loop does, and return the
    loop's final ``pt``; or return None, having touched nothing, for any input
    this does not reproduce exactly (the release's loop then runs).

    Row ``j`` of request ``i`` takes row ``j + 1`` of its request, and its last
    row takes ``tails[i]`` (cast to ``src``'s dtype, as the release's copy
    casts it). ``dst`` may be ``src`` itself (the releases that rotate in
    place). The last row of each request of ``mm_dst`` is left to whatever the
    gather puts there: the release leaves it unwritten.
    """
    if torch.compiler.is_compiling():
        return None  # compiled code traces the release's loop: no graph break
    if type(pt) is not int or pt != 0:
        return None
    if isinstance(lens, (list, tuple)) and len(lens) < 2:
        # One request: the release's loop is a slice, a cat and a copy, which
        # the plan, its copy and the gather cannot beat. Decided first, so
        # that handing it back costs next to nothing.
        return None
    if not (
        isinstance(src, torch.Tensor)
        and isinstance(tails, torch.Tensor)
        and isinstance(dst, torch.Tensor)
    ):
        return None
    if src.dim() != 1 or tails.dim() != 1 or dst.shape != src.shape or dst.dtype != src.dtype:
        return None
    if tails.dtype != src.dtype and not (_integer(tails.dtype) and _integer(src.dtype)):
        return None  # a cast the release's cat + copy might do differently
    device = src.device
    if tails.device != device or dst.device != device or not dst.is_contiguous():
        return None
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # A CUDA graph must not capture a copy from our reused host buffers.
        return None
    if dst is not src and _shares_memory(dst, src):
        return None
    if mm is not None:
        if not (isinstance(mm, torch.Tensor) and isinstance(mm_dst, torch.Tensor)):
            return None
        if mm.dim() == 0 or mm.shape[0] != src.shape[0] or mm_dst.shape != mm.shape:
            return None
        if mm_dst.dtype != mm.dtype or mm.device != device or mm_dst.device != device:
            return None
        if not mm_dst.is_contiguous() or _shares_memory(mm_dst, mm):
            return None
        if torch.is_grad_enabled() and (mm.requires_grad or mm_dst.requires_grad):
            return None  # out= refuses autograd
    values = _as_list(lens)
    if values is None:
        return None
    try:
        plan = RotationPlan(values, src.shape[0])
    except Exception:  # zero, negative or non-integer lengths, a wrong total: the release's loop
        return None
    if plan.batch_size < 2 or tails.shape[0] != plan.batch_size:
        return None  # one request (lengths in a tensor), or a tail per request missing
    n = plan.num_tokens
    with_mm = mm is not None
    index = stage(plan.buffer_len(with_mm), lambda out: plan.fill(out, with_mm), device)
    if tails.dtype != src.dtype:
        tails = tails.to(src.dtype)
    torch.index_select(torch.cat((src, tails)), 0, index[:n] if with_mm else index, out=dst)
    if with_mm:
        torch.index_select(mm, 0, index[n:], out=mm_dst)
    return pt + n


# --- a structural matcher over the syntax tree -----------------------------------------------

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


def _key(node: ast.AST) -> str:
    """The expression, whatever its context and place in the file."""
    return ast.dump(_load(node), annotate_fields=False)


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
class _Loop:
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


def _rotation_shape(loop: ast.For) -> _Loop | str | None:
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
    return _Loop(loop, binds, in_place, rotates_mm)


# --- scopes and places -----------------------------------------------------------------------

_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _walk_scope(root: ast.AST, skip: ast.AST | None = None) -> Iterator[ast.AST]:
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


def _top_index(tree: ast.FunctionDef, target: ast.AST) -> int:
    """The index of the statement of the method's body that holds ``target``."""
    return next(i for i, stmt in enumerate(tree.body) if _contains(stmt, target))


def _splice(tree: ast.AST, target: ast.stmt, replacement: list[ast.stmt]) -> None:
    for node in ast.walk(tree):
        for _, value in ast.iter_fields(node):
            if isinstance(value, list) and any(item is target for item in value):
                i = next(i for i, item in enumerate(value) if item is target)
                value[i : i + 1] = replacement
                return
    raise LookupError("statement not found")


def _load(expr: ast.expr) -> ast.expr:
    expr = copy.deepcopy(expr)
    for n in ast.walk(expr):
        if hasattr(n, "ctx"):
            n.ctx = ast.Load()
    return expr


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


# --- finding and rewriting -------------------------------------------------------------------


def _find_loop(method: source.Method, tree: ast.FunctionDef) -> _Loop | str:
    """The one rotation loop of ``tree`` (a copy of the method's tree), or
    why there is none to replace."""
    found, problems = [], []
    for node in _walk_scope(tree):
        if isinstance(node, ast.For):
            shape = _rotation_shape(node)
            if isinstance(shape, _Loop):
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
    for node in _walk_scope(tree, skip=loop.node):
        if isinstance(node, (ast.Global, ast.Nonlocal)) and own & set(node.names):
            return f"line {node.lineno} declares the loop's variables global or nonlocal"
        if isinstance(node, ast.Name) and node.id in own and not isinstance(node.ctx, ast.Store):
            return (
                f"line {node.lineno} reads `{node.id}`, which the loop binds and the gather "
                "would not"
            )
    return loop


@dataclass(frozen=True)
class _Names:
    """The fresh names the rewrite introduces."""

    rotate: str
    takes: str
    lens: str
    end: str


def _replace_loop(tree: ast.FunctionDef, loop: _Loop, names: _Names) -> ast.If:
    """Put the call of :func:`rotate`, with the release's loop as its
    fallback, in place of the loop; returns the new ``if``::

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
        return _load(loop.ref(key))

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


def _add_no_logprob(tree: ast.FunctionDef) -> bool | str:
    """Insert ``<fb>.return_logprob = False`` right after ``<fb> =
    ForwardBatch.init_new(...)`` where the method lacks it. True when
    inserted, False when the method has it, else why it cannot be."""
    statements = [n for n in _walk_scope(tree) if isinstance(n, ast.stmt)]
    inits = [s for s in statements if _is_init_new(s)]
    if len(inits) != 1:
        if any(_sets_no_logprob(s) for s in statements):
            return False
        return f"expected one `<fb> = ForwardBatch.init_new(...)` statement, found {len(inits)}"
    init = inits[0]
    fb = init.targets[0].id
    if any(_sets_no_logprob(s, fb) and s.lineno > init.lineno for s in statements):
        return False
    fix = ast.Assign(
        [ast.Attribute(ast.Name(fb, ast.Load()), "return_logprob", ast.Store())],
        ast.Constant(False),
    )
    _splice(tree, init, [init, _placed(fix, init)])
    return True


# --- the check against the release's own block -----------------------------------------------

# (extend lengths, index of the chunked request or None, rows past the tokens,
# whether the gather must apply): the last two go to the release's loop.
_CASES = (
    ([5], None, 0, False),  # one request: the release's loop is as cheap
    ([1, 1, 1], None, 0, True),  # lengths of one: nothing but the tails
    ([3, 1, 4, 2], None, 0, True),
    ([3, 4, 2], 1, 0, True),  # a chunked request: its tail is its next prompt token
    ([2, 3], None, 2, False),  # rows past the tokens
    ([2, 0, 3], None, 0, False),  # a request of length zero
)
_NEXT_PROMPT_TOKEN = 977
# (ids, tails): as SGLang has them, tails as the sampler returns them, and the reverse.
_DTYPES = ((torch.int64, torch.int64), (torch.int64, torch.int32), (torch.int32, torch.int64))


_FACTORY = "flatgather_block_factory"
_FUTURE_FLAGS = functools.reduce(
    operator.or_, (getattr(__future__, f).compiler_flag for f in __future__.all_feature_names)
)
_TYPE_PARAMS = {"type_params": []} if "type_params" in ast.FunctionDef._fields else {}


class _ProbeBatch(types.SimpleNamespace):
    """What the block reads of a batch (``ScheduleBatch`` or
    ``ModelWorkerBatch``), under both names the releases give the lengths."""


class _Counting:
    """:func:`rotate`, counting the calls where the gather applied."""

    def __init__(self) -> None:
        self.applied = 0

    def __call__(self, **kwargs):
        end = rotate(**kwargs)
        self.applied += end is not None
        return end


def _block_function(method: source.Method, body: list[ast.stmt], closure: dict):
    """``body`` (the method's first statements) compiled as a function of the
    method's parameters that returns its locals, with the module's globals.

    As :func:`flatgather.sglang.source.build_method` compiles, minus what only
    the bytecode comparison needs (the module's imports) and minus the
    parameters' annotations and defaults (every argument is passed): a
    fraction of the cost, the same behaviour.
    """
    owner = method.owner.__name__
    params = [ast.arg(a.arg) for a in (*method.tree.args.posonlyargs, *method.tree.args.args)]
    block = ast.FunctionDef(
        name=method.name,
        args=ast.arguments(posonlyargs=[], args=params, kwonlyargs=[], kw_defaults=[], defaults=[]),
        # Shared, not copied: compiling leaves a tree as it is.
        body=[*body, ast.Return(ast.Call(ast.Name("locals", ast.Load()), [], []))],
        decorator_list=[],
        **_TYPE_PARAMS,
    )
    # Inside a class of the method's own name, as the method is: the same
    # name mangling of private names.
    cls = ast.ClassDef(
        name=owner, bases=[], keywords=[], body=[block], decorator_list=[], **_TYPE_PARAMS
    )
    lookup = ast.Subscript(
        ast.Call(ast.Name("vars", ast.Load()), [ast.Name(owner, ast.Load())], []),
        ast.Constant(method.name),
        ast.Load(),
    )
    factory = ast.FunctionDef(
        name=_FACTORY,
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(n) for n in closure],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=[cls, ast.Return(lookup)],
        decorator_list=[],
        **_TYPE_PARAMS,
    )
    module = ast.fix_missing_locations(
        ast.Module([ast.copy_location(factory, method.tree)], type_ignores=[])
    )
    function = method.function
    flags = function.__code__.co_flags & _FUTURE_FLAGS
    code = compile(module, function.__code__.co_filename, "exec", flags=flags, dont_inherit=True)
    make = next(c for c in code.co_consts if getattr(c, "co_name", None) == _FACTORY)
    return types.FunctionType(make, function.__globals__)(*closure.values())


def _blocks(method: source.Method, rewritten: ast.FunctionDef, k: int, branch, closure: dict):
    """The release's block (its statements up to the ``k``-th, which holds
    the loop) and the rewritten one (up to ``branch``, the call of the gather
    and its fallback), each compiled by :func:`_block_function`."""
    stock = _block_function(method, method.tree.body[: k + 1], {})
    ours = _block_function(method, rewritten.body[: _top_index(rewritten, branch) + 1], closure)
    return stock, ours


def _probe_inputs(lens, chunked, pad, mode, with_mm, dtypes, seed):
    gen = torch.Generator().manual_seed(seed)
    rows = sum(lens) + pad
    reqs = [object() for _ in lens]
    batch = _ProbeBatch(
        forward_mode=mode,
        input_ids=torch.randint(0, 1000, (rows,), generator=gen).to(dtypes[0]),
        extend_lens=list(lens),
        extend_seq_lens=list(lens),
        seq_lens=torch.tensor(lens, dtype=torch.int64),
        reqs=reqs,
        chunked_req=None if chunked is None else reqs[chunked],
        chunked_req_next_prompt_token=None if chunked is None else _NEXT_PROMPT_TOKEN,
        return_logprob=True,
    )
    tails = torch.randint(1000, 2000, (len(lens),), generator=gen).to(dtypes[1])
    embeds = torch.randn(rows, 3, generator=gen) if with_mm else None
    objects = {"batch.input_ids": batch.input_ids, "next_token_ids": tails}
    objects |= {f"batch.reqs[{i}]": r for i, r in enumerate(reqs)}
    if embeds is not None:
        objects["mm_input_embeds"] = embeds
    return batch, tails, embeds, objects


def _snapshot(value, objects: dict, mask: torch.Tensor | None = None):
    """``value`` in terms :func:`first_difference` compares across runs: an
    input object by its name, a new tensor by its bytes (only the rows of
    ``mask``), a batch by its attributes."""
    name = next((k for k, v in objects.items() if v is value), None)
    if isinstance(value, torch.Tensor):
        if name is None and mask is not None and value.shape[:1] == mask.shape:
            value = value[mask]
        return {"object": name or "new", "values": value.detach().clone()}
    if name is not None:
        return name
    if isinstance(value, types.SimpleNamespace):
        return {k: _snapshot(v, objects) for k, v in vars(value).items()}
    if isinstance(value, (list, tuple)):
        return [_snapshot(v, objects) for v in value]
    return value


def _verify(
    method: source.Method, loop: _Loop, rewritten: ast.FunctionDef, k: int, branch, names: _Names
) -> str | None:
    """None when the rewritten block does what the release's does on every
    probe case (and the gather applies where it should); else what differs."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from flatgather.sglang.compare import first_difference

    tree = method.tree
    a = tree.args
    params = [arg.arg for arg in (*a.posonlyargs, *a.args)]
    if a.vararg or a.kwonlyargs or a.kwarg or params[:1] != ["self"]:
        return "the method's parameters are not plain positional ones after self"
    if not {"batch", "next_token_ids"} <= set(params):
        return f"the method's parameters {params} lack batch or next_token_ids"
    counting = _Counting()
    stock, ours = _blocks(
        method, rewritten, k, branch, {names.rotate: counting, names.takes: takes}
    )
    live = {
        n.id
        for stmt in tree.body[k + 1 :]
        for n in ast.walk(stmt)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    rotated = {loop.local("MM"), loop.local("MM_DST")} - {None} if loop.rotates_mm else set()
    # Each case once, mm_input_embeds present in every other one; where the
    # loop rotates them, every case the gather takes both with and without.
    runs = [
        (case, ForwardMode.EXTEND, with_mm, _DTYPES[n % len(_DTYPES)])
        for n, case in enumerate(_CASES)
        for with_mm in ((False, True) if loop.rotates_mm and case[3] else (n % 2 == 1,))
    ]
    runs.append((([2, 2], None, 0, False), ForwardMode.IDLE, True, _DTYPES[0]))
    applied = 0
    for seed, (case, mode, with_mm, dtypes) in enumerate(runs):
        lens, chunked, pad, gathers = case
        where = (
            f"the {mode.name} batch of lengths {lens}"
            f"{', one chunked' if chunked is not None else ''}"
            f"{f', {pad} rows past the tokens' if pad else ''}, "
            f"{'with' if with_mm else 'no'} mm_input_embeds, ids {dtypes[0]}, tails {dtypes[1]}"
        )
        mask = torch.ones(sum(lens) + pad, dtype=torch.bool)
        mask[torch.tensor(lens).cumsum(0) - 1] = False  # each request's last row: unwritten
        outcomes = []
        for fn in (stock, ours):
            batch, tails, embeds, objects = _probe_inputs(*case[:3], mode, with_mm, dtypes, seed)
            args = dict.fromkeys(params)
            args.update(self=types.SimpleNamespace(), batch=batch, next_token_ids=tails)
            if "mm_input_embeds" in args:
                args["mm_input_embeds"] = embeds
            try:
                result = fn(*args.values())
            except Exception as exc:  # compared by type: the same failure, or none
                if fn is stock and gathers:
                    return f"the release's own block fails on {where}: {exc!r}"
                outcomes.append({"raised": type(exc).__name__})
                continue
            seen = {
                name: _snapshot(result[name], objects, mask if name in rotated else None)
                for name in sorted(live & result.keys())
            }
            seen["inputs afterwards"] = {
                name: _snapshot(obj, {})
                for name, obj in objects.items()
                if isinstance(obj, torch.Tensor)
            }
            outcomes.append(seen)
        found = first_difference(outcomes[1], outcomes[0], "locals")
        if found:
            return f"on {where}: {found}"
        if gathers and mode == ForwardMode.EXTEND:
            applied += 1
            if counting.applied != applied:
                return f"the gather did not apply on {where}"
    return None


# --- prepare ---------------------------------------------------------------------------------


def prepare(module) -> DraftPatch:
    """The patch of ``module``'s (``eagle_worker_v2``'s)
    ``EagleDraftWorker._draft_extend_for_prefill``: the rotation gather and,
    where the method lacks it, the ``return_logprob`` backport, each verified
    or refused on its own. Never raises: whatever cannot be done is a note,
    and the method stays stock."""
    try:
        return _prepare(module)
    except Exception as exc:
        return DraftPatch.refused(f"{WHERE} left stock: {type(exc).__name__}: {exc}")


def _prepare(module) -> DraftPatch:
    owner = getattr(module, OWNER, None)
    if not isinstance(owner, type):
        return DraftPatch.refused(f"{MODULE} has no class {OWNER}: nothing patched there")
    try:
        method = source.parse_method(owner, METHOD)
    except source.SourceMismatch as exc:
        return DraftPatch.refused(f"{WHERE} left stock: {exc}")
    if method.tree.decorator_list:
        return DraftPatch.refused(f"{WHERE} left stock: it is decorated")
    notes, applied, closure = [], [], {}
    taken = _taken_names(method)
    names = _Names(*(_fresh(f"flatgather_{n}", taken) for n in ("rotate", "takes", "lens", "end")))
    tree = copy.deepcopy(method.tree)
    loop = _find_loop(method, tree)
    problem = loop if isinstance(loop, str) else None
    if problem is None:
        k = _top_index(tree, loop.node)
        branch = _replace_loop(tree, loop, names)
        problem = _verify(method, loop, tree, k, branch, names)
        if problem is None:
            closure[names.rotate], closure[names.takes] = rotate, takes
            applied.append(ROTATION)
        else:
            problem = f"checked against the release's own loop, {problem}"
            tree = copy.deepcopy(method.tree)
    if problem is not None:
        notes.append(f"{WHERE}: the rotation loop left stock: {problem}")
    backport = _add_no_logprob(tree)
    if isinstance(backport, str):
        notes.append(f"{WHERE}: the return_logprob backport not applied: {backport}")
    elif backport:
        applied.append(BACKPORT)
    if not applied:
        return DraftPatch(notes=tuple(notes))
    function = source.build_method(method, tree, closure)
    return DraftPatch(
        patches=[Patch(owner, METHOD, function)],
        applied=tuple(applied),
        backports=(BACKPORT,) if BACKPORT in applied else (),
        notes=tuple(notes),
    )
