"""The V2 draft worker's prefill (placeholder; see issue 11)."""

from __future__ import annotations

from dataclasses import dataclass, field

from flatgather.sglang.patching import Patch

MODULE = "sglang.srt.speculative.eagle_worker_v2"


@dataclass(frozen=True)
class DraftPatch:
    patches: list[Patch] = field(default_factory=list)
    applied: tuple[str, ...] = ()
    backports: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @classmethod
    def refused(cls, note: str) -> DraftPatch:
        return cls(notes=(note,))


def prepare(module) -> DraftPatch:
    return DraftPatch()
