"""Attribute patches applied all together or not at all, and what a
patcher that waits for a module's import hands back."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

_MISSING = object()


@dataclass
class Patch:
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


@dataclass(frozen=True)
class Prepared:
    """What a deferred patcher (``prepare(module)``) found it could do: the
    patches to apply, what they apply (names for the install report), the
    backports among them, and notes on what was left stock and why."""

    patches: list[Patch] = field(default_factory=list)
    applied: tuple[str, ...] = ()
    backports: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @classmethod
    def refused(cls, note: str) -> Prepared:
        return cls(notes=(note,))


def apply_all(patches: Sequence[Patch]) -> list[Patch]:
    """Apply every patch, or, if one fails, revert those already applied and
    re-raise: the targets are then exactly as they were."""
    applied: list[Patch] = []
    try:
        for patch in patches:
            patch.apply()
            applied.append(patch)
    except BaseException:
        revert_all(applied)
        raise
    return applied


def revert_all(patches: Sequence[Patch]) -> None:
    """Revert in reverse order of application."""
    for patch in reversed(patches):
        patch.revert()


def never_raises(where: Callable[[ModuleType], str]):
    """The one guard of every patcher's ``prepare(module) -> Prepared``:
    what it raises becomes a refusal, a note naming ``where(module)`` and
    the exception, and the code stays as shipped. (``KeyboardInterrupt``
    and other ``BaseException``s go through.)"""

    def guard(prepare: Callable[[ModuleType], Prepared]) -> Callable[[ModuleType], Prepared]:
        @functools.wraps(prepare)
        def guarded(module: ModuleType) -> Prepared:
            try:
                return prepare(module)
            except Exception as exc:
                return Prepared.refused(f"{where(module)} left stock: {type(exc).__name__}: {exc}")

        return guarded

    return guard
