"""What each supported SGLang release's ``_get_pruned_states`` returns.

flatgather is bit-exact with each release's own contract; these are the
points on which the releases differ, read off their source.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Contract:
    release: str
    packed_aux: bool
    """EAGLE3 aux hidden states may come as one packed tensor (else a list)."""
    trailing_token_to_seq: bool
    """``token_to_seq_idx`` ends with the last request's index once more."""
    writes_cpu_indices: bool
    """The logprob branch stores ``sample_indices_cpu`` and
    ``input_logprob_indices_cpu`` (Python lists) on the metadata."""
    backports: tuple[str, ...] = ()
    """Fixes of SGLang PR #21589 that the release lacks and install() applies:
    ``aux-logprob-prune`` (the logprob branch prunes the aux layers instead
    of dropping them) and ``draft-prefill-no-logprob`` (the V2 draft worker's
    ``_draft_extend_for_prefill`` runs with ``return_logprob`` False)."""


CONTRACTS: dict[str, Contract] = {
    c.release: c
    for c in (
        Contract("0.5.23", packed_aux=True, trailing_token_to_seq=False, writes_cpu_indices=True),
        Contract("0.5.15", packed_aux=False, trailing_token_to_seq=True, writes_cpu_indices=False),
        Contract(
            "0.5.10",
            packed_aux=False,
            trailing_token_to_seq=True,
            writes_cpu_indices=False,
            backports=("aux-logprob-prune", "draft-prefill-no-logprob"),
        ),
    )
}

SUPPORTED_RELEASES: tuple[str, ...] = tuple(CONTRACTS)


class UnsupportedRelease(RuntimeError):
    """The installed SGLang is not one flatgather was tested against."""


def _version_key(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def sglang_release() -> str | None:
    """The version of the ``sglang`` that ``import sglang`` finds, or None.

    Read from the distribution metadata next to that package, so that a
    release put first on ``sys.path`` is reported rather than another one
    installed elsewhere. Nothing of SGLang is imported.
    """
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        site = str(Path(location).parent)
        for dist in importlib.metadata.distributions(name="sglang", path=[site]):
            return dist.version
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def contract_for(release: str | None, force: bool = False) -> Contract:
    """The contract of ``release``. An untested release is refused unless
    ``force``, which then uses the newest tested release not newer than it
    (or the oldest tested one)."""
    if release in CONTRACTS:
        return CONTRACTS[release]
    tested = ", ".join(SUPPORTED_RELEASES)
    if release is None:
        raise UnsupportedRelease(f"SGLang is not installed (flatgather supports {tested})")
    if not force:
        raise UnsupportedRelease(
            f"SGLang {release} is not a release flatgather was tested against "
            f"(tested: {tested}); install(force=True) patches it anyway with the "
            "contract of the nearest older tested release"
        )
    older = [c for c in CONTRACTS.values() if _version_key(c.release) <= _version_key(release)]
    base = max(older, key=lambda c: _version_key(c.release)) if older else CONTRACTS["0.5.10"]
    return replace(base, release=release)
