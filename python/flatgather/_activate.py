"""The ``FLATGATHER_SGLANG`` switch.

The wheel ships ``flatgather-sglang.pth``; Python runs its one line at the
start of every process, including those that ``multiprocessing`` spawns for
SGLang's schedulers. Without the variable (or with ``0``, ``false``, ``off``,
``no`` or an empty value) the line only reads the environment. Otherwise it
imports this module, which arms an import hook and nothing else: no torch, no
extension, no logging, no CUDA. The moment ``sglang.srt.layers.logits_processor``
is imported, :func:`flatgather.sglang.install` runs. When the probe finds a
release it cannot reproduce exactly, that logs a warning naming the
difference, patches nothing, and the server starts as shipped.
"""

import os
import sys

ENV = "FLATGATHER_SGLANG"
LOG_ENV = "FLATGATHER_LOG_LEVEL"
TARGET = "sglang.srt.layers.logits_processor"
OFF = ("", "0", "false", "off", "no")
"""Values of the variable that mean off (case and spaces ignored); the
``.pth`` line tests the same ones."""
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_armed = False


def mode() -> str | None:
    """``"on"``, ``"force"`` or None (off), from the environment. ``force``
    is kept for compatibility and now means the same as ``on``."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in OFF:
        return None
    return "force" if value == "force" else "on"


def logger():
    """flatgather's logger, writing to stderr at ``FLATGATHER_LOG_LEVEL``.

    Activation happens during imports, before SGLang configures logging, so
    the logger has its own handler. An unknown level is reported and INFO is
    used: a typo must not stop a server from starting.
    """
    import logging

    log = logging.getLogger("flatgather")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[flatgather] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False
        wanted = os.environ.get(LOG_ENV, "INFO").strip().upper() or "INFO"
        if wanted not in LEVELS:
            log.setLevel(logging.INFO)
            log.warning(
                "%s=%s is not a log level (%s); using INFO",
                LOG_ENV,
                os.environ.get(LOG_ENV),
                ", ".join(LEVELS),
            )
        else:
            log.setLevel(wanted)
    return log


def _on_import(module) -> None:
    log = logger()
    import flatgather
    from flatgather import sglang as fs

    if mode() == "force":
        log.info("%s=force is no longer needed: every release is probed before it is patched", ENV)
    try:
        report = fs.install()
    except fs.UnsupportedRelease as exc:
        log.warning("%s", exc)
        return
    pending = f"; on import: {', '.join(report.pending)}" if report.pending else ""
    log.info(
        "flatgather %s active in pid %d: SGLang %s verified by %s (%.0f ms), patched %s%s",
        flatgather.__version__,
        os.getpid(),
        report.release,
        report.verified_by,
        report.probe_seconds * 1e3,
        ", ".join(report.patched),
        pending,
    )


def arm() -> None:
    """Install flatgather under SGLang once its logits processor is imported
    (now, if it already is). Does nothing when the switch is off, or the
    second time (Python may run a ``.pth`` file twice, through a ``lib64``
    link to ``lib``)."""
    global _armed
    if _armed or mode() is None:
        return
    _armed = True
    from flatgather import _import_hooks

    try:
        _import_hooks.when_imported(TARGET, _on_import)
    except Exception:
        # Never take the process down: SGLang runs unpatched.
        logger().exception("flatgather activation failed; SGLang runs unpatched")
