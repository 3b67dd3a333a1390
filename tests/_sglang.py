"""Helpers to drive the real SGLang code of the release under test."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

import pytest
import torch
from conftest import RELEASE

if RELEASE is None:
    pytest.skip("no sglang on sys.path", allow_module_level=True)

# A stand-in for the GPU-only sgl_kernel, which 0.5.10's eagle_worker_v2
# imports (with submodules). Any attribute of any sgl_kernel module is a
# callable that refuses to run: importing works, calling a kernel does not.


class _StandInKernelModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise RuntimeError(f"{self.__name__}.{name} is a test stand-in")

        return unavailable


class _StandInKernelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "sgl_kernel" or fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInKernelModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install_sgl_kernel_stand_in() -> None:
    if not any(isinstance(f, _StandInKernelFinder) for f in sys.meta_path):
        sys.meta_path.append(_StandInKernelFinder())


from sglang.srt.layers import logits_processor as lp  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import (  # noqa: E402
    CaptureHiddenMode,
    ForwardMode,
)

LogitsProcessor = lp.LogitsProcessor
LogitsMetadata = lp.LogitsMetadata

# The release's own functions, taken before any test can patch them.
STOCK_PRUNED_STATES = vars(LogitsProcessor)["_get_pruned_states"]
STOCK_HIDDEN_TO_STORE = vars(LogitsProcessor)["_get_hidden_states_to_store"]

CAPTURE_MODES = {
    "NULL": CaptureHiddenMode.NULL,
    "LAST": CaptureHiddenMode.LAST,
    "FULL": CaptureHiddenMode.FULL,
}

PACKED_AUX = RELEASE == "0.5.23"
PRUNES_AUX = RELEASE != "0.5.10"  # 0.5.10 predates SGLang PR #21589


def metadata(extend, start, capture: str = "NULL", mode=ForwardMode.EXTEND, **extra):
    return LogitsMetadata(
        forward_mode=mode,
        capture_hidden_mode=CAPTURE_MODES[capture],
        extend_return_logprob=True,
        extend_seq_lens=torch.tensor(extend, dtype=torch.int32),
        extend_seq_lens_cpu=list(extend),
        extend_logprob_start_lens_cpu=list(start),
        extend_logprob_pruned_lens_cpu=[e - s for e, s in zip(extend, start, strict=True)],
        **extra,
    )


def pruned_states(hidden, before_norm, aux, md):
    """Whatever ``LogitsProcessor._get_pruned_states`` is right now."""
    return LogitsProcessor._get_pruned_states(None, hidden, before_norm, aux, md)


def stock_pruned_states(hidden, before_norm, aux, md):
    return STOCK_PRUNED_STATES(None, hidden, before_norm, aux, md)


def hidden_to_store(hidden, before_norm, aux, result, md):
    pruned, pruned_before, aux_pruned, sample, _, _ = result
    return STOCK_HIDDEN_TO_STORE(
        None, hidden, before_norm, aux, pruned, pruned_before, aux_pruned, sample, md
    )


def fixed_aux_oracle(aux, md_factory):
    """What a release with PR #21589 returns for list aux layers, computed by
    the release's own code: each layer pruned as if it were hidden_states."""
    return [stock_pruned_states(layer, None, None, md_factory())[0] for layer in aux]


def assert_same(actual, expected, path="result"):
    """Same type, and for tensors same dtype, shape, device and bytes."""
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert actual.device == expected.device, f"{path}: device"
        assert actual.is_contiguous() == expected.is_contiguous(), f"{path}: contiguity"
        a = actual.contiguous().view(torch.uint8)
        e = expected.contiguous().view(torch.uint8)
        assert torch.equal(a, e), f"{path}: values differ"
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys(), f"{path}: keys differ"
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
