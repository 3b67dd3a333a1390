"""The scheduler's prefill results: ``process_batch_result_prefill`` with the
input-logprob cursor advanced over the requests it skips (SGLang issue
#36938).

``logits_output.input_token_logprobs`` holds one block of rows per request of
the batch, in batch order, whether or not that request asked for logprobs.
The method walks it with a cursor, ``logprob_pt``, which each request's
branch advances by the release's own count
(``calculate_num_input_logprobs``). The branch that skips a request that
finished in a mixed batch or was retracted ``continue``\\ s before the cursor
moves, so every later request of the batch is served another request's input
logprobs. Nothing raises.

Where it lives: ``SchedulerOutputProcessorMixin`` (0.5.10 to 0.5.12, which
``Scheduler`` inherits) and ``SchedulerBatchResultProcessor`` (0.5.13 on, an
instance of which the scheduler holds as ``batch_result_processor``). Both
are patched on the class, which is what the scheduler calls.

How, and why this way
---------------------
As :mod:`flatgather.sglang.draft_prefill` does, :func:`prepare` rewrites the
release's own syntax tree and changes one thing:

1. The release's method is driven first, with stand-ins for everything it
   hands its requests to (see :class:`Harness`), on a batch with a retracted
   and a batch with a finished request in the middle: when the request after
   it gets what it gets from the same batch without the skipped one, the
   release advances the cursor itself and its method is left as it is.
2. :func:`flatgather.sglang.source.parse_method` proves that the parsed
   source is the code that runs.
3. A matcher finds the generation loop (``for i, (req, ...) in
   enumerate(zip(batch.reqs, ...))``), its skip branch (an ``if`` reading
   ``req.is_retracted`` whose body is ``continue``) and, in the branch that
   finishes a prefill, the release's own advance: ``num =
   <count>(req, lens[i], starts[i])`` then ``pt += num``, inline or in a
   helper method that returns the cursor (``_apply_prefill_logprobs``), and
   the conditions it runs under (``batch.return_logprob``).
4. Only the skip branch changes: before its ``continue``::

       if <those conditions> and <lens> is not None and <starts> is not None:
           <pt> += <count>(req, <lens>[i], <starts>[i])

   The chunked branch's guard (``start < extend``) is not repeated: with the
   start never past the extend, as SGLang builds the batch, it changes
   nothing the count gives.
5. Before anything is patched, the rewritten method and the release's run on
   small stand-in batches (a skipped request first, in the middle, last, two
   in a row, a retracted middle chunk, non-logprob and chunked requests, a
   batch without logprobs): every request that is not skipped must get
   exactly what the release's method gives it in the same batch without the
   skipped ones, a skipped one what the release leaves on it, and a batch
   with no skipped request must come out exactly as from the release. Any
   difference, any shape the matcher does not know, a source that is not the
   running code: the method stays as shipped, with a note saying why.

The stand-ins
-------------
The check must not depend on a scheduler's runtime context (a scheduler
process may import this before it has one), so the release's method runs on
stand-ins: requests and batches that hold what the logprob code reads;
``self`` with the class's own logprob methods (every method whose name says
``logprob`` that the method calls, and what those call), the logprob
processor of 0.5.13 on likewise, and an inert object for any other
collaborator (KV cache, metrics, streaming). The module-level functions that
the method and those logprob methods call (``release_kv_cache``,
``get_memory``, and ``get_exec``, which the count of 0.5.17 to 0.5.20 reads
first) are inert too: each runs as its own code object over an overlaid
globals dict. The loop, the skip branch and the logprob consumers are the
release's own code. Each request's rows carry values of its own, so a
shifted block shows; the first probe also checks that a request receives its
own rows at all, or the check could not see a shift. Which requests the
release skips is told by running it on each alone (a finished middle chunk is
skipped up to 0.5.13 and drained from 0.5.14). The whole check takes about
4 ms.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib
import inspect
import sys
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from flatgather.sglang import source
from flatgather.sglang.compare import first_difference
from flatgather.sglang.patching import Patch, Prepared, never_raises

__all__ = [
    "FIX",
    "METHOD",
    "MODULES",
    "Harness",
    "Raised",
    "Request",
    "compare_without_skipped",
    "owner_of",
    "prepare",
    "skip_advances",
]

MODULES = (
    "sglang.srt.managers.scheduler_output_processor_mixin",  # 0.5.10 to 0.5.12
    "sglang.srt.managers.scheduler_components.batch_result_processor",  # 0.5.13 on
)
METHOD = "process_batch_result_prefill"
FIX = "prefill-skip-logprob-pt"
"""The skip branch advances the input-logprob cursor (SGLang issue #36938)."""

LOGITS_PROCESSOR = "sglang.srt.layers.logits_processor"
_COUNT = "calculate_num_input_logprobs"
_VOCAB = 1 << 20
_KINDS = tuple(
    f"{kind}_{part}"
    for kind in ("token_logprobs", "top_logprobs", "token_ids_logprobs")
    for part in ("val", "idx")
)


# --- stand-ins --------------------------------------------------------------------------------


class _Inert:
    """A collaborator the check does not need (a KV cache, a metrics
    reporter, a stream): every attribute is itself, a call returns it, it is
    false and empty."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args, **kwargs):
        return self

    def __bool__(self) -> bool:
        return False

    def __iter__(self):
        return iter(())

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def __repr__(self) -> str:
        return "<inert>"


INERT = _Inert()


class _Record:
    """Attributes as set; any other reads as None, as an unset optional of
    SGLang's ``Req`` or ``ScheduleBatch`` does."""

    def __init__(self, **attrs) -> None:
        vars(self).update(attrs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class _Req(_Record):
    """A request as the prefill loop and the logprob code read it."""

    def finished(self) -> bool:
        return self.finished_reason is not None

    def check_finished(self, *args) -> None:
        pass  # the request stays unfinished: the loop caches it, as an unfinished one

    update_finish_state = check_finished


@dataclass(frozen=True)
class Request:
    """One stand-in request of a prefill batch: its ``extend_input_len``, its
    ``extend_logprob_start_len`` and what it asks for. Its values (logprobs,
    ids, token) depend on its index in the batch it was drawn in, never on
    its position in a batch it is run in, so the same request can be run in a
    batch with and without its neighbours."""

    extend: int
    start: int
    return_logprob: bool = True
    top: int = 0
    """``top_logprobs_num``."""
    token_ids: bool = False
    """Asks for the logprobs of given token ids."""
    middle_chunk: bool = False
    """A chunk of a chunked prefill that is not its last."""
    skipped: str | None = None
    """``"retracted"`` or ``"finished"`` (a request that finished in a mixed batch)."""

    @property
    def rows(self) -> int:
        return self.extend - self.start


@dataclass(frozen=True)
class Raised:
    """The method raised: compared by type."""

    type: str
    message: str = dataclasses.field(compare=False)


def _descriptor_code(value) -> types.CodeType | None:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    return value.__code__ if isinstance(value, types.FunctionType) else None


def _function(cls: type, name: str):
    """``cls``'s own function (plain, static or class method) ``name``, or None."""
    if name.startswith("__"):
        return None
    value = inspect.getattr_static(cls, name, None)
    return value if _descriptor_code(value) is not None else None


def _names(code: types.CodeType) -> set[str]:
    """Every global or attribute name ``code`` (and the code nested in it) reads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _reached(cls: type, roots: Iterable[str]) -> set[str]:
    """``roots`` (those that are ``cls``'s functions) and every function of
    ``cls`` they name, transitively."""
    todo = [n for n in roots if _function(cls, n)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        code = _descriptor_code(_function(cls, name))
        todo.extend(n for n in _names(code) if n not in seen and _function(cls, n))
    return seen


def _inert_attribute(self, name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return INERT


class _Overlays:
    """Functions run as their own code objects over a copy of their module's
    globals in which every module-level function is inert: the runtime
    context (``get_exec()``, ``get_memory()``), the KV cache
    (``release_kv_cache``), the metrics. Classes, modules and constants stay
    the release's. One copy per module."""

    def __init__(self) -> None:
        self._globals: dict[int, dict] = {}

    def _overlay(self, namespace: dict) -> dict:
        overlay = self._globals.get(id(namespace))
        if overlay is None:
            overlay = {
                k: INERT if isinstance(v, (types.FunctionType, types.BuiltinFunctionType)) else v
                for k, v in namespace.items()
            }
            self._globals[id(namespace)] = overlay
        return overlay

    def function(self, function: types.FunctionType) -> types.FunctionType:
        return types.FunctionType(
            function.__code__,
            self._overlay(function.__globals__),
            function.__name__,
            function.__defaults__,
            function.__closure__,
        )

    def descriptor(self, value):
        """A function, static or class method of a class body, overlaid."""
        if isinstance(value, (staticmethod, classmethod)):
            return type(value)(self.function(value.__func__))
        return self.function(value)


def _stand_in(cls: type, functions: set[str], attrs: dict, overlays: _Overlays) -> object:
    """An object whose ``functions`` are ``cls``'s own (overlaid) and whose
    other attributes are ``attrs``, or inert."""
    body = {n: overlays.descriptor(inspect.getattr_static(cls, n)) for n in functions}
    body["__getattr__"] = _inert_attribute
    body["stands_in_for"] = cls
    obj = type(f"StandIn{cls.__name__}", (), body)()
    vars(obj).update(attrs)
    return obj


def _annotation(cls: type, name: str) -> str | None:
    for klass in cls.__mro__:
        value = vars(klass).get("__annotations__", {}).get(name)
        if value is not None:
            return value if isinstance(value, str) else getattr(value, "__name__", None)
    return None


def _imported_class(module: types.ModuleType, name: str) -> type | None:
    """The class the module binds as ``name``, imported for type checking
    only (``if TYPE_CHECKING:``) or not."""
    name = name.strip("'\"")
    found = getattr(module, name, None)
    if isinstance(found, type):
        return found
    tree = source.module_tree(module)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
            continue
        for alias in node.names:
            if (alias.asname or alias.name) == name:
                found = getattr(importlib.import_module(node.module), alias.name, None)
                return found if isinstance(found, type) else None
    return None


def _snapshot(value):
    """``value`` as plain data: records as dicts, tensors as lists."""
    if isinstance(value, _Record):
        return {k: _snapshot(v) for k, v in vars(value).items() if v is not INERT}
    if isinstance(value, (list, tuple)):
        return type(value)(_snapshot(v) for v in value)
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return ("tensor", str(value.dtype), value.tolist())
    return value


class Harness:
    """Runs a ``process_batch_result_prefill`` of ``owner`` (the release's,
    or a rewritten one) on stand-in batches. ``module`` is ``owner``'s
    (by default the one ``sys.modules`` holds under its name).

    ``self`` is a stand-in holding ``owner``'s own logprob methods; the
    logprob processor it calls from 0.5.13 on (the class its annotation
    names) likewise; everything else it or the method reaches is inert. The
    function and those methods run as their own code objects, the
    module-level functions they call inert (:class:`_Overlays`).
    """

    def __init__(self, owner: type, module: types.ModuleType | None = None) -> None:
        import torch

        self._torch = torch
        self.owner = owner
        self.overlays = _Overlays()
        module = module or sys.modules[owner.__module__]
        self.output_class = importlib.import_module(LOGITS_PROCESSOR).LogitsProcessorOutput
        code = _descriptor_code(inspect.getattr_static(owner, METHOD))
        if code is None:
            raise TypeError(f"{owner.__qualname__}.{METHOD} is not a plain function")
        own = _reached(owner, (n for n in _names(code) if "logprob" in n))
        attrs = {"model_config": _Record(vocab_size=_VOCAB), "is_generation": True}
        reached = set().union(*(_names(_descriptor_code(_function(owner, n))) for n in own))
        # The logprob processor (0.5.13 on): an attribute whose name says
        # logprob, of the class its annotation names.
        for name in sorted(n for n in reached - own if "logprob" in n):
            annotation = _annotation(owner, name)
            cls = _imported_class(module, annotation) if annotation else None
            functions = _reached(cls, reached) if cls is not None else set()
            if functions:
                config = {"model_config": _Record(vocab_size=_VOCAB)}
                attrs[name] = _stand_in(cls, functions, config, self.overlays)
        self.functions = own
        """The names of ``owner``'s methods the stand-in ``self`` runs."""
        self.scheduler = _stand_in(owner, own, attrs, self.overlays)

    def _request(self, k: int, spec: Request) -> _Req:
        chunks = 1 if spec.middle_chunk else 0

        def logprob() -> dict:
            # On the request itself up to 0.5.12, on ``req.logprob`` from 0.5.13.
            fields = {f"input_{kind}": None for kind in _KINDS}
            fields.update({f"output_{kind}": [] for kind in _KINDS})
            fields["top_logprobs_num"] = spec.top
            fields["token_ids_logprob"] = [3, 4] if spec.token_ids else None
            return fields

        return _Req(
            rid=f"req{k}",
            origin_input_ids=[100 + (7 * k + j) % 50 for j in range(spec.extend)],
            logprob_start_len=spec.start,
            return_logprob=spec.return_logprob,
            is_prefill_only=False,
            is_retracted=spec.skipped == "retracted",
            finished_reason="length" if spec.skipped == "finished" else None,
            is_chunked=chunks,
            inflight_middle_chunks=chunks,
            output_ids=[],
            time_stats=INERT,
            grammar=None,
            input_token_logprobs=None,
            logprob=_Record(**logprob()),
            **logprob(),
        )

    def _output(self, batch: list[tuple[int, Request]], return_logprob: bool):
        torch = self._torch
        fields = dataclasses.fields(self.output_class)
        required = {
            f.name: None
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        out = self.output_class(**required)
        if not return_logprob:
            return out

        def rows(k, spec, shift):
            return [[1000.0 * (k + 1) + j + shift] * max(spec.top, 1) for j in range(spec.rows)]

        flat = [1000.0 * (k + 1) + j + 0.5 for k, spec in batch for j in range(spec.rows)]
        out.next_token_logprobs = torch.tensor([-(k + 0.25) for k, _ in batch])
        out.input_token_logprobs = torch.tensor(flat, dtype=torch.float32)
        out.next_token_top_logprobs_val = [
            torch.full((spec.top,), -(k + 0.75)) for k, spec in batch
        ]
        out.next_token_top_logprobs_idx = [torch.arange(spec.top) + 10 * k for k, spec in batch]
        out.input_top_logprobs_val = [rows(k, s, 0.125) if s.top else [] for k, s in batch]
        out.input_top_logprobs_idx = [
            [[k] * s.top for _ in range(s.rows)] if s.top else [] for k, s in batch
        ]
        out.next_token_token_ids_logprobs_val = [
            torch.tensor([-(k + 0.5), -(k + 1.5)]) for k, _ in batch
        ]
        out.next_token_token_ids_logprobs_idx = [[3, 4] for _ in batch]
        out.input_token_ids_logprobs_val = [
            [[1000.0 * (k + 1) + j + 0.375] * 2 for j in range(s.rows)] if s.token_ids else []
            for k, s in batch
        ]
        out.input_token_ids_logprobs_idx = [
            [[3, 4]] * s.rows if s.token_ids else [] for k, s in batch
        ]
        return out

    def skipped(self, function: types.FunctionType, specs: Sequence[Request]) -> list[int]:
        """The requests of ``specs`` marked retracted or finished that
        ``function`` skips: run in a batch of their own, they come out as
        they went in. (A finished middle chunk is skipped up to 0.5.13;
        from 0.5.14 its chunked branch drains it.)"""
        return [
            k
            for k, spec in enumerate(specs)
            if spec.skipped
            and self.run(function, specs, [k]) == {k: _snapshot(self._request(k, spec))}
        ]

    def run(
        self,
        function: types.FunctionType,
        specs: Sequence[Request],
        keep: Iterable[int] | None = None,
        return_logprob: bool = True,
    ) -> dict[int, dict] | Raised:
        """Run ``function`` on the batch of ``specs`` (only those at the
        indices ``keep``, in order, when given): each request's state
        afterwards, by its index in ``specs``, or what it raised."""
        torch = self._torch
        keep = range(len(specs)) if keep is None else list(keep)
        batch = [(k, specs[k]) for k in keep]
        reqs = {k: self._request(k, spec) for k, spec in batch}
        result = _Record(
            logits_output=self._output(batch, return_logprob),
            next_token_ids=torch.tensor([20000 + k for k, _ in batch], dtype=torch.int64),
            extend_input_len_per_req=[s.extend for _, s in batch] if return_logprob else None,
            extend_logprob_start_len_per_req=(
                [s.start for _, s in batch] if return_logprob else None
            ),
        )
        schedule_batch = _Record(
            reqs=list(reqs.values()),
            return_logprob=return_logprob,
            decoding_reqs=None,
            return_hidden_states=False,
        )
        try:
            self.overlays.function(function)(self.scheduler, schedule_batch, result)
        except Exception as exc:  # compared by type: the same failure, or none
            return Raised(type(exc).__name__, str(exc)[:200])
        return {k: _snapshot(req) for k, req in reqs.items()}


def _describe(specs: Sequence[Request], return_logprob: bool = True) -> str:
    parts = []
    for s in specs:
        what = [f"{s.extend}/{s.start}"]
        what += [s.skipped] if s.skipped else []
        what += ["middle chunk"] if s.middle_chunk else []
        what += [] if s.return_logprob else ["no logprob"]
        parts.append(" ".join(what))
    return f"the stand-in batch [{', '.join(parts)}]{'' if return_logprob else ' without logprobs'}"


def compare_without_skipped(
    harness: Harness,
    ours: types.FunctionType,
    stock: types.FunctionType,
    specs: Sequence[Request],
    return_logprob: bool = True,
) -> str | None:
    """None when ``ours`` gives every request of the batch what ``stock``
    (the release's method) gives it in the same batch without the skipped
    requests (those it skips: :meth:`Harness.skipped`), and each skipped
    one what ``stock`` leaves on it in the whole batch; else the first
    difference. With no skipped request, the whole batch must come out of
    both the same."""
    where = _describe(specs, return_logprob)
    skipped = harness.skipped(stock, specs)
    kept = [k for k in range(len(specs)) if k not in skipped]
    got = harness.run(ours, specs, return_logprob=return_logprob)
    whole = harness.run(stock, specs, return_logprob=return_logprob)
    if isinstance(whole, Raised) and not skipped:
        return None if got == whole else f"on {where}: the release raised {whole}, got {got}"
    expected = harness.run(stock, specs, kept, return_logprob) if skipped else whole
    if isinstance(expected, Raised) or isinstance(whole, Raised):
        failure = expected if isinstance(expected, Raised) else whole
        return f"the release's own method fails on {where}: {failure.type}: {failure.message}"
    if isinstance(got, Raised):
        return f"on {where}: raised {got.type}: {got.message}"
    for k in kept:
        found = first_difference(got[k], expected[k], f"request {k}")
        if found:
            return f"on {where}: {found}"
    for k in skipped:
        found = first_difference(got[k], whole[k], f"skipped request {k}")
        if found:
            return f"on {where}: {found}"
    return None


_r = Request

# Batches the release's method is first asked about: a retracted and a
# finished request between two that ask for logprobs.
_PROBES = (
    (
        Request(4, 1, top=2, token_ids=True),
        Request(3, 0, skipped="retracted"),
        Request(5, 2, top=1),
    ),
    (Request(4, 0), Request(2, 0, skipped="finished"), Request(3, 1, token_ids=True)),
)


def skip_advances(harness: Harness, function: types.FunctionType) -> bool | str:
    """Whether ``function`` (a release's method) advances the cursor over the
    requests it skips: every other request gets what it gets from the same
    batch without them. False is issue #36938; a string says why it cannot
    be told (the method fails on a stand-in batch)."""
    for specs in _PROBES:
        kept = [k for k, s in enumerate(specs) if not s.skipped]
        whole = harness.run(function, specs)
        alone = harness.run(function, specs, kept)
        for outcome in (whole, alone):
            if isinstance(outcome, Raised):
                return f"its method fails on {_describe(specs)}: {outcome.type}: {outcome.message}"
        after = kept[-1]
        if not _received(alone[after], after, specs[after]):
            return (
                f"on {_describe(specs)}, request {after} got none of its input "
                "logprobs: the check would not see a shift"
            )
        if any(whole[k] != alone[k] for k in kept):
            return False
    return True


def _values(snapshot) -> set:
    if isinstance(snapshot, dict):
        snapshot = list(snapshot.values())
    if isinstance(snapshot, (list, tuple)):
        return set().union(*map(_values, snapshot)) if snapshot else set()
    return {snapshot} if isinstance(snapshot, float) else set()


def _received(snapshot: dict, k: int, spec: Request) -> bool:
    """Whether request ``k`` holds a row of its own block of input logprobs."""
    return bool(_values(snapshot) & {1000.0 * (k + 1) + j + 0.5 for j in range(spec.rows)})


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
        if chain is None or chain[0] != self_name or not chain[-1].endswith(_COUNT):
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
class _Shape:
    loop: _Loop
    skip: ast.If
    advance: _Advance


def _find_shape(owner: type, tree: ast.FunctionDef) -> _Shape | str:
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
            f"no `<pt> += {_COUNT}(...)` of the request's extend and start found in the branch "
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
    return _Shape(loop, skip, advance)


def _placed(node: ast.AST, like: ast.AST) -> ast.AST:
    for n in ast.walk(node):
        if "lineno" in n._attributes:
            ast.copy_location(n, like)
    return node


def _rewrite(shape: _Shape) -> None:
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


# --- the check and prepare --------------------------------------------------------------------


# (requests, batch.return_logprob): every request that is not skipped must
# get what the release's method gives it without the skipped ones.
_CASES: tuple[tuple[tuple[Request, ...], bool], ...] = (
    ((_r(3, 0), _r(4, 1, top=2, token_ids=True), _r(2, 0, return_logprob=False)), True),
    ((_r(3, 0, skipped="retracted"), _r(4, 1, top=1), _r(5, 5)), True),
    ((_r(3, 1), _r(2, 0, skipped="finished"), _r(4, 0, middle_chunk=True), _r(3, 2)), True),
    ((_r(2, 0), _r(5, 2, return_logprob=False), _r(3, 0, skipped="retracted")), True),
    (
        (
            _r(2, 0, top=1),
            _r(3, 0, skipped="finished"),
            _r(4, 1, skipped="retracted", middle_chunk=True),
            _r(3, 0, token_ids=True),
        ),
        True,
    ),
    ((_r(4, 4, skipped="retracted"), _r(3, 0), _r(2, 0, skipped="finished")), True),
    # A middle chunk right before a skipped request: the advance over the
    # skipped one starts where the chunk's own branch leaves the cursor.
    (
        (
            _r(4, 1, top=1, middle_chunk=True),
            _r(3, 0, skipped="retracted"),
            _r(2, 0, token_ids=True),
            _r(3, 1, middle_chunk=True),
            _r(2, 0, skipped="finished"),
            _r(3, 0),
        ),
        True,
    ),
    ((_r(3, 0), _r(2, 0, skipped="retracted"), _r(4, 1)), False),
)


def _verify(harness: Harness, ours, stock) -> str | None:
    for specs, return_logprob in _CASES:
        problem = compare_without_skipped(harness, ours, stock, specs, return_logprob)
        if problem:
            return problem
    return None


def owner_of(module) -> type | str:
    """The class of ``module`` that defines the method, or why there is not one."""
    owners = [
        c
        for c in vars(module).values()
        if isinstance(c, type) and c.__module__ == module.__name__ and METHOD in vars(c)
    ]
    if len(owners) != 1:
        return f"{module.__name__} defines {METHOD} in {len(owners)} classes, not one"
    return owners[0]


@never_raises(lambda module: f"{module.__name__}.{METHOD}")
def prepare(module) -> Prepared:
    """The patch of ``module``'s ``process_batch_result_prefill`` (the mixin's
    or the batch result processor's): its skip branch advances the input
    logprob cursor, verified against the release's own method; nothing where
    the release already advances it. Never raises: whatever cannot be done
    is a note, and the method stays as shipped."""
    return _prepare(module)


def _prepare(module) -> Prepared:
    owner = owner_of(module)
    if isinstance(owner, str):
        return Prepared.refused(owner)
    where = f"{owner.__name__}.{METHOD}"
    stock = vars(owner)[METHOD]
    if not isinstance(stock, types.FunctionType):
        return Prepared.refused(f"{where} left stock: it is not a plain function")
    harness = Harness(owner, module)
    verdict = skip_advances(harness, stock)
    if verdict is True:
        return Prepared()  # the release advances the cursor itself: left as shipped
    if isinstance(verdict, str):
        return Prepared.refused(f"{where} left stock: {verdict}")
    try:
        method = source.parse_method(owner, METHOD)
    except source.SourceMismatch as exc:
        return Prepared.refused(f"{where} left stock (SGLang issue #36938 unfixed): {exc}")
    if method.tree.decorator_list:
        return Prepared.refused(f"{where} left stock: it is decorated")
    tree = copy.deepcopy(method.tree)
    shape = _find_shape(owner, tree)
    if isinstance(shape, str):
        return Prepared.refused(f"{where} left stock (SGLang issue #36938 unfixed): {shape}")
    _rewrite(shape)
    patched = source.build_method(method, tree, {})
    problem = _verify(harness, patched, stock)
    if problem:
        return Prepared.refused(
            f"{where} left stock (SGLang issue #36938 unfixed): checked against the "
            f"release's own method, {problem}"
        )
    return Prepared(patches=[Patch(owner, METHOD, patched)], applied=(FIX,), backports=(FIX,))
