"""What lets a release's own code run on a CPU-only host, for the probe, the
tests and the bench.

* :class:`Unpinned` turns ``pin_memory=True`` off. 0.5.12 pins its index
  tensors whatever the host, so its own ``_get_pruned_states`` cannot run
  without CUDA; pinning changes no value.
* :func:`install_sgl_kernel_stand_in` makes the GPU-only ``sgl_kernel``
  importable (``eagle_worker_v2`` of 0.5.10 to 0.5.12 imports it) with
  functions that refuse to run. Never used by ``install()``: only where a
  test or the bench imports the draft worker on a machine without it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from contextlib import AbstractContextManager, nullcontext

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["Unpinned", "install_sgl_kernel_stand_in", "unpinned_without_cuda"]


class Unpinned(TorchFunctionMode):
    """Every torch call made inside it with ``pin_memory=True`` runs with
    ``pin_memory=False``; ``hits`` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}
            self.hits += 1
        return func(*args, **kwargs)


def unpinned_without_cuda() -> AbstractContextManager:
    """:class:`Unpinned` on a host without CUDA, nothing where pinning works."""
    return nullcontext() if torch.cuda.is_available() else Unpinned()


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
