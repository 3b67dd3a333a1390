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

ENV = "FLATGATHER_SGLANG"
TARGET = "sglang.srt.layers.logits_processor"
OFF = ("", "0", "false", "off", "no")
"""Values of the variable that mean off (case and spaces ignored); the
``.pth`` line tests the same ones."""
_armed = False


def mode() -> str | None:
    """``"on"``, ``"force"`` or None (off), from the environment. ``force``
    is kept for compatibility and now means the same as ``on``."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in OFF:
        return None
    return "force" if value == "force" else "on"


def _on_import(module) -> None:
    import flatgather
    from flatgather import sglang as fs
    from flatgather._log import logger

    log = logger()

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
        from flatgather._log import logger

        logger().exception("flatgather activation failed; SGLang runs unpatched")
