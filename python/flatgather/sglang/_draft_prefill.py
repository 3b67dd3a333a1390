"""Backport for 0.5.10: the V2 draft worker's prefill forward without logprobs.

In 0.5.10 ``EagleDraftWorker._draft_extend_for_prefill`` builds its
``ForwardBatch`` from the target batch and keeps ``return_logprob`` from it,
so a request with logprobs sends the draft model down the logprob branch of
``_get_pruned_states``. Later releases set ``forward_batch.return_logprob =
False`` right after ``ForwardBatch.init_new``. The backport does exactly that:
inside ``_draft_extend_for_prefill`` (and only there, per thread and task),
the module's ``ForwardBatch.init_new`` hands back a batch with
``return_logprob`` False.
"""

from __future__ import annotations

import contextvars
import functools
from types import ModuleType

from flatgather.sglang._patching import Patch

MODULE = "sglang.srt.speculative.eagle_worker_v2"

_in_draft_prefill: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "flatgather_in_draft_prefill", default=False
)


class ForwardBatchInDraftPrefill:
    """Stands in for ``ForwardBatch`` in the worker module's globals: every
    attribute is the real class's, and ``init_new`` turns ``return_logprob``
    off while a ``_draft_extend_for_prefill`` call is running."""

    def __init__(self, real: type) -> None:
        self.__wrapped__ = real

    def init_new(self, *args, **kwargs):
        forward_batch = self.__wrapped__.init_new(*args, **kwargs)
        if _in_draft_prefill.get():
            forward_batch.return_logprob = False
        return forward_batch

    def __getattr__(self, name: str):
        return getattr(self.__wrapped__, name)

    def __repr__(self) -> str:
        return f"<flatgather stand-in for {self.__wrapped__!r}>"


def patches(module: ModuleType) -> list[Patch]:
    worker = getattr(module, "EagleDraftWorker", None)
    original = vars(worker).get("_draft_extend_for_prefill") if worker else None
    forward_batch = getattr(module, "ForwardBatch", None)
    if original is None or not isinstance(forward_batch, type):
        raise RuntimeError(
            f"{MODULE} has no EagleDraftWorker._draft_extend_for_prefill or ForwardBatch: "
            "not the 0.5.10 layout this backport is for"
        )

    @functools.wraps(original)
    def _draft_extend_for_prefill(self, *args, **kwargs):
        token = _in_draft_prefill.set(True)
        try:
            return original(self, *args, **kwargs)
        finally:
            _in_draft_prefill.reset(token)

    return [
        Patch(module, "ForwardBatch", ForwardBatchInDraftPrefill(forward_batch)),
        Patch(worker, "_draft_extend_for_prefill", _draft_extend_for_prefill),
    ]
