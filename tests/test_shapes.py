"""flatgather replaces ``_get_pruned_states`` only where the running code is
code the test matrix has run (``flatgather.sglang.shapes``): a probe proves
what its batches try, and an edit that changes the rule only where they do
not reach passes it.

The mutants here are the running release's own method, its source copied
into a module of its own with one edit, put in place of the release's: the
kind of edit a fork or a later release makes."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import textwrap

import flatgather.sglang as fs
import pytest
from _sglang import STOCK_PRUNED_STATES, LogitsProcessor
from conftest import RELEASE
from flatgather.sglang import shapes
from flatgather.sglang.patches.pruned_states import probe
from flatgather.testing import fingerprints

BRANCH = "if extend_len == extend_logprob_start_len:"


def _mutant(tmp_path, monkeypatch, old: str, new: str):
    """The release's ``_get_pruned_states`` with ``old`` replaced by ``new``
    (the text must be there), defined in a module of its own that reads the
    release module's globals."""
    method = inspect.getsource(STOCK_PRUNED_STATES)
    if old not in method:
        pytest.skip(f"SGLang {RELEASE}'s _get_pruned_states has no {old!r}")
    module_name = f"fg_mutant_{abs(hash((old, new)))}"
    body = textwrap.indent(textwrap.dedent(method.replace(old, new, 1)), "    ")
    (tmp_path / f"{module_name}.py").write_text(
        "import sglang.srt.layers.logits_processor as _release\n"
        "globals().update({k: v for k, v in vars(_release).items() if not k.startswith('__')})\n"
        f"class LogitsProcessor:\n{body}"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(module_name)
    mutant = vars(module.LogitsProcessor)["_get_pruned_states"]
    monkeypatch.setattr(LogitsProcessor, "_get_pruned_states", mutant)
    return mutant, sys.modules.pop(module_name)


@pytest.mark.matrix
def test_the_running_release_is_a_known_shape():
    found = shapes.fingerprint(LogitsProcessor, "_get_pruned_states")
    assert RELEASE in shapes.KNOWN[shapes.PRUNED_STATES].get(found, ()), (
        f"{RELEASE}: fingerprint {found} not in the table; regenerate it"
    )


@pytest.mark.matrix
def test_the_running_release_s_store_is_a_known_shape():
    found = shapes.fingerprint(LogitsProcessor, "_get_hidden_states_to_store")
    assert RELEASE in shapes.KNOWN[shapes.STORE].get(found, ()), (
        f"{RELEASE}: store fingerprint {found} not in the table; regenerate it"
    )


@pytest.mark.matrix
@pytest.mark.parametrize(
    ("name", "new"),
    [
        # A start of 1 in a request of three tokens or more read as a chunk.
        (
            "start 1 as a chunk",
            "if extend_len == extend_logprob_start_len or (extend_logprob_start_len == 1 "
            "and extend_len > 2):",
        ),
        # The chunk rule for long requests only: no probe batch is that long.
        ("long requests", "if extend_len == extend_logprob_start_len or extend_len > 64:"),
    ],
)
def test_an_edit_the_probe_cannot_see_is_refused(tmp_path, monkeypatch, name, new):
    _mutant(tmp_path, monkeypatch, BRANCH, new)
    module = sys.modules["sglang.srt.layers.logits_processor"]
    # The probe alone accepts it: its batches never reach the edit.
    probe.run(module)
    before = dict(vars(LogitsProcessor))
    with pytest.raises(fs.UnsupportedRelease) as info:
        fs.install()
    assert "not code flatgather has seen" in str(info.value)
    assert "Nothing was patched" in str(info.value)
    assert dict(vars(LogitsProcessor)) == before
    assert not fs.is_installed()


@pytest.mark.matrix
def test_a_comment_changes_no_shape(tmp_path, monkeypatch):
    stock = shapes.fingerprint(LogitsProcessor, "_get_pruned_states")
    line = next(x for x in inspect.getsource(STOCK_PRUNED_STATES).splitlines() if BRANCH in x)
    indent = line[: len(line) - len(line.lstrip())]
    mutant, _ = _mutant(
        tmp_path, monkeypatch, BRANCH, f"# the same rule, said again\n{indent}{BRANCH}"
    )
    assert shapes.fingerprint(LogitsProcessor, "_get_pruned_states") == stock
    fs.install()
    assert vars(LogitsProcessor)["_get_pruned_states"] is not mutant  # patched


def test_a_global_rebound_is_another_shape(tmp_path, monkeypatch):
    """The same source reading another ``torch`` is not the same code."""
    mutant, _ = _mutant(tmp_path, monkeypatch, BRANCH, BRANCH)
    same = shapes.fingerprint(LogitsProcessor, "_get_pruned_states")
    monkeypatch.setitem(mutant.__globals__, "torch", sys)
    assert shapes.fingerprint(LogitsProcessor, "_get_pruned_states") != same


@pytest.mark.matrix
def test_every_function_replaced_whole_is_a_known_shape():
    found = fingerprints.release_functions()
    assert found, "no replaced function found in the release"
    for name, function in found.items():
        shape = shapes.fingerprint(None, function)
        assert RELEASE in shapes.KNOWN[name].get(shape, ()), (
            f"{RELEASE}: {name} fingerprint {shape} not in the table; regenerate it"
        )


def _function_mutant(tmp_path, monkeypatch, function):
    """``function`` with one statement more at the end of its body (``pass``:
    the same behaviour, other code), in a module of its own reading the
    release module's globals."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    tree.body[0].body.append(ast.Pass())
    name = f"fg_mutant_fn_{function.__name__}"
    (tmp_path / f"{name}.py").write_text(
        "from __future__ import annotations\n"
        f"import {function.__module__} as _release\n"
        "globals().update({k: v for k, v in vars(_release).items() if not k.startswith('__')})\n"
        + ast.unparse(tree)
        + "\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    mutant = getattr(importlib.import_module(name), function.__name__)
    sys.modules.pop(name)
    return mutant


@pytest.mark.parametrize(
    "name", [k.key for k in fingerprints.declared() if k.owner is None and not k.imported]
)
def test_an_unknown_function_is_left_stock_and_the_rest_goes_on(tmp_path, monkeypatch, name):
    """Known code only, for the functions replaced whole: even an edit that
    changes no behaviour is code the matrix never ran."""
    function = fingerprints.release_functions().get(name)
    if function is None:
        pytest.skip(f"SGLang {RELEASE} has no {name}")
    mutant = _function_mutant(tmp_path, monkeypatch, function)
    # Wherever SGLang's code looks the function up (its callers import it).
    holders = [
        m
        for key, m in list(sys.modules.items())
        if key.startswith("sglang.") and vars(m).get(name) is function
    ]
    for module in holders:
        monkeypatch.setattr(module, name, mutant)
    with pytest.raises(shapes.UnknownShape, match="not code flatgather has seen"):
        shapes.known(name, None, mutant)
    report = fs.install()
    for module in holders:
        assert vars(module)[name] is mutant, f"the unknown function was patched in {module}"
    assert any(name in note and "not code flatgather has seen" in note for note in report.notes)
    assert report.contract is not None  # the other patches went on


@pytest.mark.matrix
def test_the_table_is_what_the_generator_writes():
    """The running release's row of the generated table is what the
    generator finds in it now, key for key, and the file is the generator's
    own rendering of its rows (no hand edit)."""
    found = fingerprints.release_fingerprints()
    listed = {
        key: fp
        for key, prints in shapes.KNOWN.items()
        for fp, rs in prints.items()
        if RELEASE in rs
    }
    assert found == listed, "regenerate: python -m flatgather.testing.fingerprints --write"
    rows: dict[str, dict[str, str]] = {}
    for key, prints in shapes.KNOWN.items():
        for fp, releases_ in prints.items():
            for release in releases_:
                rows.setdefault(release, {})[key] = fp
    from flatgather.sglang.known_shapes import __file__ as table_file
    from flatgather.sglang.releases import RELEASES

    ordered = {r.version: rows[r.version] for r in RELEASES if r.version in rows}
    with open(table_file) as f:
        assert fingerprints.render(ordered) == f.read()
