"""``LogitsProcessor._get_pruned_states``, its logprob branch replaced by
one plan and one gather per tensor
(:mod:`~flatgather.sglang.patches.pruned_states.runtime`), and the lazy aux
pruning that rides on it
(:mod:`~flatgather.sglang.patches.pruned_states.runtime`).

Everything else builds on this patch, so it is the one whose refusal refuses
the release (``install()`` raises, nothing is patched). Its steps:

1. **prove**: the probe derives the release's contract from its own answers
   on small CPU batches (:func:`~flatgather.sglang.patches.pruned_states.probe.derive`);
2. **build**: the replacement under that contract, with lazy aux pruning in
   FULL capture too, with lazy aux pruning, and without;
3. **check**: the probe runs flatgather's replacement against the release on
   every batch and ``ForwardMode``, then the lazy stores against the
   release's store (:func:`~flatgather.sglang.patches.pruned_states.probe.verify`,
   run once); lazy aux pruning also needs a store of known code
   (:data:`flatgather.sglang.shapes.STORE`), or it stays off with a note;
4. **vouch**: ``_get_pruned_states`` is code the test matrix runs
   (:data:`flatgather.sglang.shapes.PRUNED_STATES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from flatgather.sglang import releases, shapes
from flatgather.sglang.patches.pruned_states import probe
from flatgather.sglang.patches.pruned_states.runtime import (
    Contract,
    LazyAuxPruned,
    LazyGate,
    lazy_scope,
    make_forward,
    make_hidden_states_to_store,
    make_pruned_states,
    uses_release_code,
)
from flatgather.sglang.patching import (
    Candidate,
    Known,
    Option,
    Patch,
    Refused,
    Service,
    Swap,
    Target,
    known_code,
)

__all__ = [
    "MODULE",
    "PATCH",
    "Contract",
    "LazyAuxPruned",
    "LazyGate",
    "PrunedStates",
    "Pruning",
    "lazy_scope",
    "make_pruned_states",
    "uses_release_code",
]

MODULE = "sglang.srt.layers.logits_processor"
METHOD = "_get_pruned_states"
STORE = "_get_hidden_states_to_store"


@dataclass
class Probed:
    """The proof: the contract the probe derived, and (once checked) its
    verdict or the first difference it found."""

    derived: probe.Derived
    verdict: probe.Verdict | None = None
    problem: str | None = None
    store_unknown: str | None = None

    def checked(self, owner: type) -> None:
        if self.verdict is None and self.problem is None:
            try:
                self.verdict = probe.verify(self.derived)
            except probe.ProbeFailed as exc:
                self.problem = str(exc)
                return
            if self.verdict.lazy_aux:
                try:
                    shapes.known(shapes.STORE, owner, STORE)
                except shapes.UnknownShape as exc:
                    self.store_unknown = str(exc)


@dataclass(frozen=True, eq=False)
class Pruning(Service):
    """What stays in service with the pruning: the probe's verdict for the
    install report, and lazy aux pruning's gate, which ``uninstall()``
    closes and drains."""

    probed: Probed
    gate: LazyGate | None
    """Lazy aux pruning's gate, where it is on."""
    lazy_full: bool

    def report(self):
        verdict = self.probed.verdict
        return {
            "contract": verdict.contract,
            "lazy_aux": self.gate is not None,
            "lazy_full": self.gate is not None and self.lazy_full,
            "probe_seconds": verdict.seconds,
        }

    def busy_here(self):
        if self.gate is not None and self.gate.current():
            return "inside LogitsProcessor.forward"
        return None

    def drain(self, timeout):
        return self.gate is None or self.gate.close(timeout)


@dataclass(frozen=True)
class Mode:
    """A candidate's lazy aux pruning, for :meth:`PrunedStates.check`."""

    lazy: bool
    full: bool


class PrunedStates(Patch[Probed, Mode]):
    name = "pruned-states"
    modules = (MODULE,)
    required = True
    options = MappingProxyType(
        {
            "lazy_aux": Option(
                "inside forward, gather the EAGLE3 aux layers only at the rows stored "
                "(where the probe verified it)",
                switch=False,
            )
        }
    )
    known = (
        Known(shapes.PRUNED_STATES, (MODULE,), METHOD, "LogitsProcessor"),
        Known(shapes.STORE, (MODULE,), STORE, "LogitsProcessor"),
    )
    lazy_aux = True

    def locate(self, module):
        owner = getattr(module, "LogitsProcessor", None)
        if not isinstance(owner, type):
            raise Refused(f"{module.__name__} has no class LogitsProcessor")
        return [Target(owner, METHOD, module)]

    def prove(self, target):
        try:
            return Probed(probe.derive(target.module))
        except probe.ProbeFailed as exc:
            raise Refused(str(exc)) from None

    def build(self, target, probed):
        """Lazy aux pruning under FULL capture too, then without FULL, then
        no lazy aux pruning."""
        raw = vars(target.owner)
        contract = probed.derived.contract
        if self.lazy_aux:
            gate = LazyGate()
            store = make_hidden_states_to_store(raw[STORE])
            forward = make_forward(raw["forward"], gate)
            for full, gives_up in (
                (True, "FULL capture gathers every kept aux row"),
                (False, "lazy aux pruning left off"),
            ):
                pruned = make_pruned_states(
                    raw[METHOD], contract, gate, lazy_full=full, store=store
                )
                yield Candidate(
                    swaps=(
                        Swap(target.owner, METHOD, pruned),
                        Swap(target.owner, STORE, store),
                        Swap(target.owner, "forward", forward),
                    ),
                    applied=(self.name, "lazy-aux"),
                    backports=contract.backports,
                    gives_up=gives_up,
                    detail=Mode(lazy=True, full=full),
                    service=Pruning(probed, gate, full),
                )
        yield Candidate(
            swaps=(Swap(target.owner, METHOD, make_pruned_states(raw[METHOD], contract)),),
            applied=(self.name,),
            backports=contract.backports,
            detail=Mode(lazy=False, full=False),
            service=Pruning(probed, None, False),
        )

    def check(self, target, probed, candidate):
        probed.checked(target.owner)
        if probed.problem:
            return probed.problem
        mode = candidate.detail
        verdict = probed.verdict
        if mode.lazy and not verdict.lazy_aux:
            return verdict.lazy_aux_note
        if mode.lazy and probed.store_unknown:
            return probed.store_unknown
        if mode.full and not verdict.lazy_full:
            return verdict.lazy_full_note
        return None

    def vouch(self, target, probed):
        """Known code; and how the probe ran, where that is worth saying."""
        shape = known_code(shapes.PRUNED_STATES, target.owner, METHOD)
        seen_in = ", ".join(shapes.KNOWN[shapes.PRUNED_STATES][shape])
        notes = [f"{METHOD} is code the test matrix runs ({seen_in})"]
        verdict = probed.verdict
        if verdict.metadata_note:
            notes.append(verdict.metadata_note)
        if verdict.pin_neutralised:
            notes.append(
                "this host has no CUDA and the release's _get_pruned_states pins memory "
                "unconditionally: the probe ran it with pin_memory=False (pinning changes no value)"
            )
        notes += _table_notes(verdict.contract)
        return tuple(notes)


def _table_notes(contract: Contract) -> list[str]:
    """Where the release table's row for the running release says other than
    the probe found: the probe verified what runs; the table describes the
    published wheel."""
    release = releases.sglang_release()
    row = releases.by_version(release)
    if row is None:
        return []
    expected = Contract(
        row.trailing_token_to_seq, row.packed_aux, row.writes_cpu_indices, row.prunes_aux
    )
    if expected == contract:
        return []
    return [
        f"the running SGLang {release} differs from the published wheel "
        f"(table: {expected.describe()}); the probe's contract is used"
    ]


PATCH = PrunedStates()
