"""The shape every patch has, and the attribute swaps that apply it.

Every place flatgather patches SGLang (:mod:`flatgather.sglang.patches`) is
a :class:`Patch`, which fills in the same steps:

1. :meth:`~Patch.locate`: where the running release keeps the code, in one
   of the modules the patch names (the release decides which has it);
2. :meth:`~Patch.prove`: that the code read is the code that runs, and what
   it does (its source proven, its shape matched, its contract derived);
3. :meth:`~Patch.build`: the replacements, best first;
4. :meth:`~Patch.check`: a replacement against the release's own code on
   small CPU cases: the same answer, or the first difference;
5. :meth:`~Patch.vouch`, for code replaced whole: that it is code the test
   matrix runs (:mod:`flatgather.sglang.shapes`);

then the installer applies the chosen replacement's :class:`Swap`\\ s with
the others (:func:`apply_all`) and reverts them in reverse order
(:func:`revert_all`). :meth:`Patch.prepare` walks the steps for one module
and never raises: a step that refuses (:class:`Refused`) or fails leaves
that code as shipped, with a note saying why.
"""

from __future__ import annotations

import copy
import types
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType, ModuleType
from typing import Any, ClassVar, Generic, TypeVar

__all__ = [
    "ANSWERS",
    "Candidate",
    "Known",
    "Option",
    "Patch",
    "Prepared",
    "Rebind",
    "Refused",
    "Service",
    "Swap",
    "Target",
    "Unneeded",
    "apply_all",
    "known_code",
    "release_function",
    "revert_all",
    "verified_once",
]

Proof = TypeVar("Proof")
"""What a patch's :meth:`~Patch.prove` hands its other steps."""
Detail = TypeVar("Detail")
"""What a patch's :meth:`~Patch.check` needs of one of its candidates."""

_MISSING = object()


@dataclass
class Swap:
    """``setattr(target, name, new)``, remembering the raw attribute it
    replaced (from ``vars(target)``, so a restored class attribute is the very
    object that was there, descriptor and all)."""

    target: Any
    name: str
    new: Any
    original: Any = field(default=_MISSING, repr=False)

    @property
    def where(self) -> str:
        owner = getattr(self.target, "__qualname__", None) or getattr(self.target, "__name__", "?")
        module = getattr(self.target, "__module__", None)
        prefix = f"{module}." if module and isinstance(self.target, type) else ""
        return f"{prefix}{owner}.{self.name}"

    def apply(self) -> None:
        self.original = vars(self.target).get(self.name, _MISSING)
        setattr(self.target, self.name, self.new)

    def revert(self) -> None:
        """Put the original back, unless someone replaced ``new`` since:
        theirs is left in place, with a warning."""
        if vars(self.target).get(self.name, _MISSING) is not self.new:
            warnings.warn(
                f"flatgather: {self.where} was replaced after flatgather patched it; "
                "that replacement is left in place, and the original is not restored",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        if self.original is _MISSING:
            delattr(self.target, self.name)
        else:
            setattr(self.target, self.name, self.original)


@dataclass
class Rebind(Swap):
    """A swap whose revert puts back the release's own function, whatever
    the name held when it was applied: a module that imported the name from
    one flatgather had patched holds flatgather's replacement, which must
    not outlive the installation."""

    release: Any = None

    def apply(self) -> None:
        super().apply()
        self.original = self.release


def apply_all(swaps: Sequence[Swap]) -> list[Swap]:
    """Apply every swap, or, if one fails, revert those already applied and
    re-raise: the targets are then exactly as they were."""
    applied: list[Swap] = []
    try:
        for swap in swaps:
            swap.apply()
            applied.append(swap)
    except BaseException:
        revert_all(applied)
        raise
    return applied


def revert_all(swaps: Sequence[Swap]) -> None:
    """Revert in reverse order of application."""
    for swap in reversed(swaps):
        swap.revert()


class Refused(Exception):
    """A step refuses: the message says why, and the code it would have
    replaced stays as shipped."""


class Unneeded(Exception):
    """A step finds that the release already does what the patch would (or
    has nothing of the kind here): nothing is replaced, and nothing noted."""


@dataclass(frozen=True)
class Target:
    """One attribute of the release a patch may replace: ``owner.name``."""

    owner: Any
    """The class or module that holds it."""
    name: str
    module: ModuleType | None = field(default=None, compare=False)
    """The module it was located in."""

    @property
    def where(self) -> str:
        owner = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", "?")
        return f"{owner}.{self.name}"


class Service:
    """What a patch leaves in service beside its swaps, where its code keeps
    state that later calls read (the pruning's lazy-aux gate, the output
    chain's registry of flat lists). The installer asks it these four things
    and nothing else; a patch without such state has none."""

    def report(self) -> Mapping[str, Any]:
        """What the install report says of it (:attr:`InstallReport.details`)."""
        return {}

    def busy_here(self) -> str | None:
        """Where the calling thread is inside the patch's code (``uninstall()``
        there would wait for itself), or None."""
        return None

    def drain(self, timeout: float | None) -> bool:
        """Let no new call use what is about to be reverted and wait for
        those in flight; False when ``timeout`` passed first."""
        return True

    def reverted(self) -> None:
        """After every swap is reverted: drop what the patch's code left for
        later calls."""


@dataclass(frozen=True)
class Candidate(Generic[Detail]):
    """One replacement a patch's :meth:`~Patch.build` offers."""

    swaps: tuple[Swap, ...] = ()
    """What it sets; none: the code stays as shipped, and :attr:`notes`
    say why (a candidate without swaps is taken without a check)."""
    applied: tuple[str, ...] = ()
    """What it applies, by the names of the install report."""
    backports: tuple[str, ...] = ()
    """The SGLang fixes among them."""
    notes: tuple[str, ...] = ()
    """What it leaves out, and why."""
    gives_up: str = ""
    """What the next candidate lacks that this one has, where that is worth
    a note ("the rotation loop left stock"): when this one fails its check
    and the next is taken, the note is this and the difference found."""
    detail: Detail | None = None
    """What the patch's own :meth:`~Patch.check` needs of it."""
    service: Service | None = None
    """What stays in service with it, if anything does (see :class:`Service`)."""


@dataclass(frozen=True)
class Prepared:
    """What :meth:`Patch.prepare` found it could do in one module."""

    swaps: list[Swap] = field(default_factory=list)
    applied: tuple[str, ...] = ()
    backports: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    """What was left stock, and why."""
    refusal: str = ""
    """Why the first refused target was refused (a required patch's
    refusal is the installer's error)."""
    services: tuple[Service, ...] = ()

    @classmethod
    def refused(cls, note: str) -> Prepared:
        return cls(notes=(note,), refusal=note)


def release_function(owner: Any, name: str) -> types.FunctionType | None:
    """The release's own plain function ``owner.<name>`` (a module's or a
    class's attribute), under flatgather's replacement where one is
    installed; None when it is not a plain function."""
    fn = vars(owner).get(name)
    while getattr(fn, "__flatgather__", None) is not None:
        fn = fn.__wrapped__
    return fn if isinstance(fn, types.FunctionType) else None


def known_code(where: str, owner: type | None, name: Any) -> str:
    """The vouching of code replaced whole: its fingerprint, found in
    :data:`flatgather.sglang.shapes.KNOWN` under ``where`` (see
    :func:`flatgather.sglang.shapes.known`), else :class:`Refused`."""
    from flatgather.sglang import shapes

    try:
        return shapes.known(where, owner, name)
    except shapes.UnknownShape as exc:
        raise Refused(str(exc)) from None


ANSWERS = ("whole", "flat-path", "returned")
"""The ways a replacement's answer is told from the release's
(:attr:`Patch.answers`)."""


@dataclass(frozen=True)
class Option:
    """An ``install()`` keyword a patch declares (every one defaults to True)."""

    doc: str
    """What it does, for ``install()``'s callers."""
    switch: bool = True
    """False turns the patch off; a non-switch is set on the patch as an
    attribute of the same name (the pruning's ``lazy_aux``)."""


@dataclass(frozen=True)
class Known:
    """Code a patch vouches for by its fingerprint (:func:`known_code`), and
    where the releases keep it, so that the fingerprint table's generator
    (:mod:`flatgather.testing.fingerprints`) finds it in each release."""

    key: str
    """Its entry in :data:`flatgather.sglang.known_shapes.KNOWN`."""
    modules: tuple[str, ...]
    """The modules that define it in some release (the first that does is read)."""
    name: str
    """The function, or the method of :attr:`owner`."""
    owner: str | None = None
    """The class that holds the method; None for a module-level function."""
    imported: bool = False
    """A module-level function read where it is imported, not defined (the
    chain's host copy, imported into ``managers/utils`` from 0.5.21)."""


class Patch(Generic[Proof, Detail]):
    """One place of SGLang that flatgather patches. A subclass declares what
    it is (the class attributes below) and fills in the steps;
    :meth:`prepare` walks them. The installer, the report and the tools know
    a patch by these declarations alone."""

    name: ClassVar[str]
    """The patch, as the install report names it."""
    modules: ClassVar[tuple[str, ...]]
    """Every module a release keeps this code in; each is prepared when (and
    if) it is imported."""
    what: ClassVar[str] = ""
    """What the patch replaces, in words, for its notes (default: its name)."""
    required: ClassVar[bool] = False
    """Refused, it makes the whole release refused (nothing is patched):
    the pruning, which everything else builds on."""
    options: ClassVar[Mapping[str, Option]] = MappingProxyType({})
    """The ``install()`` keywords it takes."""
    known: ClassVar[tuple[Known, ...]] = ()
    """The code it vouches for by fingerprint (code it replaces whole, or
    calls in place of the release's loop)."""
    unfixed: ClassVar[str] = ""
    """What a refused target leaves unfixed, where the patch is a fix (said
    in the note)."""
    answers: ClassVar[str] = "whole"
    """One of :data:`ANSWERS`: how a call of its replacement tells flatgather's answer from the
    release's (the engine tests' trace reads it to say that flatgather
    answered a call, ``tests/engine/site/sitecustomize.py``):

    * ``"whole"``: a function replaced whole that holds the release's own
      function in its closure and hands it the calls it does not take:
      flatgather answered when that function was not called;
    * ``"flat-path"``: a rebuilt method whose loop goes through flatgather's
      helper (the output chain's host copy and ``.tolist()``, the draft
      prefill's gather): flatgather answered when the helper took its flat
      path in the call;
    * ``"returned"``: a rebuilt method with no path of the release's left
      in it (the #36938 fix): flatgather answered when it returned."""
    serves: ClassVar[str] = "scheduler"
    """Where its replacements answer: ``"scheduler"`` (the scheduler's
    processes) or ``"front"`` (the process that answers the client: the
    tokenizer manager and the OpenAI layer). A process of the other kind may
    import the module and hold the replacement without ever calling it; the
    engine tests expect each replacement's answers where its patch says."""

    def configure(self, options: Mapping[str, bool], memo: dict | None = None) -> Patch | None:
        """This patch for one installation, as ``install(**options)`` asks
        for it, or None when an option turns it off. It is a copy of its
        own, whose :meth:`memo` is the installation's (``memo``, which every
        patch of that installation shares): what a patch remembers from one
        module to the next (verdicts of the release's code) lives as long as
        that installation, so each installation judges the code it finds and
        none leaves anything behind."""
        configured = copy.copy(self)
        vars(configured)["_memo"] = {} if memo is None else memo
        for key, option in self.options.items():
            value = options.get(key, True)
            if option.switch:
                if not value:
                    return None
            else:
                setattr(configured, key, value)
        return configured

    def memo(self) -> dict:
        """What this patch remembers from one module to the next: its
        installation's (:meth:`configure`), shared by that installation's
        patches (the output chain reuses the producers' verdicts), each key
        a patch's own; a patch no installation configured keeps one
        :meth:`prepare` long."""
        return vars(self).setdefault("_memo", {})

    # --- the steps -----------------------------------------------------------------------------

    def locate(self, module: ModuleType) -> Sequence[Target]:
        """What of ``module`` this patch would replace (nothing: no target).
        Raises :class:`Refused` when the module is not as the releases
        have it; the message is the whole note."""
        raise NotImplementedError

    def prove(self, target: Target) -> Proof:
        """That the code read is the code that runs, and what it does: the
        proof :meth:`build` and :meth:`check` work from. Raises
        :class:`Refused`, or :class:`Unneeded` where the release needs
        nothing."""
        raise NotImplementedError

    def build(self, target: Target, proof: Proof) -> Iterable[Candidate[Detail]]:
        """The replacements, best first (each a step down from the one
        before)."""
        raise NotImplementedError

    def check(self, target: Target, proof: Proof, candidate: Candidate[Detail]) -> str | None:
        """The candidate against the release's own code on the patch's
        cases: None, or the first difference."""
        raise NotImplementedError

    def vouch(self, target: Target, proof: Proof) -> tuple[str, ...]:
        """For code replaced whole, after its check: that it is code the
        test matrix runs (:func:`known_code`, for code of :attr:`known`),
        else :class:`Refused`; returns notes on what the proof rests on. A
        rewrite keeps the release's own lines, and needs none."""
        return ()

    # --- the walk ------------------------------------------------------------------------------

    def prepare(self, module: ModuleType) -> Prepared:
        """The steps for ``module``; never raises. Whatever cannot be done is
        a note, and that code stays as shipped (``KeyboardInterrupt`` and
        other ``BaseException``\\ s go through). A patch that no
        installation configured remembers nothing past the call."""
        configured = "_memo" in vars(self)
        try:
            return self._prepare(module)
        except Refused as exc:
            return Prepared.refused(str(exc))
        except Exception as exc:
            what = self.what or self.name
            return Prepared.refused(
                f"{module.__name__}: {what} left stock: {type(exc).__name__}: {exc}"
            )
        finally:
            if not configured:
                vars(self).pop("_memo", None)

    def _prepare(self, module: ModuleType) -> Prepared:
        swaps: list[Swap] = []
        applied: list[str] = []
        backports: list[str] = []
        notes: list[str] = []
        refusal, services = "", []
        for target in self.locate(module):
            try:
                chosen = self.choose(target)
            except Unneeded:
                continue
            except Refused as exc:
                why = str(exc)
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
            else:
                swaps += chosen.swaps
                applied += [a for a in chosen.applied if a not in applied]
                backports += [b for b in chosen.backports if b not in backports]
                notes += chosen.notes
                if chosen.service is not None and chosen.service not in services:
                    services.append(chosen.service)
                continue
            unfixed = f" ({self.unfixed})" if self.unfixed else ""
            notes.append(f"{target.where} left stock{unfixed}: {why}")
            refusal = refusal or why
        return Prepared(
            swaps, tuple(applied), tuple(backports), tuple(notes), refusal, tuple(services)
        )

    def choose(self, target: Target) -> Candidate[Detail]:
        """The steps for one target: :meth:`prove`, :meth:`pick`, then
        :meth:`vouch` for a candidate that replaces anything."""
        proof = self.prove(target)
        candidate = self.pick(target, proof)
        if candidate.swaps:
            candidate = replace(candidate, notes=(*candidate.notes, *self.vouch(target, proof)))
        return candidate

    def pick(self, target: Target, proof: Proof) -> Candidate[Detail]:
        """The first candidate that passes its check, its notes saying what
        it gives up against the one before. Raises :class:`Refused` with the
        best candidate's difference when none does, :class:`Unneeded` when
        there is none."""
        best = failed = None
        for candidate in self.build(target, proof):
            problem = self.check(target, proof, candidate) if candidate.swaps else None
            if problem is None:
                if failed is not None and failed[0].gives_up:
                    given_up = f"{target.where}: {failed[0].gives_up}: {failed[1]}"
                    candidate = replace(candidate, notes=(given_up, *candidate.notes))
                return candidate
            failed = (candidate, problem)
            best = best or problem
        if best is None:
            raise Unneeded
        raise Refused(best)


def verified_once(patch: Patch, target: Target, original: Any, key: Any) -> Any:
    """The replacement :meth:`Patch.pick` verifies for the release's
    ``original`` (its first swap's new value), once per installation under
    ``key`` in the patch's :meth:`~Patch.memo`, whichever module holds the
    function (one function sits in several modules' globals); raises
    :class:`Refused` with the reason remembered there when there is none."""
    verdicts = patch.memo()
    found = verdicts.get(key)
    if found is None:
        try:
            found = Patch.pick(patch, target, original).swaps[0].new
        except Refused as exc:
            found = str(exc)
        verdicts[key] = found
    if isinstance(found, str):
        raise Refused(found)
    return found
