"""The engine tests' two additions to every engine process, both sides alike.

1. **The tree mask the Triton backend reads.** Under the CPU engine SGLang's
   ``eagle_utils.default_tree_mask_mode()`` picks the compact QLEN_ONLY tree
   mask, the layout its AMX attention reads; the Triton backend (the one EAGLE
   accepts on a CPU without AMX) reads the FULL_MASK layout, so it read past
   the compact mask into memory nobody wrote, and two runs of the same stock
   engine gave different speculative outputs. This module makes that function
   answer FULL_MASK, as it does on a GPU, the moment ``eagle_utils`` is
   imported (before anything binds the name). That is SGLang's CPU engine,
   not flatgather: both sides get the same fix.
2. **The trace**: which of flatgather's paths a real engine ran.
3. **The profile** (``FLATGATHER_ENGINE_PROFILE`` names a file), for the
   engine bench: the scheduler's step time (``Scheduler.run_batch`` and
   ``process_batch_result``) and the time inside the functions whose loops
   flatgather replaces, whichever object is in place when the event loop
   first steps (the release's, or flatgather's), written to that file after
   every step.

This directory is on the ``PYTHONPATH`` of both sides' engines (for the
``sgl_kernel`` stand-in beside it), so Python imports this module at the start
of every engine process. It does nothing unless ``FLATGATHER_ENGINE_TRACE``
names a file. Then, as each flatgather module is imported, it wraps the few
module-level names that only flatgather's own path reaches (the Rust plan of
each patch, the one-request copy, the lazy aux resolution, the flat output
chain) and the methods flatgather rebuilds from the release's source; the
first call of each appends one line, ``<marker> <pid>``, to that file.
Nothing flatgather compares by identity is wrapped, so what it does is
unchanged; with flatgather off, nothing is ever wrapped and the file stays
empty.
"""

from __future__ import annotations

import functools
import os
import sys

TRACE = os.environ.get("FLATGATHER_ENGINE_TRACE")

# module -> (attribute path, marker)
MARKERS = {
    "flatgather.sglang.patches.pruned_states.runtime": (
        ("PrunePlan", "prune: flat plan (B >= 2)"),
        ("copy_rows", "prune: one-request copy"),
        ("LazyAuxPruned.resolve", "prune: lazy aux resolved at the store"),
    ),
    "flatgather.sglang.patches.input_logprobs.runtime": (
        ("TokenIdsPlan", "input logprobs: token-id plan"),
    ),
    "flatgather.sglang.patches.draft_prefill.runtime": (
        ("RotationPlan", "draft prefill: flat rotation"),
    ),
    "flatgather.sglang.patches.output_logprobs.runtime": (
        ("SpecLogprobsPlan.top_k", "output logprobs: top-k plan"),
        ("SpecLogprobsPlan.token_ids", "output logprobs: token-id plan"),
        ("rows_to_host", "output chain: rebuilt host-copy loop"),
        ("rows_tolist", "output chain: rebuilt tolist loop"),
        ("_views", "output chain: one host copy"),
        ("_Flat.tolist", "output chain: one tolist"),
    ),
}
REBUILT = {
    "process_batch_result_prefill": "prefill results: rebuilt method",
    "_draft_extend_for_prefill": "draft prefill: rebuilt method",
}
"""Methods flatgather rebuilds from the release's source, marked when its
patch is applied (wrapped then, so its revert still finds its own object)."""

_seen: set[str] = set()


def _serving() -> bool:
    """Whether the scheduler's event loop (``Scheduler.event_loop_*``, the
    same name in every release) is on the stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name.startswith("event_loop"):
            return True
        frame = frame.f_back
    return False


def mark(marker: str) -> None:
    if marker in _seen or not _serving():
        return
    _seen.add(marker)
    with open(TRACE, "a") as f:
        f.write(f"{marker}\t{os.getpid()}\n")


def _counting(fn, marker):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        mark(marker)
        return fn(*args, **kwargs)

    return wrapper


class _Plan:
    """Stands for a Rust plan class whose constructors are static methods."""

    def __init__(self, cls, names: dict[str, str]) -> None:
        self._cls = cls
        for name, marker in names.items():
            setattr(self, name, _counting(getattr(cls, name), marker))

    def __getattr__(self, name):
        return getattr(self._cls, name)


def _wrap(module, markers) -> None:
    statics: dict[str, dict[str, str]] = {}
    for path, marker in markers:
        owner_name, _, attr = path.rpartition(".")
        if not owner_name:
            setattr(module, path, _counting(getattr(module, path), marker))
            continue
        owner = getattr(module, owner_name)
        if isinstance(owner, type) and owner.__module__ == module.__name__:
            setattr(owner, attr, _counting(vars(owner)[attr], marker))
        else:
            statics.setdefault(owner_name, {})[attr] = marker
    for owner_name, names in statics.items():
        setattr(module, owner_name, _Plan(getattr(module, owner_name), names))


def _wrap_patching(module) -> None:
    apply = module.Swap.apply

    def traced_apply(self):
        marker = REBUILT.get(self.name)
        if marker is not None and callable(self.new):
            self.new = _counting(self.new, marker)
        return apply(self)

    module.Swap.apply = traced_apply


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


def _on_import(fullname: str, module) -> None:
    if fullname == EAGLE_UTILS:
        if hasattr(module, "default_tree_mask_mode"):
            _full_tree_mask(module)
    elif fullname == SCHEDULER:
        _profile_scheduler(module)
    elif fullname in MARKERS:
        _wrap(module, MARKERS[fullname])
    else:
        _wrap_patching(module)


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
if PROFILE:
    _names.add(SCHEDULER)
if TRACE:
    _names |= {*MARKERS, "flatgather.sglang.patching"}
sys.meta_path.insert(0, _Finder(_names))
