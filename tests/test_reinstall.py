"""Install, uninstall, install again: each installation judges the release's
code as it finds it, and ``uninstall()`` leaves nothing of the one before
(a module that imported a patched name: ``tests/test_spec_logprobs.py``)."""

from __future__ import annotations

import importlib

import flatgather.sglang
import pytest
from flatgather.sglang.patches.output_logprobs import (
    CONSUMER_CLASSES,
    CONSUMERS,
    PRODUCER,
    PRODUCER_MODULES,
    PRODUCERS,
    Producers,
)
from flatgather.sglang.patches.output_logprobs import runtime as flat_logprobs
from flatgather.testing import install_sgl_kernel_stand_in

pytestmark = pytest.mark.matrix

TOP = flat_logprobs.TOP


def _logprob_module():
    """The release's module that defines the producers (the others import
    them from it)."""
    for name in PRODUCER_MODULES[:2]:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise LookupError("neither logprob module of the releases imports")


def _imports(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _top_left_stock(report, module) -> list[str]:
    """The install report's notes on ``get_top_logprobs`` in ``module`` (the
    module's other producer is applied or not on its own)."""
    (found,) = [p for p in report.patches if p.patch == PRODUCERS and p.module == module.__name__]
    return [n for n in found.notes if n.startswith(f"{module.__name__}.{TOP} left stock")]


def _rows_reversed(module):
    """The module changed as a fork might change it: ``get_top_logprobs``
    (the release's own function object) answers its rows in reverse, through
    the helper it calls in the module's globals."""
    raw = module.get_top_logprobs_raw

    def reversed_rows(*args, **kwargs):
        values, indices = raw(*args, **kwargs)
        return values[::-1], indices[::-1]

    return reversed_rows


def test_a_reinstall_judges_the_module_as_it_now_is(monkeypatch):
    module = _logprob_module()
    release_own = vars(module)[TOP]
    assert getattr(release_own, "__flatgather__", None) is None

    # Refused on the changed module...
    with monkeypatch.context() as changed:
        changed.setattr(module, "get_top_logprobs_raw", _rows_reversed(module))
        notes = _top_left_stock(flatgather.sglang.install(), module)
        assert notes and vars(module)[TOP] is release_own, notes
        assert flatgather.sglang.uninstall()

    # ...applied once the module is as the release ships it again: picked
    # again, not refused from memory.
    notes = _top_left_stock(flatgather.sglang.install(), module)
    assert not notes, notes
    assert vars(module)[TOP].__wrapped__ is release_own
    assert flatgather.sglang.uninstall()
    assert vars(module)[TOP] is release_own
    assert not vars(PRODUCER).get("_memo"), "an installation wrote its verdicts on PRODUCER"

    # And the other way: what passed before is checked again on the changed
    # module, and its own check finds the difference.
    with monkeypatch.context() as changed:
        changed.setattr(module, "get_top_logprobs_raw", _rows_reversed(module))
        notes = _top_left_stock(flatgather.sglang.install(), module)
        assert notes and vars(module)[TOP] is release_own, notes
        assert all(f"left stock: {TOP} on " in note for note in notes), notes
        assert flatgather.sglang.uninstall()


def test_one_installation_verifies_each_producer_once(monkeypatch):
    """The producers' verdicts are the installation's, shared by its
    patches: the chain's check, which makes its lists with the producers,
    reuses the verdict the producers' patch reached instead of checking the
    same function again (and the next installation checks anew)."""
    built = []
    build = Producers.build

    def counting(self, target, original):
        built.append(original)
        return build(self, target, original)

    monkeypatch.setattr(Producers, "build", counting)
    # The chain's modules imported first: its check runs in install().
    importlib.import_module("sglang.srt.layers.logits_processor")
    install_sgl_kernel_stand_in()
    chain = [importlib.import_module(name) for name in CONSUMER_CLASSES if _imports(name)]
    report = flatgather.sglang.install()
    applied = {p.module for p in report.patches if p.patch == CONSUMERS and p.state == "applied"}
    assert applied and applied <= {m.__name__ for m in chain}, report.patches
    first = list(built)
    assert first and len(first) == len(set(first)), first
    assert flatgather.sglang.uninstall()
    built.clear()
    flatgather.sglang.install()
    assert sorted(map(id, built)) == sorted(map(id, first))
