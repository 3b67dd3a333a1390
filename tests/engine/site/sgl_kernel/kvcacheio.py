"""``sgl_kernel.kvcacheio``: SGLang 0.5.10 to 0.5.12 import these host-cache
(HiCache) transfer ops on every non-NPU/XPU/MPS host, CPU included, though
only a hierarchical cache calls them. They import here and fail loudly if
called; the engine tests never enable that cache. Any other name fails at
import."""

from __future__ import annotations

import sys

NAMES = (
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
)


def _never(name: str):
    def op(*args, **kwargs):
        raise RuntimeError(
            f"sgl_kernel.kvcacheio.{name} was called: the engine tests' stand-in has no "
            "host-cache transfer (enable no hierarchical cache in them)"
        )

    op.__name__ = name
    return op


for _name in NAMES:
    globals()[_name] = _never(_name)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    print(f"sgl_kernel stand-in: the engine asked for kvcacheio.{name!r}", file=sys.stderr)
    raise AttributeError(f"flatgather's sgl_kernel.kvcacheio stand-in has no {name!r}")
