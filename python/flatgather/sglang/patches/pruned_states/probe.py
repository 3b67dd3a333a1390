"""Ask the running release what its ``_get_pruned_states`` does, and check
flatgather's answer against it before anything is patched.

:func:`run` calls the release's own function on a handful of small CPU
batches, their ``LogitsMetadata`` built as every real batch's is, by the
release's own ``LogitsMetadata.from_forward_batch`` from a ``ForwardBatch``
(by hand only for the branch check, which pairs every ``ForwardMode`` with
either logprob flag, and where that constructor fails on the host, which the
install report then notes). The batches are chosen so that every point on
which releases differ shows:

* a batch with start 0, start == extend and a start in between, B = 1 with
  one token, B = 1 with start == extend, several requests, each with and
  without padding rows past the tokens (full of NaN: a read would show);
* aux layers absent, as a list, empty, and as one packed tensor; states
  before the norm present or not; float32 and bfloat16.

From what the release returns it derives the :class:`Contract` (a trailing
``token_to_seq_idx`` entry? packed aux handled? ``*_indices_cpu`` written on
the metadata? list aux pruned, or dropped as before SGLang PR #21589?), then
runs flatgather under that contract on every batch and compares everything:
the 6-tuple (types, dtypes, shapes, devices, bytes) and every attribute of
the metadata afterwards. One difference and the probe fails, naming it.

It also checks, on the same batches, that:

* every ``ForwardMode`` of the release takes the same branch in flatgather
  as in the release (flatgather takes over the logprob branch alone);
* lazy aux pruning stores, through the release's own
  ``_get_hidden_states_to_store``, exactly what the release stores, under
  NULL, LAST and FULL capture (with and without before-norm states, and on a
  batch of 32 requests); and that in the release's ``forward`` the aux
  result flows into ``_get_hidden_states_to_store`` and nowhere else (read
  off its bytecode). If either fails, lazy aux pruning stays off;
* under FULL capture the release's store reads no pruned aux row: it is
  handed a :class:`~flatgather.sglang.patches.pruned_states.runtime.LazyAuxPruned`, which
  fails on any use, and must store what it stores from the full result.
  Only then does FULL capture gather no aux row.

Some releases cannot run their own function on a machine without CUDA
(0.5.12 pins its index tensors unconditionally). On such a host the probe
runs the release's function with ``pin_memory`` switched off: pinning changes
no value, and the verdict says that it was done.
"""

from __future__ import annotations

import copy
import dataclasses
import dis
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from flatgather.sglang.compare import first_difference
from flatgather.sglang.patches.pruned_states.runtime import (
    Contract,
    LazyGate,
    lazy_scope,
    make_hidden_states_to_store,
    make_pruned_states,
    store_problem,
)
from flatgather.sglang.unpinned import Unpinned, first_run, within

__all__ = ["Derived", "ProbeFailed", "Verdict", "derive", "run", "verify"]

HIDDEN = 4
LAYERS = 2
PAD_ROWS = 3

# (extend_seq_lens, extend_logprob_start_lens)
BATCHES = (
    ([4, 5, 6], [0, 5, 3]),  # start 0, start == extend, in between
    ([1], [0]),  # B = 1, one token
    ([3], [3]),  # B = 1, a chunk with nothing to score: the release asks no logprob
    ([2, 7, 1, 5], [2, 0, 0, 5]),
)
AUX_KINDS = ("none", "list", "empty-list", "packed")


class ProbeFailed(Exception):
    """flatgather's answer differs from the release's; the message names the
    first difference."""


@dataclass(frozen=True)
class Verdict:
    contract: Contract
    lazy_aux: bool
    """Lazy aux pruning was verified against this release."""
    lazy_aux_note: str
    """Why lazy aux pruning stays off, when it does."""
    lazy_full: bool
    """Under FULL capture the release's store reads no pruned aux row, so
    lazy aux pruning gathers none (verified with a sentinel)."""
    lazy_full_note: str
    """Why FULL capture still gathers every kept aux row, when it does."""
    cases: int
    """Calls compared, the release's own against flatgather's."""
    seconds: float
    pin_neutralised: bool
    """The release's function pins memory unconditionally and this host has
    no CUDA: the probe ran it with ``pin_memory=False``."""
    metadata_note: str = ""
    """Why the probe built some metadata by hand rather than with the
    release's own ``from_forward_batch``, when it did."""


RESULT_FIELDS = (
    "pruned_states",
    "pruned_states_before_norm",
    "aux_pruned_states",
    "sample_indices",
    "input_logprob_indices",
    "token_to_seq_idx",
)


def _outcome(fn: Callable, *args):
    try:
        return ("returned", fn(*args))
    except Exception as exc:  # compared by type: the same failure, or none
        return ("raised", type(exc).__name__)


class _Release:
    """The release's classes and its own functions, called as the probe needs."""

    def __init__(self, module: ModuleType, no_pin: Unpinned | None) -> None:
        from sglang.srt.model_executor.forward_batch_info import (
            CaptureHiddenMode,
            ForwardBatch,
            ForwardMode,
        )

        self.metadata_cls = module.LogitsMetadata
        self.batch_cls = ForwardBatch
        self.forward_mode = ForwardMode
        self.capture_mode = CaptureHiddenMode
        self.fields = {f.name for f in dataclasses.fields(self.metadata_cls)}
        self.batch_fields = {f.name for f in dataclasses.fields(ForwardBatch)}
        raw = vars(module.LogitsProcessor)
        self.pruned_states = raw["_get_pruned_states"]
        self.hidden_to_store = raw["_get_hidden_states_to_store"]
        self.forward = raw["forward"]
        self.no_pin = no_pin
        self.built: dict = {}
        self.by_hand_note = ""
        """Why some metadata was built by hand, when it was."""

    def metadata(self, extend, start, capture="NULL", mode=None):
        """EXTEND metadata with input logprobs as every real batch has it:
        built by the release's own ``LogitsMetadata.from_forward_batch`` from
        a ``ForwardBatch`` (once per batch; each call gets a copy). By hand
        for another ``mode`` (the branch check pairs every mode with either
        flag), or where the release's constructor fails on this host."""
        if mode is not None:
            return self._by_hand(extend, start, capture, mode)
        key = (tuple(extend), tuple(start), capture)
        template = self.built.get(key)
        if template is None:
            try:
                template = self._from_forward_batch(extend, start, capture)
            except Exception as exc:
                self.by_hand_note = self.by_hand_note or (
                    "the probe built LogitsMetadata by hand: the release's "
                    f"from_forward_batch failed: {type(exc).__name__}: {exc}"
                )
                template = self._by_hand(extend, start, capture, None)
            self.built[key] = template
        return copy.copy(template)

    def _from_forward_batch(self, extend, start, capture):
        bs, tokens = len(extend), sum(extend)
        values = {
            "forward_mode": self.forward_mode.EXTEND,
            "batch_size": bs,
            "input_ids": torch.zeros(tokens, dtype=torch.int64),
            "req_pool_indices": torch.arange(bs),
            "seq_lens": torch.tensor(extend),
            "out_cache_loc": torch.arange(tokens),
            "seq_lens_sum": tokens,
            "return_logprob": True,
            "extend_seq_lens": torch.tensor(extend, dtype=torch.int32),
            "extend_seq_lens_cpu": list(extend),
            "extend_logprob_start_lens_cpu": list(start),
            "top_logprobs_nums": [0] * bs,
            "token_ids_logprobs": [None] * bs,
            "capture_hidden_mode": getattr(self.capture_mode, capture),
        }
        batch = self.batch_cls(**{k: v for k, v in values.items() if k in self.batch_fields})
        return self.metadata_cls.from_forward_batch(batch)

    def _by_hand(self, extend, start, capture, mode):
        values = {
            "forward_mode": self.forward_mode.EXTEND if mode is None else mode,
            "capture_hidden_mode": getattr(self.capture_mode, capture),
            "extend_return_logprob": True,
            "extend_seq_lens": torch.tensor(extend, dtype=torch.int32),
            "extend_seq_lens_cpu": list(extend),
            "extend_logprob_start_lens_cpu": list(start),
            "extend_logprob_pruned_lens_cpu": [e - s for e, s in zip(extend, start, strict=True)],
        }
        return self.metadata_cls(**{k: v for k, v in values.items() if k in self.fields})

    def stock(self, *args):
        with within(self.no_pin):
            return self.pruned_states(None, *args)


def _inputs(extend, dtype, before_norm, aux_kind, pad, seed):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(extend)

    def tensor(width):
        t = torch.randn(tokens + pad, width, generator=gen)
        t[tokens:] = float("nan")  # padding: never to be read
        return t.to(dtype)

    h = tensor(HIDDEN)
    b = tensor(HIDDEN) if before_norm else None
    aux = {
        "none": lambda: None,
        "list": lambda: [tensor(HIDDEN) for _ in range(LAYERS)],
        "empty-list": lambda: [],
        "packed": lambda: tensor(HIDDEN * LAYERS),
    }[aux_kind]()
    return h, b, aux


def _derive(release: _Release) -> Contract:
    extend, start = BATCHES[0]
    h, _, aux = _inputs(extend, torch.float32, False, "list", 0, 0)
    md = release.metadata(extend, start)
    pruned, _, aux_pruned, _, _, token_to_seq = release.stock(h, None, aux, md)
    packed = torch.cat(aux, dim=-1)
    kind, result = _outcome(release.stock, h, None, packed, release.metadata(extend, start))
    return Contract(
        trailing_token_to_seq=len(token_to_seq) == pruned.shape[0] + 1,
        packed_aux=kind == "returned" and isinstance(result[2], torch.Tensor),
        writes_cpu_indices=getattr(md, "sample_indices_cpu", None) is not None,
        prunes_aux=aux_pruned is not None,
    )


def _expected(release: _Release, contract: Contract, extend, start, h, b, aux):
    md = release.metadata(extend, start)
    result = release.stock(h, b, aux, md)
    if isinstance(aux, list) and not contract.prunes_aux:
        # The backport: each layer pruned as the release prunes hidden_states.
        layers = [
            release.stock(layer, None, None, release.metadata(extend, start))[0] for layer in aux
        ]
        result = (*result[:2], layers, *result[3:])
    return result, md


def _compare_call(actual, expected, md_ours) -> str | None:
    """flatgather's outcome against the release's: the same exception type,
    or the same six values and the same metadata afterwards."""
    if expected[0] != actual[0] or expected[0] == "raised":
        return first_difference(actual, expected, "outcome")
    (result, md_stock), ours = expected[1], actual[1]

    def named(values, md):
        fields = {f"logits_metadata.{k}": v for k, v in vars(md).items()}
        return {**dict(zip(RESULT_FIELDS, values, strict=True)), **fields}

    if len(ours) != len(RESULT_FIELDS):
        return f"result: expected {len(RESULT_FIELDS)} values, got {len(ours)}"
    return first_difference(named(ours, md_ours), named(result, md_stock), "")


def _check_branches(release: _Release, ours: Callable) -> str | None:
    """Every ForwardMode, with logprobs asked or not: the same outcome."""
    extend, start = BATCHES[0]
    # No aux layers: the branch shows in hidden_states alone, and 0.5.10's
    # dropped aux layers would differ from the backport in the logprob branch.
    h, b, aux = _inputs(extend, torch.float32, True, "none", 0, 1)
    for mode, logprob in itertools.product(release.forward_mode, (True, False)):
        md_stock = release.metadata(extend, start, mode=mode)
        md_ours = release.metadata(extend, start, mode=mode)
        md_stock.extend_return_logprob = md_ours.extend_return_logprob = logprob
        expected = _outcome(release.stock, h, b, aux, md_stock)
        with within(release.no_pin):
            actual = _outcome(ours, None, h, b, aux, md_ours)
        found = first_difference(actual, expected, f"ForwardMode.{mode.name}")
        if found:
            return found
    return None


def aux_flow_problem(forward) -> str | None:
    """None when, in ``forward``'s bytecode, the aux result of
    ``_get_pruned_states`` is stored once and loaded once, as an argument of
    ``_get_hidden_states_to_store``; otherwise what was found instead."""
    code = forward.__code__
    instructions = list(dis.get_instructions(code))

    def names(ins) -> tuple:
        return ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)

    def attr_loads(attr):
        return [
            i
            for i, ins in enumerate(instructions)
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and attr in names(ins)
        ]

    pruned_calls = attr_loads("_get_pruned_states")
    store_calls = attr_loads("_get_hidden_states_to_store")
    if len(pruned_calls) != 1 or len(store_calls) != 1:
        return "forward does not call _get_pruned_states and _get_hidden_states_to_store once each"
    unpack = next(
        (
            i
            for i in range(pruned_calls[0], len(instructions))
            if instructions[i].opname == "UNPACK_SEQUENCE"
        ),
        None,
    )
    if unpack is None or instructions[unpack].arg != 6:
        return "forward does not unpack six values from _get_pruned_states"
    stored: list[str] = []
    for ins in instructions[unpack + 1 :]:
        if not ins.opname.startswith("STORE_FAST") or len(stored) >= 6:
            break
        stored.extend(names(ins))
    if len(stored) < 3:
        return "forward does not keep the aux result in a local variable"
    var = stored[2]
    if var in code.co_cellvars:
        return f"forward shares {var} with a nested function"
    uses = [i for i, ins in enumerate(instructions) if "FAST" in ins.opname and var in names(ins)]
    loads = [i for i in uses if instructions[i].opname.startswith("LOAD")]
    if len(uses) != 2 or len(loads) != 1:
        return f"forward uses {var} {len(uses)} times, not once stored and once passed on"
    end = next(
        (
            i
            for i in range(store_calls[0], len(instructions))
            if instructions[i].opname.startswith("CALL")
        ),
        len(instructions),
    )
    if not store_calls[0] < loads[0] < end:
        return f"forward reads {var} outside its call of _get_hidden_states_to_store"
    return None


def _lazy_store(gate, pruned_states, processor, h, b, aux, md):
    """What ``processor``'s store stores from ``pruned_states``'s result,
    both run as inside a patched ``forward``."""
    store = type(processor)._get_hidden_states_to_store
    with lazy_scope(gate):
        result = pruned_states(processor, h, b, aux, md)
        return _outcome(store, processor, h, b, aux, *result[:4], md)


# The lazy check's batches: the seed batch, 32 requests of every kind, and
# one request (its sampled row sliced, not gathered).
LAZY_BATCHES = (BATCHES[0], ([6] * 32, [0, 3, 6, 5] * 8), ([6], [2]))


def _stored_difference(actual, expected, inputs, where: str) -> str | None:
    """:func:`first_difference`, and where the release's store makes a
    tensor of its own, flatgather's must not share memory with the inputs."""
    found = first_difference(actual, expected, where)
    if found:
        return found
    memory = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    memory.discard(0)

    def aliases(outcome) -> bool:
        value = outcome[1]
        return isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() in memory

    if aliases(actual) and not aliases(expected):
        return f"{where}: shares memory with the inputs, where the release's is a tensor of its own"
    return None


def _check_lazy(release: _Release, contract: Contract) -> tuple[str | None, str | None]:
    """NULL, LAST and FULL capture through the release's own
    ``_get_hidden_states_to_store``: what it stores from the release's full
    result, and from flatgather's lazy one. Returns why lazy aux pruning
    stays off (None: verified) and why FULL capture still gathers every kept
    aux row (None: verified that the release's FULL store reads none of
    them: it is handed a :class:`LazyAuxPruned`, which fails on any use)."""
    problem = aux_flow_problem(release.forward) or store_problem(release.hidden_to_store)
    if problem:
        return problem, problem
    gate = LazyGate()
    store = make_hidden_states_to_store(release.hidden_to_store)
    # Lazy aux pruning applies to a processor whose class's store is the wrapper.
    processor = type("ProbedProcessor", (), {"_get_hidden_states_to_store": store})()
    lazy = {
        full: make_pruned_states(release.pruned_states, contract, gate, lazy_full=full, store=store)
        for full in (False, True)
    }
    kinds = ("list", "packed") if contract.packed_aux else ("list",)
    variants = ((False, 0), (True, PAD_ROWS))  # (before-norm states, padding rows)
    full_problem = None
    for (extend, start), kind, capture, (before_norm, pad) in itertools.product(
        LAZY_BATCHES, kinds, ("NULL", "LAST", "FULL"), variants
    ):
        h, b, aux = _inputs(extend, torch.float32, before_norm, kind, pad, 2)
        expected_result, md_stock = _expected(release, contract, extend, start, h, b, aux)
        md_stock.capture_hidden_mode = getattr(release.capture_mode, capture)
        expected = _outcome(
            release.hidden_to_store, None, h, b, aux, *expected_result[:4], md_stock
        )
        where = (
            f"stored hidden states ({capture}, {kind} aux, {len(extend)} requests, "
            f"{'with' if before_norm else 'no'} before-norm, {pad} padding rows)"
        )

        inputs = (h, b, aux, release.metadata(extend, start, capture))
        tensors = [h, b, *(aux if isinstance(aux, list) else [aux])]
        if capture == "FULL" and full_problem is None:
            found = _stored_difference(
                _lazy_store(gate, lazy[True], processor, *inputs), expected, tensors, where
            )
            if found is None:
                continue
            full_problem = f"the release's FULL store reads the pruned aux layers: {found}"
            inputs = (*inputs[:3], release.metadata(extend, start, capture))
        found = _stored_difference(
            _lazy_store(gate, lazy[False], processor, *inputs), expected, tensors, where
        )
        if found:
            return found, full_problem or found
    return None, full_problem


@dataclass
class Derived:
    """What :func:`derive` found: the release, as the probe calls it, and
    the contract its answers fit."""

    release: _Release
    contract: Contract
    started: float
    """When the probe began (``time.perf_counter()``)."""


def derive(logits_processor: ModuleType) -> Derived:
    """The running release's contract, read off its own answers. Raises
    :class:`ProbeFailed` where its function cannot be probed."""
    started = time.perf_counter()
    try:
        release = _Release(logits_processor, None)

        def derive_once(no_pin: Unpinned | None) -> Contract:
            release.no_pin = no_pin
            return _derive(release)

        contract, _ = first_run(derive_once)
    except Exception as exc:
        raise ProbeFailed(
            f"the release's _get_pruned_states could not be probed: {type(exc).__name__}: {exc}"
        ) from exc
    return Derived(release, contract, started)


def verify(derived: Derived) -> Verdict:
    """flatgather under the derived contract against the release, on every
    batch; then lazy aux pruning. Raises :class:`ProbeFailed` naming the
    first difference."""
    release, contract = derived.release, derived.contract
    no_pin = release.no_pin
    ours = make_pruned_states(release.pruned_states, contract)
    cases = 0
    # Two variants of every batch and aux kind cover both sides of the other
    # axes: no before-norm states, no padding, float32; and all of them.
    variants = ((False, 0, torch.float32), (True, PAD_ROWS, torch.bfloat16))
    for (extend, start), aux_kind, (before_norm, pad, dtype) in itertools.product(
        BATCHES, AUX_KINDS, variants
    ):
        h, b, aux = _inputs(extend, dtype, before_norm, aux_kind, pad, cases)
        expected = _outcome(_expected, release, contract, extend, start, h, b, aux)
        md_ours = release.metadata(extend, start)
        with within(no_pin):
            actual = _outcome(ours, None, h, b, aux, md_ours)
        cases += 1
        where = (
            f"batch extend={extend} start={start}, {aux_kind} aux, "
            f"{'with' if before_norm else 'no'} before-norm, {pad} padding rows, {dtype}"
        )
        found = _compare_call(actual, expected, md_ours)
        if found:
            raise ProbeFailed(f"{where}: {found}; contract tried: {contract.describe()}")
    found = _check_branches(release, ours)
    if found:
        raise ProbeFailed(f"branch taken differs: {found}")
    lazy_problem, full_problem = _check_lazy(release, contract)
    return Verdict(
        contract=contract,
        lazy_aux=lazy_problem is None,
        lazy_aux_note=lazy_problem or "",
        lazy_full=lazy_problem is None and full_problem is None,
        lazy_full_note=full_problem or "",
        cases=cases,
        seconds=time.perf_counter() - derived.started,
        pin_neutralised=bool(no_pin and no_pin.hits),
        metadata_note=release.by_hand_note,
    )


def run(logits_processor: ModuleType) -> Verdict:
    """Derive the running release's contract and verify flatgather against
    it. Raises :class:`ProbeFailed` naming the first difference."""
    return verify(derive(logits_processor))
