"""Stand-ins to run the release's ``process_batch_result_prefill`` on a
CPU, outside a scheduler (:class:`Harness`), and the comparison the #36938
patch is held to (:func:`compare_without_skipped`): see the package's
docstring, "The stand-ins"."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from flatgather.sglang import source
from flatgather.sglang.compare import first_difference

LOGITS_PROCESSOR = "sglang.srt.layers.logits_processor"
"""The module of the ``LogitsProcessorOutput`` a stand-in batch's result holds."""
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


class Record:
    """Attributes as set; any other reads as None, as an unset optional of
    SGLang's ``Req`` or ``ScheduleBatch`` does."""

    def __init__(self, **attrs) -> None:
        vars(self).update(attrs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class _Req(Record):
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
    if isinstance(value, Record):
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

        # The patch's own name of the method, read from the room once it is
        # imported (the room imports this module: see its docstring).
        from flatgather.sglang.patches.prefill_result import METHOD

        self._torch = torch
        self.owner = owner
        self.overlays = _Overlays()
        module = module or sys.modules[owner.__module__]
        self.output_class = importlib.import_module(LOGITS_PROCESSOR).LogitsProcessorOutput
        code = _descriptor_code(inspect.getattr_static(owner, METHOD))
        if code is None:
            raise TypeError(f"{owner.__qualname__}.{METHOD} is not a plain function")
        own = _reached(owner, (n for n in _names(code) if "logprob" in n))
        attrs = {"model_config": Record(vocab_size=_VOCAB), "is_generation": True}
        reached = set().union(*(_names(_descriptor_code(_function(owner, n))) for n in own))
        # The logprob processor (0.5.13 on): an attribute whose name says
        # logprob, of the class its annotation names.
        for name in sorted(n for n in reached - own if "logprob" in n):
            annotation = _annotation(owner, name)
            cls = _imported_class(module, annotation) if annotation else None
            functions = _reached(cls, reached) if cls is not None else set()
            if functions:
                config = {"model_config": Record(vocab_size=_VOCAB)}
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
            logprob=Record(**logprob()),
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
        result = Record(
            logits_output=self._output(batch, return_logprob),
            next_token_ids=torch.tensor([20000 + k for k, _ in batch], dtype=torch.int64),
            extend_input_len_per_req=[s.extend for _, s in batch] if return_logprob else None,
            extend_logprob_start_len_per_req=(
                [s.start for _, s in batch] if return_logprob else None
            ),
        )
        schedule_batch = Record(
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


def describe(specs: Sequence[Request], return_logprob: bool = True) -> str:
    """A batch of stand-in requests in words, as the check's differences
    name it (the mutation suite names its batches alike)."""
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
    where = describe(specs, return_logprob)
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
                return f"its method fails on {describe(specs)}: {outcome.type}: {outcome.message}"
        after = kept[-1]
        if not _received(alone[after], after, specs[after]):
            return (
                f"on {describe(specs)}, request {after} got none of its input "
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
