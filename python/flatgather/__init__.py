"""flatgather: one-pass gather plans for the prefill step of SGLang's
speculative-decoding path.

SGLang's ``LogitsProcessor._get_pruned_states`` keeps, for every request of a
prefill batch that asks for input logprobs, the rows from its logprob start to
its end, and builds the sample / input-logprob / token-to-sequence indices in
Python loops; the V2 draft worker rotates each request's ``input_ids`` in
another. flatgather computes those index sets in one pass in Rust and gathers
every tensor with one ``index_select``.

>>> import flatgather
>>> plan = flatgather.prune_plan([4, 5, 6], [0, 5, 3])
>>> plan.gather.tolist()
[0, 1, 2, 3, 8, 12, 13, 14]
>>> plan.sample.tolist(), plan.num_pruned
([3, 4, 7], 8)

``flatgather.sglang.install()`` puts the same plans under SGLang itself.

Importing this package is free: torch and the extension load on first use of
an attribute that needs them.
"""

from flatgather._errors import PlanError

__version__ = "0.1.0"

_LAZY = {
    "MAX_PLAN_BYTES": "flatgather._core",
    "MAX_TOKENS": "flatgather._core",
    "PrunePlan": "flatgather._plan",
    "RotationPlan": "flatgather._plan",
    "prune_plan": "flatgather._plan",
    "rotation_plan": "flatgather._plan",
}

__all__ = ["PlanError", "__version__", *sorted(_LAZY)]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flatgather' has no attribute {name!r}")
    import importlib  # here, not at the top: the package must import for free

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
