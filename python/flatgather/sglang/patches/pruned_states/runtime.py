"""What a patched release calls at run time: the replacement for
``LogitsProcessor._get_pruned_states``, and lazy aux pruning.

Only the branch "prefill with input logprobs" is replaced; decode, verify,
draft-extend-v2, prefill without logprobs, compiled code and CUDA-graph
capture run the release's own code. So does every batch the plan refuses (a
request of length 0, lengths and starts of different counts, a start past its
length, a negative or non-integer value, no request, a 0-d tensor), so the
answer, result or error, is the release's. ``hidden_states`` may have more
rows than the batch has tokens (CUDA-graph buckets, DP-attention padding):
those rows are never read. Fewer rows than tokens is a
:class:`flatgather.PlanError`, the one error of flatgather's own here: the
release's function returns states shorter than its ``sample_indices`` assume.

Where lazy aux pruning is on, the aux result it returns inside ``forward`` is
lazy (below).

Lazy aux pruning
----------------
It rides on the replacement of ``_get_pruned_states``.

In the branch "prefill with input logprobs" SGLang gathers every logprob row
of every EAGLE3 aux layer, yet ``forward`` only hands them to
``_get_hidden_states_to_store``, which under LAST capture keeps the B sampled
rows, under NULL capture none, and under FULL capture none either: it stores
the unpruned aux layers (the capture mode of the EAGLE3 target prefill).
Inside ``LogitsProcessor.forward`` the aux result is therefore a
:class:`LazyAuxPruned` that the wrapped ``_get_hidden_states_to_store``
resolves to exactly the rows it reads (only for a processor whose class's
``_get_hidden_states_to_store`` is that wrapper: a subclass with a store of
its own gets the pruned layers). Under FULL it is handed on unresolved,
and only where the probe saw the release's own store leave it untouched (a
:class:`LazyAuxPruned` fails on any use). Anywhere else the aux layers are
pruned in full as the release does.

A :class:`LazyAuxPruned` must never reach the release's own
``_get_hidden_states_to_store``, whatever ``uninstall()`` does meanwhile. A
:class:`LazyGate` counts the forwards that may create one; ``uninstall()``
closes the gate (forwards that start later gather eagerly), waits for the
forwards in flight to leave, and only then restores the originals.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from flatgather._core import PrunePlan
from flatgather._errors import PlanError
from flatgather._staging import stage

__all__ = [
    "STORE_PARAMETERS",
    "Contract",
    "LazyAuxPruned",
    "LazyAuxRead",
    "LazyGate",
    "copy_rows",
    "lazy_pays",
    "lazy_scope",
    "make_forward",
    "make_hidden_states_to_store",
    "make_pruned_states",
    "store_problem",
    "uses_release_code",
]


def lazy_pays(logits_metadata, plan, lazy_full: bool) -> bool:
    """Whether gathering the aux layers lazily saves work: always under NULL
    capture (nothing is read), under LAST for one request (its sampled row is
    a slice) or when the batch keeps more rows than it samples (else the lazy
    gather costs one index_select more), and under FULL where the probe saw
    the release's store read no pruned aux row (``lazy_full``)."""
    mode = logits_metadata.capture_hidden_mode
    if mode.is_full():
        return lazy_full
    if not mode.need_capture():
        return True
    return plan.batch_size == 1 or plan.num_pruned > plan.batch_size


def copy_rows(tensor: torch.Tensor, rows: slice) -> torch.Tensor:
    """``tensor[rows]`` as a tensor of its own, made as the release makes
    one request's pruned states: a ``torch.cat`` of its one slice."""
    return torch.cat([tensor[rows]])


def _gather_aux(aux, index: torch.Tensor):
    if isinstance(aux, torch.Tensor):
        return aux.index_select(0, index)
    return [layer.index_select(0, index) for layer in aux]


class LazyAuxRead(TypeError):
    """A :class:`LazyAuxPruned` was used as if it were the pruned aux layers."""


class LazyAuxPruned:
    """``aux_pruned_states`` not gathered yet: the aux layers and the plan's
    device indices, to gather from once it is known which rows are read.

    It is also the sentinel of the probe's FULL-capture check: any use of it
    as aux layers (indexing, iteration, ``len``, truth, attribute access, a
    torch function) raises :class:`LazyAuxRead`."""

    __slots__ = ("aux", "gather", "last", "sample")

    def __init__(
        self, aux, gather: torch.Tensor | None, sample: torch.Tensor | None, last: int = -1
    ) -> None:
        # gather None: one request, whose sampled row is aux row ``last``.
        self.aux, self.gather, self.sample, self.last = aux, gather, sample, last

    def resolve(self, capture_hidden_mode, sample_indices):
        """The ``(aux_pruned_states, sample_indices)`` to hand to the
        release's ``_get_hidden_states_to_store`` so that it stores what it
        would have stored from the full result."""
        if not capture_hidden_mode.need_capture():
            return None, sample_indices  # never read
        if capture_hidden_mode.is_last():
            if self.gather is None:
                return self._last_row(), None
            # pack(aux[gather])[sample] == pack(aux[gather[sample]]): gather
            # the B sampled rows only, already in order, so no re-indexing.
            return _gather_aux(self.aux, self.gather.index_select(0, self.sample)), None
        # FULL: created only where the probe saw the release's store leave it
        # untouched (it stores the unpruned layers), so it is handed on as is.
        return self, sample_indices

    def _last_row(self):
        """One request's sampled row of every layer. The store packs two or
        more list layers into a new tensor (``torch.cat`` along the last
        dimension), so they are handed on as slices; a packed tensor or a
        single layer it stores as handed, so those are copied (the probe
        checks that what is stored shares no memory with the inputs)."""
        rows = slice(self.last, self.last + 1)
        aux = self.aux
        if isinstance(aux, torch.Tensor):
            return copy_rows(aux, rows)
        if len(aux) < 2:
            return [copy_rows(layer, rows) for layer in aux]
        return [layer[rows] for layer in aux]

    def _refuse(self, *args, **kwargs):
        raise LazyAuxRead("the pruned aux layers were read where flatgather gathered none")

    __getitem__ = __iter__ = __len__ = __bool__ = __getattr__ = _refuse

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise LazyAuxRead(f"{func} was called on pruned aux layers flatgather did not gather")


_scope = threading.local()
"""The gate of the forward the calling thread runs inside (``gate``), if
any. A thread-local rather than a context variable: after a context
variable is set, every read of any context variable misses its cache, and
SGLang's forward reads its own (0.5.23's ``runtime_context``); measured in a
one-request forward, 1 thread, CPU: about 3 us with a context variable,
0.5 us with the thread-local."""


def _current_gate() -> LazyGate | None:
    return getattr(_scope, "gate", None)


class LazyGate:
    """The forwards of one installation that may create a
    :class:`LazyAuxPruned`, counted so that ``uninstall()`` can wait for them.

    A forward takes nothing but an ``append`` and a ``pop`` on a list (each
    atomic): it enters only while the gate is open, and it checks again after
    counting itself, so ``close()``, which shuts the gate before it looks,
    either sees it counted or sees it back out."""

    _POLL_SECONDS = 0.0005

    def __init__(self) -> None:
        self._open = True
        self._inflight: list[None] = []
        self._lock = threading.Lock()
        self._closers = 0

    def enter(self) -> bool:
        if not self._open:
            return False
        self._inflight.append(None)
        if not self._open:  # closed meanwhile: the closer may have looked already
            self._inflight.pop()
            return False
        return True

    def leave(self) -> None:
        self._inflight.pop()

    def current(self) -> bool:
        """Whether the caller runs inside a forward counted by this gate."""
        return _current_gate() is self

    def close(self, timeout: float | None = None) -> bool:
        """Let no new forward in, then wait for those in flight to leave.
        On timeout False is returned, and the gate opens again unless
        another caller is still closing it."""
        with self._lock:
            self._open = False
            self._closers += 1
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._inflight:
            if deadline is not None and time.monotonic() >= deadline:
                with self._lock:
                    self._closers -= 1
                    self._open = self._closers == 0
                return False
            time.sleep(self._POLL_SECONDS)
        return True


@contextlib.contextmanager
def lazy_scope(gate: LazyGate) -> Iterator[None]:
    """Run the body as the wrapped ``forward`` runs the release's: counted
    by ``gate``, with lazy aux pruning on (while the gate is open)."""
    if not gate.enter():
        yield
        return
    outer = _current_gate()
    _scope.gate = gate
    try:
        yield
    finally:
        _scope.gate = outer
        gate.leave()


def _position(original: Callable, name: str) -> int | None:
    """Where parameter ``name`` stands among ``forward``'s positional
    arguments after ``self``; None when the release's signature has none."""
    try:
        names = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        return None
    return names.index(name) - 1 if name in names[1:] else None


def _argument(args: tuple, kwargs: dict, position: int, name: str):
    return args[position] if len(args) > position else kwargs.get(name)


def _nothing_lazy(args: tuple, kwargs: dict, metadata_at: int | None, aux_at: int | None) -> bool:
    """Whether a forward can create no :class:`LazyAuxPruned`: it has no aux
    layers and its metadata names at most one request (a batch of several
    requests without aux layers is still counted, as every forward is where
    the release's signature is not the one known)."""
    if metadata_at is None or aux_at is None:
        return False
    if _argument(args, kwargs, aux_at, "aux_hidden_states") is not None:
        return False
    metadata = _argument(args, kwargs, metadata_at, "logits_metadata")
    lens = getattr(metadata, "extend_seq_lens_cpu", None)
    return isinstance(lens, list) and len(lens) < 2


def make_forward(original: Callable, gate: LazyGate) -> Callable:
    """``forward`` marking its extent, so lazy aux pruning applies there alone."""
    metadata_at = _position(original, "logits_metadata")
    aux_at = _position(original, "aux_hidden_states")

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        # Compiled code sees the release's forward as is: no context variable,
        # no lock, so Dynamo neither breaks the graph nor guards on us. A
        # one-request forward without aux layers has nothing lazy, so it
        # skips the gate too.
        if (
            torch.compiler.is_compiling()
            or _nothing_lazy(args, kwargs, metadata_at, aux_at)
            or not gate.enter()
        ):
            return original(self, *args, **kwargs)
        outer = _current_gate()
        _scope.gate = gate
        try:
            return original(self, *args, **kwargs)
        finally:
            _scope.gate = outer
            gate.leave()

    return forward


STORE_PARAMETERS = ("aux_pruned_states", "sample_indices", "logits_metadata")
"""What the lazy store reads of the release's ``_get_hidden_states_to_store``
call, by name."""


def store_problem(original: Callable) -> str | None:
    """Why ``original`` cannot take a lazy aux result: a parameter the lazy
    store reads is missing from its signature. None: it can."""
    missing = [name for name in STORE_PARAMETERS if _position(original, name) is None]
    if missing:
        return f"the release's _get_hidden_states_to_store has no parameter {', '.join(missing)}"
    return None


def _replaced(args: tuple, kwargs: dict, values: dict) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with the argument at each position (or of each
    name, where it came by keyword) replaced."""
    args = list(args)
    for position, (name, value) in values.items():
        if len(args) > position:
            args[position] = value
        else:
            kwargs = {**kwargs, name: value}
    return tuple(args), kwargs


def make_hidden_states_to_store(original: Callable) -> Callable:
    """``_get_hidden_states_to_store`` that resolves a :class:`LazyAuxPruned`
    and passes every argument through as it came, whatever the release's
    signature (one that lacks a parameter it reads, see :func:`store_problem`,
    is never handed a lazy result: lazy aux pruning stays off there)."""
    aux_at, sample_at, metadata_at = (_position(original, n) for n in STORE_PARAMETERS)

    @functools.wraps(original)
    def _get_hidden_states_to_store(self, *args, **kwargs):
        aux = _argument(args, kwargs, aux_at, "aux_pruned_states") if aux_at is not None else None
        if (
            type(aux) is LazyAuxPruned
            and sample_at is not None
            and metadata_at is not None
            and not torch.compiler.is_compiling()
        ):
            metadata = _argument(args, kwargs, metadata_at, "logits_metadata")
            sample = _argument(args, kwargs, sample_at, "sample_indices")
            aux, sample = aux.resolve(metadata.capture_hidden_mode, sample)
            args, kwargs = _replaced(
                args,
                kwargs,
                {aux_at: ("aux_pruned_states", aux), sample_at: ("sample_indices", sample)},
            )
        return original(self, *args, **kwargs)

    return _get_hidden_states_to_store


# --- the replacement of _get_pruned_states ---------------------------------------------------
@dataclass(frozen=True)
class Contract:
    """What the running release's ``_get_pruned_states`` returns in its
    logprob branch, as :mod:`flatgather.sglang.patches.pruned_states.probe` found it."""

    trailing_token_to_seq: bool
    """``token_to_seq_idx`` ends with the last request's index once more
    (releases before 0.5.16)."""
    packed_aux: bool
    """EAGLE3 aux hidden states may come as one packed tensor (0.5.17 on);
    otherwise a packed tensor is handed to the release's own code."""
    writes_cpu_indices: bool
    """The branch stores ``sample_indices_cpu`` and
    ``input_logprob_indices_cpu`` (lists) on the metadata (0.5.21 on)."""
    prunes_aux: bool
    """The branch prunes list aux layers (SGLang PR #21589). False means the
    release drops them (0.5.10): flatgather then prunes them, the backport
    ``aux-logprob-prune``."""

    @property
    def backports(self) -> tuple[str, ...]:
        return () if self.prunes_aux else ("aux-logprob-prune",)

    def describe(self) -> str:
        return (
            f"trailing token_to_seq entry: {'yes' if self.trailing_token_to_seq else 'no'}; "
            f"packed aux: {'yes' if self.packed_aux else 'no'}; "
            f"writes *_indices_cpu: {'yes' if self.writes_cpu_indices else 'no'}; "
            f"prunes aux: {'yes' if self.prunes_aux else 'no (backported)'}"
        )


# How each ForwardMode is routed, worked out once per mode: "release" (the
# decode / verify / draft-extend branch), "extend" (the release's branch
# without logprobs, or the logprob branch) or "logprob".
_routes: dict = {}


def _route(mode) -> str:
    key = (type(mode), mode)  # IntEnum members of different enums compare equal
    route = _routes.get(key)
    if route is None:
        if mode.is_decode_or_idle() or mode.is_target_verify() or mode.is_draft_extend_v2():
            route = "release"
        else:
            route = "extend" if mode.is_extend() else "logprob"
        _routes[key] = route
    return route


def uses_release_code(metadata) -> bool:
    """True where the release's other branches apply: the same tests, in the
    same order, as its ``_get_pruned_states`` (the probe checks this against
    every ``ForwardMode`` of the running release)."""
    route = _route(metadata.forward_mode)
    return route == "release" or (route == "extend" and not metadata.extend_return_logprob)


def _check_rows(hidden_states, hidden_states_before_norm, aux_hidden_states, tokens: int) -> None:
    """Raise :class:`PlanError` naming the first tensor with fewer rows than
    the batch has tokens."""
    named = [("hidden_states", hidden_states)]
    if hidden_states_before_norm is not None:
        named.append(("hidden_states_before_norm", hidden_states_before_norm))
    if isinstance(aux_hidden_states, torch.Tensor):
        named.append(("aux_hidden_states", aux_hidden_states))
    elif aux_hidden_states is not None:
        named += [(f"aux_hidden_states[{j}]", t) for j, t in enumerate(aux_hidden_states)]
    for name, tensor in named:
        rows = tensor.shape[0]
        if rows < tokens:
            raise PlanError(
                f"{name} has {rows} rows, but the batch has {tokens} tokens", "too_few_rows"
            )


def make_pruned_states(
    original: Callable,
    contract: Contract,
    gate: LazyGate | None = None,
    lazy_full: bool = False,
    store: Callable | None = None,
) -> Callable:
    """A ``_get_pruned_states`` that returns what ``original`` returns under
    ``contract``, with one plan, one host-to-device copy and one
    ``index_select`` per tensor in the logprob branch. With a ``gate``, aux
    layers are pruned lazily inside the forwards it counts, for a processor
    whose class's ``_get_hidden_states_to_store`` is ``store`` (the wrapper
    that resolves them); under FULL capture only with ``lazy_full`` (none of
    them is then gathered)."""

    def _plan(hidden_states, aux_hidden_states, logits_metadata):
        """The batch's plan, or None where the release's own code runs."""
        if torch.compiler.is_compiling() or uses_release_code(logits_metadata):
            return None
        if isinstance(aux_hidden_states, torch.Tensor) and not contract.packed_aux:
            return None  # a packed tensor this release does not know
        if hidden_states.is_cuda and torch.cuda.is_current_stream_capturing():
            # A CUDA graph must not capture a copy from our reused host buffers.
            return None
        try:
            return PrunePlan(
                logits_metadata.extend_seq_lens_cpu, logits_metadata.extend_logprob_start_lens_cpu
            )
        except PlanError:
            # Metadata outside the plan (a request with no token, as SGLang
            # pads batches with them; lengths and starts of different counts,
            # which the release zips; a start past its length, which fails
            # the release's own assert; ...): the release's code decides.
            return None

    @functools.wraps(original)
    def _get_pruned_states(
        self, hidden_states, hidden_states_before_norm, aux_hidden_states, logits_metadata
    ):
        plan = _plan(hidden_states, aux_hidden_states, logits_metadata)
        if plan is None:
            return original(
                self, hidden_states, hidden_states_before_norm, aux_hidden_states, logits_metadata
            )
        packed = isinstance(aux_hidden_states, torch.Tensor)
        tensors = [hidden_states]
        if hidden_states_before_norm is not None:
            tensors.append(hidden_states_before_norm)
        if packed:
            tensors.append(aux_hidden_states)
        elif aux_hidden_states is not None:
            tensors += aux_hidden_states
        tokens = plan.num_tokens
        for tensor in tensors:
            if tensor.dim() == 0 or tensor.shape[0] < tokens:
                # No rows to slice (the release's code fails its own way), or
                # too few: said in the order of the release's arguments.
                if any(t.dim() == 0 for t in tensors):
                    return original(
                        self,
                        hidden_states,
                        hidden_states_before_norm,
                        aux_hidden_states,
                        logits_metadata,
                    )
                _check_rows(hidden_states, hidden_states_before_norm, aux_hidden_states, tokens)
        device = hidden_states.device
        if plan.batch_size == 1:
            # One request keeps one run of rows: copied as the release copies
            # it, and its index sets (two ranges) made on the device, with no
            # host-to-device copy.
            rows = slice(plan.num_tokens - plan.num_pruned, plan.num_tokens)
            gather = None
            sample_indices = torch.arange(plan.num_pruned - 1, plan.num_pruned, device=device)
            input_logprob_indices = torch.arange(plan.num_input_logprob, device=device)

            def take(tensor):
                return copy_rows(tensor, rows)
        else:
            index = stage(
                plan.buffer_len(False), functools.partial(plan.fill, token_to_seq=False), device
            )
            gather, sample_indices, input_logprob_indices = index.split_with_sizes(
                (plan.num_pruned, plan.batch_size, plan.num_input_logprob)
            )

            def take(tensor):
                return tensor.index_select(0, gather)

        pruned_states = take(hidden_states)
        pruned_states_before_norm = (
            None if hidden_states_before_norm is None else take(hidden_states_before_norm)
        )
        if aux_hidden_states is None:
            aux_pruned_states = None
        elif (
            gate is not None
            and gate.current()
            # A subclass's own store would be handed the lazy object unresolved.
            and store is not None
            and getattr(type(self), "_get_hidden_states_to_store", None) is store
            and lazy_pays(logits_metadata, plan, lazy_full)
        ):
            aux_pruned_states = LazyAuxPruned(
                aux_hidden_states, gather, sample_indices, plan.num_tokens - 1
            )
        elif packed:
            aux_pruned_states = take(aux_hidden_states)
        else:
            aux_pruned_states = [take(layer) for layer in aux_hidden_states]

        if contract.writes_cpu_indices:
            logits_metadata.sample_indices_cpu = plan.sample_list()
            logits_metadata.input_logprob_indices_cpu = plan.input_logprob_list()
        token_to_seq_idx = plan.token_to_seq_list(contract.trailing_token_to_seq)
        return (
            pruned_states,
            pruned_states_before_norm,
            aux_pruned_states,
            sample_indices,
            input_logprob_indices,
            token_to_seq_idx,
        )

    _get_pruned_states.__flatgather__ = contract
    return _get_pruned_states
