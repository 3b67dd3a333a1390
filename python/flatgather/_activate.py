"""The ``FLATGATHER_SGLANG`` switch.

The wheel ships ``flatgather-sglang.pth``; Python runs its one line at the
start of every process, including those that ``multiprocessing`` spawns for
SGLang's schedulers. Without the variable the line only reads the
environment. With ``FLATGATHER_SGLANG=1`` it arms an import hook: the moment
``sglang.srt.layers.logits_processor`` is imported, :func:`flatgather.sglang.install`
runs. On an untested SGLang release that logs a warning and patches nothing
(the server still starts), unless the variable is ``force``.
"""

from __future__ import annotations

import logging
import os
import sys

ENV = "FLATGATHER_SGLANG"
TARGET = "sglang.srt.layers.logits_processor"

log = logging.getLogger("flatgather")


def _ensure_handler() -> None:
    # Activation happens during imports, before SGLang configures logging, so
    # flatgather's logger writes to stderr itself. FLATGATHER_LOG_LEVEL tunes it.
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[flatgather] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(os.environ.get("FLATGATHER_LOG_LEVEL", "INFO").upper())
        log.propagate = False


def mode() -> str | None:
    """``"on"``, ``"force"`` or None (off), from the environment."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "0", "false", "off", "no"):
        return None
    return "force" if value == "force" else "on"


def _on_import(module) -> None:
    import flatgather
    from flatgather import sglang as fs

    try:
        report = fs.install(force=mode() == "force")
    except fs.UnsupportedRelease as exc:
        log.warning("%s; nothing patched (set %s=force to patch anyway)", exc, ENV)
        return
    pending = f"; on import: {', '.join(report.pending)}" if report.pending else ""
    log.info(
        "flatgather %s active in pid %d: SGLang %s, patched %s%s",
        flatgather.__version__,
        os.getpid(),
        report.release,
        ", ".join(report.patched),
        pending,
    )


def arm() -> None:
    """Install flatgather under SGLang once its logits processor is imported
    (now, if it already is). Does nothing when the switch is off."""
    if mode() is None:
        return
    _ensure_handler()
    from flatgather import _import_hooks

    try:
        _import_hooks.when_imported(TARGET, _on_import)
    except Exception:
        # Never take the process down: SGLang runs unpatched.
        log.exception("flatgather activation failed; SGLang runs unpatched")
