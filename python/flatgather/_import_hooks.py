"""Run a callback right after a named module has been imported.

A finder placed first on ``sys.meta_path`` asks the other finders for the
module's spec and wraps its loader, so that the callback runs on the fresh
module once its code has executed, before the importer gets it back. Nothing
is imported early, and a module that is already imported gets the callback at
once (so does one whose callbacks are running: a callback may register
another). A module that is in ``sys.modules`` but still running its own code
(an import cycle: it imported, directly or not, the module whose import
asked for the callback) is not whole yet: its callback waits until its code
has finished, and runs at the next import after that. Used by the
``FLATGATHER_SGLANG`` switch, and for the modules of SGLang
that cannot (or need not) be imported when flatgather is installed, such as
0.5.10's ``eagle_worker_v2``, which needs the GPU-only ``sgl_kernel``.

This module runs at interpreter start-up when the switch is on, so it
imports nothing that is not already loaded by then.
"""

import _thread
import sys

# Annotations only (never evaluated): typing costs more to import than all
# of this module.
Callback = "Callable[[types.ModuleType], None]"


class _Loader:
    def __init__(self, inner, finder: "_Finder") -> None:
        self._inner = inner
        self._finder = finder

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        # The real loader belongs on the module, for reloads and resources.
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        self._finder.fire(module)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def _initializing(module) -> bool:
    """Whether ``module``'s code is still running (importlib marks its spec
    while it executes)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


class _Finder:
    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callback]] = {}
        self._half_imported: set[str] = set()
        self._firing: set[str] = set()
        """Modules whose callbacks run now: their code has finished, though
        importlib still marks them as initializing."""
        self._lock = _thread.RLock()

    def find_spec(self, fullname, path, target=None):
        if self._half_imported:
            self._fire_finished()
        if fullname not in self._callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, self)
        return spec

    def add(self, name: str, callback: Callback) -> None:
        with self._lock:
            callbacks = self._callbacks.setdefault(name, [])
            if callback not in callbacks:
                callbacks.append(callback)

    def remove(self, name: str, callback: Callback) -> None:
        with self._lock:
            callbacks = self._callbacks.get(name, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks:
                self._callbacks.pop(name, None)

    def wait_for(self, name: str) -> None:
        """``name`` is half-imported: fire its callbacks once it is whole."""
        with self._lock:
            self._half_imported.add(name)

    def _fire_finished(self) -> None:
        with self._lock:
            finished = []
            for name in list(self._half_imported):
                module = sys.modules.get(name)
                if module is None:  # its import failed; a new one fires normally
                    self._half_imported.discard(name)
                elif not _initializing(module):
                    self._half_imported.discard(name)
                    finished.append(module)
        for module in finished:
            self.fire(module)

    def whole(self, module) -> bool:
        """Whether ``module``'s code has finished."""
        return not _initializing(module) or module.__name__ in self._firing

    def fire(self, module) -> None:
        with self._lock:
            callbacks = list(self._callbacks.get(module.__name__, ()))
            self._firing.add(module.__name__)
        try:
            self._call(module, callbacks)
        finally:
            with self._lock:
                self._firing.discard(module.__name__)

    def _call(self, module, callbacks) -> None:
        for callback in callbacks:
            try:
                callback(module)
            except Exception:
                # A failed patch must not fail the import it rides on.
                from flatgather._log import logger

                logger().exception("flatgather: post-import hook for %s failed", module.__name__)


_finder = _Finder()


def _ensure_installed() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``name`` is imported: now if it already
    is (exceptions then propagate), else right after its import, or, for a
    module whose code is still running, at the first import after it has
    finished. Registering the same callback twice calls it once."""
    module = sys.modules.get(name)
    if module is not None and _finder.whole(module):
        callback(module)
        return
    _ensure_installed()
    _finder.add(name, callback)
    if module is not None:
        _finder.wait_for(name)


def cancel(name: str, callback: Callback) -> None:
    """Forget a callback registered with :func:`when_imported`."""
    _finder.remove(name, callback)


def absent(name: str) -> bool:
    """Whether there is no module ``name`` to import, told from the packages
    already imported without importing anything."""
    import importlib.machinery

    if name in sys.modules:
        return False
    parts = name.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        package = sys.modules.get(".".join(parts[:depth]))
        if package is None:
            continue
        path = getattr(package, "__path__", None)
        for k in range(depth, len(parts)):
            if path is None:
                return True  # a module where a package would have to be
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: k + 1]), path)
            if spec is None:
                return True
            path = spec.submodule_search_locations
        return False
    return False
