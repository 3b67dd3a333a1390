"""Was the machine quiet while the bench ran?

The bench pins torch to ``--threads`` threads (default 1) and counts, from
``/proc``, the CPU time every *other* process used while each section ran,
in cores (1.0 = one core busy the whole time), with the processes that used
the most. It also records the load average before and after, and the time
the hypervisor stole from this machine. :func:`judge` turns that into
warnings; a figure measured under them may be off: multi-threaded copies and
``index_select`` suffer from oversubscription far more than SGLang's many
small slices do.

Standard library only; where ``/proc`` is missing, only the load average is
used.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

DEFAULT_MAX_OTHER_LOAD = 0.5
"""Cores other processes may keep busy, on average, before a warning."""
STEAL_WARN = 0.10
"""Share of CPU time taken by the hypervisor before a warning."""
COMPETITOR_MIN = 0.10
"""Cores a process must use to be named."""


def cpus() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _machine_ticks() -> tuple[int, int] | None:
    """(busy, steal) ticks summed over every CPU, from ``/proc/stat``."""
    try:
        first = (PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    values = [int(x) for x in first[1:]]
    values += [0] * (8 - len(values))
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    return user + nice + system + irq + softirq, steal


def _process_ticks() -> dict[int, int]:
    """CPU ticks (user + system) of every process, by pid."""
    out = {}
    try:
        entries = os.listdir(PROC)
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            raw = (PROC / entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command name sits in parentheses and may hold spaces.
        fields = raw[raw.rfind(")") + 2 :].split()
        out[int(entry)] = int(fields[11]) + int(fields[12])
    return out


def _command(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in raw.split(b"\0") if w]
    if not words:
        try:
            return (PROC / str(pid) / "comm").read_text().strip()
        except OSError:
            return "?"
    words[0] = os.path.basename(words[0])
    text = " ".join(" ".join(words).split())  # one line, whatever `python -c` held
    return text if len(text) <= 70 else text[:67] + "..."


@dataclass(frozen=True)
class Snapshot:
    wall: float
    machine: tuple[int, int] | None
    processes: dict[int, int]


def snapshot() -> Snapshot:
    return Snapshot(time.perf_counter(), _machine_ticks(), _process_ticks())


@dataclass
class Usage:
    """What the rest of the machine did between two snapshots."""

    seconds: float
    other_cores: float | None
    """Cores kept busy by processes other than the bench, on average."""
    steal: float | None
    """Share of the machine's CPU time the hypervisor took."""
    competitors: list[dict] = field(default_factory=list)
    """The other processes that used the most: pid, command, cores."""

    def to_dict(self) -> dict:
        return asdict(self)


def usage(before: Snapshot, after: Snapshot, own_pid: int | None = None, top: int = 3) -> Usage:
    own_pid = os.getpid() if own_pid is None else own_pid
    seconds = max(after.wall - before.wall, 1e-9)
    if before.machine is None or after.machine is None:
        return Usage(round(seconds, 2), None, None)
    busy = (after.machine[0] - before.machine[0]) / TICK
    steal = (after.machine[1] - before.machine[1]) / TICK
    own = (after.processes.get(own_pid, 0) - before.processes.get(own_pid, 0)) / TICK
    competitors = []
    for pid, ticks in after.processes.items():
        if pid == own_pid:
            continue
        cores = (ticks - before.processes.get(pid, 0)) / TICK / seconds
        if cores >= COMPETITOR_MIN:
            competitors.append({"pid": pid, "command": _command(pid), "cores": round(cores, 2)})
    competitors.sort(key=lambda c: -c["cores"])
    return Usage(
        seconds=round(seconds, 2),
        other_cores=round(max(0.0, busy - own) / seconds, 2),
        steal=round(steal / (seconds * cpus()), 3),
        competitors=competitors[:top],
    )


def judge(load: dict, max_other_load: float) -> list[str]:
    """The warnings a run deserves: ``load`` is the bench's ``"load"`` record
    (``cpus``, ``threads``, ``before``, ``after``, and per section a
    :class:`Usage` dict)."""
    warnings = []
    cpus_, threads = load["cpus"], load["threads"]
    frame = f"the bench uses {threads} of {cpus_} cores"
    if threads > cpus_:
        warnings.append(
            f"--threads {threads} is more than the {cpus_} cores this process may use: "
            "the bench competes with itself"
        )
    sections = load.get("sections", {})
    busy = {
        name: use["other_cores"]
        for name, use in sections.items()
        if use.get("other_cores") is not None and use["other_cores"] > max_other_load
    }
    if busy:
        worst = max(busy, key=busy.get)
        busiest = "; ".join(
            f"pid {c['pid']} `{c['command']}` {c['cores']:.1f} cores"
            for c in sections[worst].get("competitors", [])
        )
        per_section = ", ".join(f"{v:.1f} during `{k}`" for k, v in busy.items())
        warnings.append(
            f"busy machine: other processes kept cores busy while the bench ran ({per_section}; "
            f"{frame}; warning above {max_other_load:g} cores)"
            + (f". Busiest during `{worst}`: {busiest}" if busiest else "")
        )
    stolen = {
        name: use["steal"]
        for name, use in sections.items()
        if use.get("steal") is not None and use["steal"] > STEAL_WARN
    }
    if stolen:
        per_section = ", ".join(f"{v:.0%} during `{k}`" for k, v in stolen.items())
        warnings.append(f"busy host: the hypervisor took CPU time from this VM ({per_section})")
    limit = threads + max_other_load
    high = [
        f"{avg[0]:.2f} {when} the run"
        for when in ("before", "after")
        if (avg := load.get(when)) and avg[0] > limit
    ]
    if high:
        warnings.append(
            f"busy machine: 1-minute load average {' and '.join(high)}, above the {threads} "
            f"core(s) the bench uses (+{max_other_load:g})"
        )
    return warnings
