"""flatgather._import_hooks: a callback runs on a module once its code has
run, never on a module still being imported.

The case that matters: in a real SGLang 0.5.23 scheduler,
``sglang.srt.managers.utils`` is half-imported (its line 14 leads, through
the disaggregation package, to ``logits_processor``) when the switch installs
flatgather. Asking then for a callback on ``managers.utils`` must wait until
that module is whole; calling it at once hands it a module without
``GenerationBatchResult``, and the output chain's host copy was silently left
stock on every real server.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
from flatgather import _import_hooks


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package ``fg_cycle``: ``outer`` imports ``inner`` before it defines
    ``Whole``; importing ``inner`` asks for a callback on ``outer``."""
    root = tmp_path / "fg_cycle"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "outer.py").write_text(
        textwrap.dedent(
            """
            from fg_cycle import inner  # noqa: F401
            class Whole:
                pass
            """
        )
    )
    (root / "inner.py").write_text("import fg_cycle.hook\n")
    (root / "hook.py").write_text(
        textwrap.dedent(
            """
            import sys
            from flatgather import _import_hooks
            SEEN = []
            def callback(module):
                SEEN.append(hasattr(module, "Whole"))
            _import_hooks.when_imported("fg_cycle.outer", callback)
            """
        )
    )
    (root / "after.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [m for m in sys.modules if m == "fg_cycle" or m.startswith("fg_cycle.")]:
        del sys.modules[name]


def test_a_half_imported_module_gets_its_callback_once_it_is_whole(package):
    importlib.import_module("fg_cycle.outer")
    hook = importlib.import_module("fg_cycle.hook")
    # Its import finished with no other import after it: the next import, of
    # anything, fires the callback on the whole module.
    importlib.import_module("fg_cycle.after")

    assert hook.SEEN == [True]
    _import_hooks.cancel("fg_cycle.outer", hook.callback)


def test_a_whole_module_gets_its_callback_at_once(package):
    import fg_cycle.outer

    seen = []
    _import_hooks.when_imported("fg_cycle.outer", lambda m: seen.append(m))
    assert seen == [fg_cycle.outer]


def test_a_callback_registered_by_a_callback_of_the_same_module_runs_at_once(tmp_path, monkeypatch):
    """The switch installs from the callback on the logits processor, and
    install() asks for a callback on that same module: its code has finished
    (importlib still marks it initializing), so the new callback runs at once,
    and the first one does not run a second time at the next import."""
    (tmp_path / "fg_target.py").write_text("VALUE = 1\n")
    (tmp_path / "fg_next.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []

    def second(module):
        calls.append(("second", module.VALUE))

    def first(module):
        calls.append(("first", module.VALUE))
        _import_hooks.when_imported("fg_target", second)

    _import_hooks.when_imported("fg_target", first)
    try:
        importlib.import_module("fg_target")
        importlib.import_module("fg_next")
        assert calls == [("first", 1), ("second", 1)]
    finally:
        _import_hooks.cancel("fg_target", first)
        _import_hooks.cancel("fg_target", second)
        sys.modules.pop("fg_target", None)
        sys.modules.pop("fg_next", None)
