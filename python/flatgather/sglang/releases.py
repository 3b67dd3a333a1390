"""The SGLang releases flatgather is tested against: one table for CI, the
tests, the README and ``flatgather doctor``.

Each row says what the release's code does on the points where releases
differ, as read off its wheel. ``install()`` never trusts this table: it asks
the running release (:mod:`flatgather.sglang.patches.pruned_states.probe`) and patches only what it
verified. The table is what the CI matrix checks the probe against, what the
README shows, and how ``install()`` tells "verified by the probe and by the
test matrix" from "verified by the probe alone".

Adding a release is one line here. This file uses the standard library only:
``.ci/setup`` and ``.ci/test`` run it as a script (``python releases.py
--help``) before flatgather is built.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FULL_SUITE", "RELEASES", "Release", "by_version", "sglang_release"]

# Loop shapes of EagleDraftWorker._draft_extend_for_prefill's rotation.
IN_PLACE = "in-place"
"""Rotates ``batch.input_ids`` in place."""
NEW_TENSOR = "new-tensor"
"""Writes a new tensor and assigns it to ``batch.input_ids``."""
NEW_TENSOR_MM = "new-tensor+mm"
"""As ``new-tensor``, and rotates ``mm_input_embeds`` alongside."""


@dataclass(frozen=True)
class Release:
    version: str
    trailing_token_to_seq: bool
    """``token_to_seq_idx`` ends with the last request's index once more."""
    packed_aux: bool
    """The logprob branch handles EAGLE3 aux layers packed in one tensor."""
    writes_cpu_indices: bool
    """The logprob branch writes ``sample_indices_cpu`` and
    ``input_logprob_indices_cpu`` on the metadata."""
    prunes_aux: bool
    """PR #21589's first fix: the logprob branch prunes list aux layers."""
    draft_no_logprob: bool
    """PR #21589's second fix: ``_draft_extend_for_prefill`` sets
    ``forward_batch.return_logprob = False``."""
    rotation: str
    """The shape of ``_draft_extend_for_prefill``'s per-request loop."""
    token_ids_skip_empty: bool = False
    """The token-id input-logprob functions append no entry for a request
    that gets no values, and none for an empty chunk (up to 0.5.15)."""
    skip_advances_logprob_pt: bool = False
    """SGLang issue #36938 fixed: ``process_batch_result_prefill`` advances
    the input-logprob cursor over the requests it skips (no release yet)."""
    pins: tuple[str, ...] = ()
    """Packages installed next to the release (``--no-deps``) so that it
    imports on a CPU machine with the shared test environment."""
    full_suite: bool = False
    """CI runs the whole test suite against it; every release gets the
    matrix tests (``-m matrix``)."""
    engine: tuple[str, ...] = ()
    """The scenarios of ``tests/test_engine.py`` run on this release:
    ``plain`` (no speculative decoding), ``eagle3-topk1``, ``eagle3-topk2``,
    ``http`` (``launch_server``), ``retract`` (SGLang #36938 in the engine)."""
    engine_note: str = ""
    """Why the other scenarios do not run, where some do not."""
    engine_mixed_ids: bool = True
    """The release's own scheduler serves a batch that mixes requests with
    token ids and without (up to 0.5.20 it fails on ``list.tolist()``: a row
    without ids is a list there)."""
    unchecked_ops: tuple[tuple[str, str], ...] = ()
    """``(op, why)`` for each torch op of the engine tests' ``sgl_kernel``
    stand-in that ``tests/engine/check_kernels.py`` cannot check against a
    Triton kernel of this release; any other op without one fails there."""

    @property
    def backports(self) -> tuple[str, ...]:
        """The SGLang fixes that ``install()`` applies: PR #21589's two and
        issue #36938's."""
        return tuple(
            name
            for name, present in (
                ("aux-logprob-prune", self.prunes_aux),
                ("draft-prefill-no-logprob", self.draft_no_logprob),
                ("prefill-skip-logprob-pt", self.skip_advances_logprob_pt),
            )
            if not present
        )


ENGINE_ALL = ("plain", "eagle3-topk1", "eagle3-topk2", "http", "retract")
ENGINE_CI = tuple(s for s in ENGINE_ALL if s != "eagle3-topk2")
TREE_ON_DEMAND = (
    "eagle3-topk2 (a draft tree of two branches; three minutes on 2 cores) on demand, "
    "FLATGATHER_ENGINE_SCENARIOS=eagle3-topk2: every patch that answers in eagle3-topk1 "
    "answers there too"
)
SPEC_UNTRIED = (
    "the speculative, HTTP and retraction scenarios run on 0.5.23 (minutes each on 2 cores)"
)
NO_KERNEL = (
    "the release has no Triton kernel of this job and its code never calls the op "
    "(its CPU engine calls the stand-in's ops from 0.5.16 on)"
)
PINS_ON_CPU = (
    "the release's own _get_pruned_states pins host memory unconditionally, so its CPU "
    "engine fails on every prefill with input logprobs: there is no stock answer to compare"
)


def _rows() -> tuple[Release, ...]:
    # Each release's own transformers pin where the shared one (5.19.0) does
    # not import it; those versions reject the shared tokenizers and hub.
    hub = ("tokenizers==0.22.2", "huggingface-hub==1.33.0")
    tf_5_6 = ("transformers==5.6.0", *hub)
    tf_5_8 = ("transformers==5.8.1", *hub)
    tf_5_12 = ("transformers==5.12.1", *hub)
    # Each release's own xgrammar: the scheduler imports it for its default
    # grammar backend (0.5.16-0.5.20 at import already), so without it a
    # server does not start; the engine's detokenizer imports it from 0.5.23.
    xg_0_1 = ("xgrammar==0.1.32",)
    xg_0_2_0 = ("xgrammar==0.2.0",)
    xg_0_2_1 = ("xgrammar==0.2.1",)
    xg_0_2_7 = ("xgrammar==0.2.7",)
    old = dict(
        trailing_token_to_seq=True,
        packed_aux=False,
        writes_cpu_indices=False,
        token_ids_skip_empty=True,
    )
    fixed = dict(prunes_aux=True, draft_no_logprob=True)
    no_trailing = dict(trailing_token_to_seq=False, writes_cpu_indices=False)
    packed = dict(trailing_token_to_seq=False, packed_aux=True, writes_cpu_indices=False)
    latest = dict(trailing_token_to_seq=False, packed_aux=True, writes_cpu_indices=True)
    unfixed = dict(prunes_aux=False, draft_no_logprob=False)
    # The CPU engine (tests/test_engine.py) of each release.
    plain = dict(engine=("plain",), engine_note=SPEC_UNTRIED)
    plain_old = dict(plain, engine_mixed_ids=False)
    pinned = dict(engine=(), engine_note=PINS_ON_CPU)
    # The engine tests' sgl_kernel ops whose Triton kernels came later
    # (tests/engine/check_kernels.py).
    up_to_0_5_12 = tuple(
        (op, NO_KERNEL)
        for op in ("assign_draft_cache_locs_contiguous_cpu", "fill_accept_out_cache_loc_cpu")
    )
    up_to_0_5_11 = (*up_to_0_5_12, ("fill_bonus_tokens_cpu", NO_KERNEL))
    return (
        Release(
            "0.5.10",
            **old,
            **unfixed,
            rotation=IN_PLACE,
            pins=xg_0_1,
            full_suite=True,
            **plain_old,
            unchecked_ops=up_to_0_5_11,
        ),
        Release(
            "0.5.10.post1",
            **old,
            **unfixed,
            rotation=IN_PLACE,
            pins=xg_0_1,
            **plain_old,
            unchecked_ops=up_to_0_5_11,
        ),
        Release(
            "0.5.11",
            **old,
            **fixed,
            rotation=IN_PLACE,
            pins=(*tf_5_6, *xg_0_1),
            **plain_old,
            unchecked_ops=up_to_0_5_11,
        ),
        Release(
            "0.5.12",
            **old,
            **fixed,
            rotation=IN_PLACE,
            pins=(*tf_5_6, *xg_0_2_0),
            **pinned,
            unchecked_ops=up_to_0_5_12,
        ),
        Release(
            "0.5.12.post1",
            **old,
            **fixed,
            rotation=IN_PLACE,
            pins=(*tf_5_6, *xg_0_2_0),
            **pinned,
            unchecked_ops=up_to_0_5_12,
        ),
        Release(
            "0.5.13", **old, **fixed, rotation=IN_PLACE, pins=(*tf_5_8, *xg_0_2_1), **plain_old
        ),
        Release(
            "0.5.13.post1",
            **old,
            **fixed,
            rotation=IN_PLACE,
            pins=(*tf_5_8, *xg_0_2_1),
            **plain_old,
        ),
        Release(
            "0.5.14", **old, **fixed, rotation=IN_PLACE, pins=(*tf_5_8, *xg_0_2_1), **plain_old
        ),
        Release(
            "0.5.15",
            **old,
            **fixed,
            rotation=IN_PLACE,
            pins=(*tf_5_12, *xg_0_2_1),
            full_suite=True,
            **plain_old,
        ),
        Release(
            "0.5.15.post1",
            **old,
            **fixed,
            rotation=IN_PLACE,
            pins=(*tf_5_12, *xg_0_2_1),
            **plain_old,
        ),
        Release(
            "0.5.16",
            **no_trailing,
            packed_aux=False,
            **fixed,
            rotation=NEW_TENSOR,
            pins=(*tf_5_12, *xg_0_2_1),
            **plain_old,
        ),
        Release(
            "0.5.17",
            **packed,
            **fixed,
            rotation=NEW_TENSOR,
            pins=(*tf_5_12, *xg_0_2_1),
            **plain_old,
        ),
        Release(
            "0.5.18",
            **packed,
            **fixed,
            rotation=NEW_TENSOR,
            pins=(*tf_5_12, *xg_0_2_1),
            **plain_old,
        ),
        Release(
            "0.5.19",
            **packed,
            **fixed,
            rotation=NEW_TENSOR,
            pins=(*tf_5_12, *xg_0_2_1),
            **plain_old,
        ),
        Release("0.5.20", **packed, **fixed, rotation=NEW_TENSOR_MM, pins=xg_0_2_1, **plain_old),
        Release("0.5.21", **latest, **fixed, rotation=NEW_TENSOR_MM, pins=xg_0_2_7, **plain),
        Release("0.5.22", **latest, **fixed, rotation=NEW_TENSOR_MM, pins=xg_0_2_7, **plain),
        Release(
            "0.5.23",
            **latest,
            **fixed,
            rotation=NEW_TENSOR_MM,
            full_suite=True,
            pins=xg_0_2_7,
            engine=ENGINE_CI,
            engine_note=TREE_ON_DEMAND,
        ),
    )


RELEASES: tuple[Release, ...] = _rows()
FULL_SUITE: tuple[str, ...] = tuple(r.version for r in RELEASES if r.full_suite)


def by_version(version: str | None) -> Release | None:
    """The table's row for ``version``, or None."""
    return next((r for r in RELEASES if r.version == version), None)


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


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def markdown() -> str:
    """The README's support table."""
    lines = [
        "| SGLang | trailing `token_to_seq_idx` | packed aux | writes `*_indices_cpu` "
        "| draft rotation loop | empty token-id entries | backports applied | CI "
        "| engine tests |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in RELEASES:
        backports = ", ".join(f"`{b}`" for b in r.backports) or "none"
        ci = "full suite + matrix" if r.full_suite else "matrix"
        lines.append(
            f"| {r.version} | {_yes(r.trailing_token_to_seq)} | {_yes(r.packed_aux)} "
            f"| {_yes(r.writes_cpu_indices)} | {r.rotation} "
            f"| {'skipped' if r.token_ids_skip_empty else 'kept'} | {backports} | {ci} "
            f"| {', '.join(r.engine) or 'none'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="releases.py", description="The SGLang releases flatgather is tested against."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    versions = sub.add_parser("versions", help="one version a line")
    versions.add_argument(
        "--full-suite", action="store_true", help="only those with the full suite"
    )
    pins = sub.add_parser("pins", help="the extra packages of one release, space-separated")
    pins.add_argument("version")
    sub.add_parser("markdown", help="the README's support table")
    args = parser.parse_args(argv)
    if args.command == "versions":
        rows = [r for r in RELEASES if r.full_suite or not args.full_suite]
        print("\n".join(r.version for r in rows))
    elif args.command == "pins":
        release = by_version(args.version)
        if release is None:
            print(f"unknown release {args.version}", file=sys.stderr)
            return 2
        print(" ".join(release.pins))
    else:
        sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
