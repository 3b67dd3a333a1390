"""A stand-in for the GPU-only ``sgl_kernel``, for the tests and the bench.

:func:`install_sgl_kernel_stand_in` makes ``sgl_kernel`` importable
(``eagle_worker_v2`` of 0.5.10 to 0.5.12 imports it) with functions that
refuse to run. Never used by ``install()``: only where a test or the bench
imports the draft worker on a machine without it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__all__ = ["install_sgl_kernel_stand_in"]


class _StandInKernel(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise RuntimeError(f"{self.__name__}.{name} is a stand-in: no sgl_kernel here")

        return unavailable


class _StandInKernelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "sgl_kernel" or fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInKernel(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install_sgl_kernel_stand_in() -> None:
    """Make ``sgl_kernel`` (and its submodules) importable, after every real
    finder: a real ``sgl_kernel`` is still found first. Idempotent."""
    if not any(isinstance(f, _StandInKernelFinder) for f in sys.meta_path):
        sys.meta_path.append(_StandInKernelFinder())
