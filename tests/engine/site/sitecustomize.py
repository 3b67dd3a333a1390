"""The engine tests' additions to every engine process, both sides alike.

1. **The tree mask the Triton backend reads.** Under the CPU engine SGLang's
   ``eagle_utils.default_tree_mask_mode()`` picks the compact QLEN_ONLY tree
   mask, the layout its AMX attention reads; the Triton backend (the one EAGLE
   accepts on a CPU without AMX) reads the FULL_MASK layout, so it read past
   the compact mask into memory nobody wrote, and two runs of the same stock
   engine gave different speculative outputs. This module makes that function
   answer FULL_MASK, as it does on a GPU, the moment ``eagle_utils`` is
   imported (before anything binds the name). That is SGLang's CPU engine,
   not flatgather: both sides get the same fix.
2. **The trace** (``FLATGATHER_ENGINE_TRACE`` names a file): what flatgather
   installed and which of its replacements answered in the scheduler's event
   loop, and, on both sides, the retraction race of SGLang #36938 as it
   happened (see below).
3. **The profile** (``FLATGATHER_ENGINE_PROFILE`` names a file), for the
   engine bench: the scheduler's step time (``Scheduler.run_batch`` and
   ``process_batch_result``) and the time inside the functions whose loops
   flatgather replaces, whichever object is in place when the event loop
   first steps (the release's, or flatgather's), written to that file after
   every step.

This directory is on the ``PYTHONPATH`` of both sides' engines (for the
``sgl_kernel`` stand-in beside it), so Python imports this module at the start
of every engine process.

The trace, one line a record, ``<kind>\t<fields>...\t<pid>``:

* ``report``: each patch in each module as the installer recorded it
  (patch, module, state, and, as JSON, its notes: what was left out and why,
  then apart what its vouching rests on);
* ``applied``: each replacement put in place, by its marker
  (``<patch>: <where>``);
* ``answered``: a marker, the first time its replacement, called in the
  event loop, returned flatgather's own answer rather than the release's:
  a function replaced whole answered when it returned without calling the
  release's function it holds (its fallback); a rebuilt method whose loop
  was replaced, when flatgather's helper took its flat path in that call
  (the chain's one host copy or one ``.tolist()``, the draft prefill's
  gather); the #36938 fix, when the method carrying it returned. The pruning
  is marked per path (one request, or several); its lazy store when it
  resolved a lazy aux result, its ``forward`` when it entered the lazy gate
  (neither is wrapped: flatgather compares the store by identity);
* ``handed``: a marker, the first time its replacement handed a call in the
  event loop to the release's code (diagnostics: a replacement that never
  answered was called, or not);
* ``front``: as ``answered``, for a replacement called in the front end's
  loop (the tokenizer manager's ``handle_loop``, in the server's own process:
  the front end's logprob tuples), which the scheduler's trace keeps apart;
* ``untracked``: a replacement this module did not know how to watch (the
  test fails on it);
* ``event``: one line per occurrence, on both sides: ``retracted in flight``
  for each request found retracted when the scheduler processes the result of
  a prefill batch with logprobs that held it (the race of #36938), and
  ``cursor advanced over a retracted request`` for each time the prefill
  result method counts the input logprobs of such a request (only the
  #36938 fix does: the release's skip branch moves on before it counts).

With flatgather off nothing of flatgather is imported, so only events are
written. Replacements are wrapped as they are applied (the wrapper is what the
swap puts in place, so uninstall still finds its own object), and the
release's function a replacement falls back to is swapped, in the
replacement's closure, for one that notes the call; the count of input
logprobs is wrapped at the first step, after flatgather checked its methods.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading

TRACE = os.environ.get("FLATGATHER_ENGINE_TRACE")

PATCHING = "flatgather.sglang.patching"
INSTALLER = "flatgather.sglang.installer"
LAZY_AUX = "flatgather.sglang.patches.pruned_states.runtime"
FLAT_LOGPROBS = "flatgather.sglang.patches.output_logprobs.runtime"
DRAFT_PREFILL = "flatgather.sglang.patches.draft_prefill"

# How each replacement's answer is told apart from the release's is what its
# patch declares (``Patch.answers``: "whole", "flat-path", "returned"); the
# pruning, by its name in the install report, is marked per path besides.
PRUNED = "pruned-states"

RETRACTED = "retracted in flight"
ADVANCED = "cursor advanced over a retracted request"
PREFILL_RESULT = "process_batch_result_prefill"
COUNTS = {
    # module -> the name of the release's count of a request's input logprobs
    "sglang.srt.managers.scheduler_output_processor_mixin": "_calculate_num_input_logprobs",
    "sglang.srt.managers.scheduler_components.logprob_result_processor": (
        "calculate_num_input_logprobs"
    ),
}


def _write(*fields) -> None:
    with open(TRACE, "a") as f:
        f.write("\t".join([*map(str, fields), str(os.getpid())]) + "\n")


_seen: set[tuple[str, str]] = set()


FRONT = "front"
OPENAI_SERVING = os.path.join("sglang", "srt", "entrypoints", "openai", "serving_")


def _serving() -> str | None:
    """``"answered"`` where the scheduler's event loop
    (``Scheduler.event_loop_*``, the same name in every release) is on the
    stack, :data:`FRONT` where the tokenizer manager's ``handle_loop`` is
    (an awaited coroutine's frame links back to its awaiter's) or a
    function of the OpenAI layer's serving modules (a request's handler,
    or the generator of its stream), else None."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_name
        if name.startswith("event_loop"):
            return "answered"
        if name == "handle_loop" or OPENAI_SERVING in frame.f_code.co_filename:
            return FRONT
        frame = frame.f_back
    return None


HANDED = "handed"
"""The record of a replacement's first call, in the event loop, that the
release's code answered: why a marker is missing, where one is."""


def mark(marker: str | None, kind: str = "answered") -> None:
    loop = _serving() if marker is not None else None
    if loop is None:
        return
    if loop == FRONT:
        if kind != "answered":
            return  # the front end's fallbacks are not traced
        kind = FRONT
    if (kind, marker) in _seen:
        return
    _seen.add((kind, marker))
    _write(kind, marker)


# Each call of a watched replacement pushes a frame: [the release's function
# was called, flatgather's helper took its flat path]. What runs inside it
# sets the innermost frame's flags.
_local = threading.local()
RELEASED, FLAT = 0, 1


def _frames() -> list:
    frames = getattr(_local, "frames", None)
    if frames is None:
        frames = _local.frames = []
    return frames


def _flag(which: int) -> None:
    frames = _frames()
    if frames:
        frames[-1][which] = True


def _answering(new, marker, answered, carried=()):
    """``new``, marking ``marker`` (or ``marker(args, kwargs)``) and the
    ``carried`` markers whenever ``answered(frame)`` holds after a call that
    returned."""

    @functools.wraps(new)
    def replaced(*args, **kwargs):
        frames = _frames()
        frame = [False, False]
        frames.append(frame)
        try:
            result = new(*args, **kwargs)
        finally:
            frames.pop()
        if answered(frame):
            mark(marker(args, kwargs) if callable(marker) else marker)
            for other in carried:
                mark(other)
        elif isinstance(marker, str):
            mark(marker, HANDED)
        return result

    replaced._engine_markers = (marker, *carried) if isinstance(marker, str) else carried
    return replaced


_tracked: set[int] = set()


def _track_release(new, release) -> bool:
    """Put, in ``new``'s closure, a stand-in for ``release`` that flags the
    call; False when ``new`` does not hold ``release``."""
    if id(new) in _tracked:
        return True  # one replacement in several modules' globals
    cells = []
    for cell in getattr(new, "__closure__", None) or ():
        try:
            if cell.cell_contents is release:
                cells.append(cell)
        except ValueError:  # an empty cell
            continue
    if not cells:
        return False

    @functools.wraps(release)
    def released(*args, **kwargs):
        _flag(RELEASED)
        return release(*args, **kwargs)

    for cell in cells:
        cell.cell_contents = released
    _tracked.add(id(new))
    return True


_signals: dict[str, str] = {}
"""Markers set off by flatgather's own code rather than a wrapper: the lazy
store's and the lazy forward's."""


def _pruning(marker):
    def which(args, kwargs):
        metadata = args[4] if len(args) > 4 else kwargs.get("logits_metadata")
        lens = getattr(metadata, "extend_seq_lens_cpu", None)
        one = isinstance(lens, list) and len(lens) == 1
        return f"{marker} ({'one request' if one else 'B >= 2'})"

    return which


def _trace_swap(swap, patch: str, answers: str) -> None:
    """Wrap ``swap.new`` so that it marks when it answers, as its patch
    declares (``answers``; see the module's docstring), and write the marker
    it stands for."""
    marker = f"{patch}: {swap.where}"
    prior = vars(swap.target).get(swap.name)
    new = swap.new
    if patch == PRUNED and swap.name in ("_get_hidden_states_to_store", "forward"):
        _signals[swap.name] = marker
        _write("applied", marker)
        return
    if answers == "whole":
        if not _track_release(new, prior):
            _write("untracked", f"{marker}: the release's function is not in its closure")
            return
        label = _pruning(marker) if patch == PRUNED else marker
        swap.new = _answering(new, label, lambda frame: not frame[RELEASED])
    elif answers == "flat-path":
        # A rebuild over a method flatgather rebuilt before (the chain over
        # the #36938 fix up to 0.5.12) carries that fix when it was built
        # from the fix's build.
        build = getattr(new, "__flatgather_build__", None)
        before = getattr(prior, "__flatgather_build__", None)
        carried = ()
        if build is not None and before is not None and build.method is before.method:
            carried = getattr(prior, "_engine_markers", ())
        swap.new = _answering(new, marker, lambda frame: frame[FLAT], carried)
    elif answers == "returned":
        swap.new = _answering(new, marker, lambda frame: True)
    else:
        _write("untracked", f"{marker}: its patch answers {answers!r}, unknown to this trace")
        return
    _write("applied", marker)


_vouched: set[str] = set()
"""The notes of a patch's vouching: what the proof of code replaced whole
rests on (it is code the test matrix runs; how the probe ran), not what was
left out."""


def _vouching(vouch):
    @functools.wraps(vouch)
    def traced_vouch(self, *args, **kwargs):
        notes = vouch(self, *args, **kwargs)
        _vouched.update(notes)
        return notes

    return traced_vouch


def _wrap_patching(module) -> None:
    prepare = module.Patch.prepare
    apply = module.Swap.apply

    def traced_prepare(self, target_module):
        owner = type(self)
        if "_engine_vouch" not in vars(owner):
            owner._engine_vouch = True
            owner.vouch = _vouching(owner.vouch)
        result = prepare(self, target_module)
        for swap in result.swaps:
            swap._engine_patch = (self.name, self.answers)
        return result

    def traced_apply(self):
        patch = getattr(self, "_engine_patch", None)
        if patch is not None and not getattr(self, "_engine_traced", False):
            self._engine_traced = True
            _trace_swap(self, *patch)
        return apply(self)

    module.Patch.prepare = traced_prepare
    module.Swap.apply = traced_apply


def _wrap_installer(module) -> None:
    def traced_record(outcome):
        notes = [n for n in outcome.notes if n not in _vouched]
        vouched = [n for n in outcome.notes if n in _vouched]
        _write(
            "report",
            outcome.patch,
            outcome.module,
            outcome.state,
            json.dumps(notes),
            json.dumps(vouched),
        )

    module.on_record(traced_record)


def _wrap_lazy_aux(module) -> None:
    resolve = module.LazyAuxPruned.resolve
    enter = module.LazyGate.enter

    @functools.wraps(resolve)
    def traced_resolve(self, *args, **kwargs):
        result = resolve(self, *args, **kwargs)
        mark(_signals.get("_get_hidden_states_to_store"))
        return result

    @functools.wraps(enter)
    def traced_enter(self):
        entered = enter(self)
        if entered:
            mark(_signals.get("forward"))
        return entered

    module.LazyAuxPruned.resolve = traced_resolve
    module.LazyGate.enter = traced_enter


def _wrap_flat_logprobs(module) -> None:
    take = module.take

    @functools.wraps(take)
    def traced_take(rows):
        entry = take(rows)
        if entry is not None:
            _flag(FLAT)
        return entry

    module.take = traced_take


def _wrap_draft_prefill(module) -> None:
    # The patch builds its method with the package's ``rotate`` as a free
    # variable: the one wrapped here.
    rotate = module.rotate

    @functools.wraps(rotate)
    def traced_rotate(*args, **kwargs):
        end = rotate(*args, **kwargs)
        if end is not None:
            _flag(FLAT)
        return end

    module.rotate = traced_rotate


def _wrap_counts() -> None:
    """The release's count of a request's input logprobs, noting each count
    of a retracted request in the prefill result method."""
    for module_name, attr in COUNTS.items():
        module = sys.modules.get(module_name)
        for owner in list(vars(module).values()) if module else ():
            if not isinstance(owner, type) or owner.__module__ != module_name:
                continue
            count = vars(owner).get(attr)
            if not callable(count) or isinstance(count, staticmethod | classmethod):
                continue

            def counted(self, req, *args, __count=count, **kwargs):
                if (
                    getattr(req, "is_retracted", False) is True
                    and sys._getframe(1).f_code.co_name == PREFILL_RESULT
                ):
                    _write("event", ADVANCED)
                return __count(self, req, *args, **kwargs)

            setattr(owner, attr, functools.wraps(count)(counted))


def _trace_scheduler(module) -> None:
    cls = module.Scheduler
    inner = vars(cls)["process_batch_result"]
    counts: list[bool] = []

    @functools.wraps(inner)
    def process_batch_result(self, batch, *args, **kwargs):
        if not counts:
            counts.append(True)
            _wrap_counts()
        if batch.forward_mode.is_extend() and batch.return_logprob:
            for req in batch.reqs:
                if req.is_retracted:
                    _write("event", RETRACTED)
        return inner(self, batch, *args, **kwargs)

    cls.process_batch_result = process_batch_result


PROFILE = os.environ.get("FLATGATHER_ENGINE_PROFILE")
SCHEDULER = "sglang.srt.managers.scheduler"
STEP = ("run_batch", "process_batch_result")
REPLACED = (
    # (module, class or "", attribute): every place, in some release, of a
    # function whose per-request or per-row loop flatgather replaces.
    ("sglang.srt.layers.logits_processor", "LogitsProcessor", "_get_pruned_states"),
    ("sglang.srt.layers.logprob_processor", "", "get_token_ids_logprobs_chunk"),
    ("sglang.srt.layers.logprob_processor", "", "get_top_logprobs"),
    ("sglang.srt.layers.logprob_processor", "", "get_token_ids_logprobs"),
    ("sglang.srt.layers.utils.logprob", "", "get_token_ids_logprobs_chunk"),
    ("sglang.srt.layers.utils.logprob", "", "get_token_ids_logprobs_prefill"),
    ("sglang.srt.layers.utils.logprob", "", "get_top_logprobs"),
    ("sglang.srt.layers.utils.logprob", "", "get_token_ids_logprobs"),
    ("sglang.srt.managers.utils", "GenerationBatchResult", "copy_to_cpu"),
    (
        "sglang.srt.managers.scheduler_components.batch_result_processor",
        "SchedulerBatchResultProcessor",
        "move_logprobs_to_cpu",
    ),
    (
        "sglang.srt.managers.scheduler_components.batch_result_processor",
        "SchedulerBatchResultProcessor",
        "_normalize_decode_outputs",
    ),
)
_totals: dict[str, list] = {}
_profiled = False


def _timed(fn, name: str):
    import time

    entry = _totals.setdefault(name, [0, 0.0])
    clock = time.perf_counter
    collected = _totals.setdefault(GC, [0, 0.0])

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        started, paused = clock(), collected[1]
        try:
            return fn(*args, **kwargs)
        finally:
            # A collection that falls inside the call is the process's, not
            # the function's: it is counted under GC alone.
            entry[0] += 1
            entry[1] += clock() - started - (collected[1] - paused)

    return wrapper


GC = "gc.pauses"
"""The profile's entry for the garbage collector's pauses (collections, seconds)."""


def _count_collections() -> None:
    import gc
    import time

    entry = _totals.setdefault(GC, [0, 0.0])
    started = []

    def on_collect(phase, info):
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            entry[0] += 1
            entry[1] += time.perf_counter() - started.pop()

    gc.callbacks.append(on_collect)


def _profile_replaced() -> None:
    """Wrap, once, whatever is in place of each replaced function now."""
    global _profiled
    _profiled = True
    _count_collections()
    for module_name, owner_name, attr in REPLACED:
        module = sys.modules.get(module_name)
        owner = getattr(module, owner_name, None) if owner_name else module
        if owner is None or attr not in vars(owner):
            continue
        raw = vars(owner)[attr]
        if isinstance(raw, staticmethod | classmethod):
            continue
        key = f"{owner_name or module_name.rsplit('.', 1)[-1]}.{attr}"
        setattr(owner, attr, _timed(raw, key))


def _dump() -> None:
    import json

    with open(PROFILE + ".tmp", "w") as f:
        json.dump({k: {"calls": n, "s": t} for k, (n, t) in _totals.items()}, f)
    os.replace(PROFILE + ".tmp", PROFILE)


LOOP = ("get_next_batch_to_run", "ingest_requests", "recv_requests")


def _profile_scheduler(module) -> None:
    import time

    cls = module.Scheduler
    for name in LOOP:
        if name in vars(cls):
            setattr(cls, name, _timed(vars(cls)[name], f"loop.{name}"))
    span = _totals.setdefault("loop.first_to_last_step", [0, 0.0])
    first: list[float] = []
    for name in STEP:
        inner = _timed(vars(cls)[name], f"step.{name}")

        def step(self, *args, __inner=inner, __name=name, **kwargs):
            if not _profiled:
                _profile_replaced()
                first.append(time.perf_counter())
            try:
                return __inner(self, *args, **kwargs)
            finally:
                if __name == "process_batch_result":
                    span[0] += 1
                    span[1] = time.perf_counter() - first[0]
                    _dump()

        setattr(cls, name, functools.wraps(inner)(step))


def _full_tree_mask(module) -> None:
    full = module.TreeMaskMode.FULL_MASK
    module.default_tree_mask_mode = lambda: full


EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
TRACED = {
    PATCHING: _wrap_patching,
    INSTALLER: _wrap_installer,
    LAZY_AUX: _wrap_lazy_aux,
    FLAT_LOGPROBS: _wrap_flat_logprobs,
    DRAFT_PREFILL: _wrap_draft_prefill,
}


def _on_import(fullname: str, module) -> None:
    if fullname == EAGLE_UTILS:
        if hasattr(module, "default_tree_mask_mode"):
            _full_tree_mask(module)
    elif fullname == SCHEDULER:
        if TRACE:
            _trace_scheduler(module)
        if PROFILE:
            _profile_scheduler(module)
    elif fullname in TRACED:
        TRACED[fullname](module)


class _Finder:
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        inner = spec.loader

        class Loader:
            def create_module(self, spec):
                return inner.create_module(spec)

            def exec_module(self, module):
                inner.exec_module(module)
                _on_import(fullname, module)

        spec.loader = Loader()
        return spec


_names = {EAGLE_UTILS}
if PROFILE or TRACE:
    _names.add(SCHEDULER)
if TRACE:
    _names |= set(TRACED)
sys.meta_path.insert(0, _Finder(_names))
