"""The engine bench's additions to every process of a served engine: what a
message costs and where each process spends its time, read between two marks.

``benches/engine.py`` puts this directory first on the ``PYTHONPATH`` of the
engines it starts, so Python imports this module, not the engine tests' own
``sitecustomize`` (``tests/engine/site``, further down the path): this module
runs that one first, so every engine process still gets the tests' additions
(the tree-mask fix, their scheduler profile), unchanged.

With ``FLATGATHER_BENCH_COUNTS`` naming a directory, each process:

- counts what it sends on a ZeroMQ socket: the frames and their bytes (the
  messages as they go on the wire, whatever the codec), and, for the objects
  sent with ``send_pyobj`` (the release's pickle IPC), their type, count,
  pickled bytes and the seconds spent pickling them;
- registers itself (``<pid>.alive``) and watches ``<dir>/mark`` from a daemon
  thread: each time the mark file names a new label, it writes
  ``<pid>-<label>.json``, its counters at that moment: the counts above, its
  CPU seconds, the garbage collector's collections and the CPU seconds they
  took per generation, and which
  of the server's processes it is (told by the function at the bottom of its
  main thread's stack: the scheduler's and the detokenizer's entry points);
- in the process that runs the model (the scheduler), times by the CPU
  clock of the thread that runs them its steps (``Scheduler.run_batch`` and
  ``process_batch_result``) and, inside them, the model runner's two
  stages: its ``forward`` (the model, the logits processor, the input
  logprobs) and its sampling (``sample`` and ``compute_logprobs_only``: the
  sampler, with the output logprobs' vocabulary-wide ``log_softmax``, top-k
  and id gathers), and the output streamer's ``stream_output`` (building each
  step's output message, a dozen logprob fields per request, and sending it:
  the pickling included). They are wrapped from the watching thread as soon as the
  release's classes exist, long before the first mark; a stage called
  inside itself (one sampling function calling the other) is counted once.

The bench writes the mark before and after the calls it measures and reads
the differences, so start-up and shutdown never count.

With ``FLATGATHER_BENCH_CPROFILE=1`` as well, ``cProfile`` runs in the main
thread of every process from its start, and each snapshot carries the
profile's totals per function; the bench subtracts the two snapshots. The
profile is read with ``getstats()``, never stopped or cleared, with the
collector held off while it is read (nothing in the reading thread lets the
main thread run meanwhile).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path (the engine tests')."""
    import importlib.util

    for entry in sys.path:
        if not entry or os.path.abspath(entry) == HERE:
            continue
        path = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_engine_tests_sitecustomize", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            return


_chain()

COUNTS = os.environ.get("FLATGATHER_BENCH_COUNTS")
CPROFILE = os.environ.get("FLATGATHER_BENCH_CPROFILE") == "1"
POLL_S = 0.05

ROLES = {
    # The function at the bottom of a spawned process's main thread, in the
    # releases' own names.
    "run_scheduler_process": "scheduler",
    "run_scheduler_process_with_init_pipe": "scheduler",
    "run_detokenizer_process": "detokenizer",
}

_sent = {"frames": 0, "bytes": 0}
_pickled: dict[str, list] = {}
"""Type name -> [objects, pickled bytes, seconds pickling]."""
_profiler = None
_gc_s = [0.0, 0.0, 0.0]
"""CPU seconds spent in the garbage collector, per generation collected."""
_gc_started = [0.0]
STAGES = {
    ("sglang.srt.managers.scheduler", "Scheduler"): {
        "run_batch": "step",
        "process_batch_result": "step",
    },
    ("sglang.srt.model_executor.model_runner", "ModelRunner"): {
        "forward": "forward",
        "sample": "sample",
        "compute_logprobs_only": "sample",
    },
    # 0.5.13 on; flatgather patches none of these methods (a wrapper on a
    # method it patches would be refused by its proof, and the side left stock).
    ("sglang.srt.managers.scheduler_components.output_streamer", "SchedulerOutputStreamer"): {
        "stream_output": "streaming",
    },
}
"""(module, class) -> {method: the stage it is counted in}."""
_stages: dict[str, list] = {stage: [0, 0.0] for by in STAGES.values() for stage in by.values()}
"""Stage -> [calls, CPU seconds of the thread that ran it]."""
_stages_wrapped: set = set()
"""The classes of ``STAGES`` already wrapped."""
MANUAL = False
"""Set by a process that writes its own snapshots (the bench's client, at the
exact edges of its calls) rather than leave them to the watching thread."""


def _size(data) -> int:
    try:
        return memoryview(data).nbytes
    except TypeError:
        try:
            return len(data)
        except TypeError:
            return 0


def _wrap_zmq() -> None:
    import pickle
    import time

    import zmq

    cls = zmq.Socket
    send = cls.send
    clock = time.perf_counter

    def counted_send(self, data, *args, **kwargs):
        _sent["frames"] += 1
        _sent["bytes"] += _size(data)
        return send(self, data, *args, **kwargs)

    def counted_send_pyobj(self, obj, flags=0, protocol=pickle.DEFAULT_PROTOCOL, **kwargs):
        # pyzmq's own send_pyobj, with the pickling timed and its size kept.
        started = clock()
        msg = pickle.dumps(obj, protocol)
        seconds = clock() - started
        entry = _pickled.setdefault(type(obj).__name__, [0, 0, 0.0])
        entry[0] += 1
        entry[1] += len(msg)
        entry[2] += seconds
        return self.send(msg, flags=flags, **kwargs)

    cls.send = counted_send
    cls.send_pyobj = counted_send_pyobj


def _role() -> str:
    import threading

    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        role = ROLES.get(frame.f_code.co_name)
        if role:
            return role
        frame = frame.f_back
    return "main"


def _label(code) -> str:
    if isinstance(code, str):
        return code
    return f"{code.co_filename}:{code.co_firstlineno}({code.co_name})"


def _profile_totals() -> dict:
    """Per function: [calls, seconds inside it and its callees, seconds in
    its own code, {callee: seconds under this function}] (callees only for
    code of the server's packages: what the bench uses to tell nesting)."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        stats = _profiler.getstats()
    finally:
        if enabled:
            gc.enable()
    out = {}
    for entry in stats:
        label = _label(entry.code)
        callees = {}
        if not isinstance(entry.code, str) and ("sglang" in label or "flatgather" in label):
            callees = {_label(sub.code): sub.totaltime for sub in entry.calls or ()}
        out[label] = [entry.callcount, entry.totaltime, entry.inlinetime, callees]
    return out


def _counters() -> dict:
    import gc

    times = os.times()
    return {
        "cpu_s": times.user + times.system,
        "gc_collections": [g["collections"] for g in gc.get_stats()],
        "gc_s": list(_gc_s),
        "sent": dict(_sent),
        "pickled": {k: list(v) for k, v in _pickled.items()},
        "stages": {k: list(v) for k, v in _stages.items()},
    }


def _wrap_stages() -> bool:
    """Time the stages of every class of ``STAGES`` that exists by now (see
    the module's docstring); True once all are done (a process that never
    loads them asks every tick: a dictionary lookup a class)."""
    import functools
    import threading
    import time

    clock = time.thread_time
    active = threading.local()

    def timed(method, stage):
        entry = _stages[stage]

        @functools.wraps(method)
        def wrapper(*args, **kwargs):
            running = active.__dict__.setdefault("stages", set())
            if stage in running:
                return method(*args, **kwargs)
            running.add(stage)
            started = clock()
            try:
                return method(*args, **kwargs)
            finally:
                entry[1] += clock() - started
                entry[0] += 1
                running.discard(stage)

        return wrapper

    for (module_name, class_name), methods in STAGES.items():
        if (module_name, class_name) in _stages_wrapped:
            continue
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is None:
            continue
        for name, stage in methods.items():
            method = cls.__dict__.get(name)
            if method is not None:
                setattr(cls, name, timed(method, stage))
        _stages_wrapped.add((module_name, class_name))
    return len(_stages_wrapped) == len(STAGES)


def snapshot(label: str) -> None:
    """Write this process's counters under ``label``. Reading the profile
    costs CPU time and allocations of its own: it is read before the
    counters at the window's start and after them at its end, so that cost
    stays outside the window."""
    import json
    import threading

    # Called in the profiled thread (the bench's client writes its own
    # snapshots): the snapshot is no part of the profile.
    paused = _profiler is not None and threading.current_thread() is threading.main_thread()
    if paused:
        _profiler.disable()
    data = {"pid": os.getpid(), "role": _role()}
    if _profiler is not None and label == "before":
        data["profile"] = _profile_totals()
    data |= _counters()
    if _profiler is not None and label != "before":
        data["profile"] = _profile_totals()
    path = os.path.join(COUNTS, f"{os.getpid()}-{label}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)
    if paused:
        _profiler.enable()


def _watch() -> None:
    import time

    mark = os.path.join(COUNTS, "mark")
    seen = None
    while True:
        time.sleep(POLL_S)
        if len(_stages_wrapped) < len(STAGES):
            _wrap_stages()
        try:
            with open(mark) as f:
                label = f.read().strip()
        except OSError:
            continue
        if label and label != seen:
            seen = label
            if MANUAL:
                continue
            try:
                snapshot(label)
            except Exception as exc:  # the bench reports the missing snapshot
                print(f"[engine bench] snapshot {label} failed: {exc!r}", file=sys.stderr)


def _time_collections() -> None:
    """Time every collection by the clock of the thread that runs it (one at
    a time: a collection holds the interpreter's lock): a full collection
    of a large heap costs hundreds of milliseconds, so whether one falls in
    the measured window decides a process's CPU per request more than the
    work of the requests does; the bench reports the two apart."""
    import gc
    import time

    clock = time.thread_time

    def timer(phase, info):
        if phase == "start":
            _gc_started[0] = clock()
        else:
            _gc_s[info["generation"]] += clock() - _gc_started[0]

    gc.callbacks.append(timer)


def _start() -> None:
    global _profiler
    import threading
    import time

    _time_collections()
    _wrap_zmq()
    with open(os.path.join(COUNTS, f"{os.getpid()}.alive"), "w"):
        pass
    threading.Thread(target=_watch, name="engine-bench-counts", daemon=True).start()
    if CPROFILE:
        import cProfile

        # Timed by the main thread's CPU clock: a process descheduled or
        # waiting on a socket adds nothing, so its functions' times add up
        # to no more than its CPU time (a wall clock on a busy machine gave
        # shares above 100%).
        _profiler = cProfile.Profile(time.thread_time)
        _profiler.enable()


if COUNTS:
    _start()
