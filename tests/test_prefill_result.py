"""The scheduler's prefill results (SGLang issue #36938):
``process_batch_result_prefill`` of the release under test, driven on
stand-in batches (:class:`flatgather.sglang.patches.prefill_result.Harness`).

The oracle is always the release's own method: once installed, every request
gets exactly what the release's method gives it in the same batch without the
skipped (retracted, finished) requests; a skipped one what the release leaves
on it. Gated on the release's row of the table
(``ROW.skip_advances_logprob_pt``), never on its version.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import textwrap
from pathlib import Path
from unittest import mock

import flatgather.sglang
import pytest
from _child import assert_prints
from _modules import edit_after_import, method_node, module_from_tree
from _sglang import ROW
from flatgather.sglang.patches import output_logprobs, prefill_result
from flatgather.sglang.patches.prefill_result import FIX, METHOD, Harness, Request
from flatgather.sglang.patching import Prepared
from flatgather.testing import install_sgl_kernel_stand_in
from hypothesis import given, settings
from hypothesis import strategies as st

# The mixin of 0.5.10 to 0.5.12 imports modules that need sgl_kernel; the
# stand-in goes in after logits_processor (imported by _sglang), which must
# not see it.
install_sgl_kernel_stand_in()


MODULE = prefill_result.release_module()
OWNER = prefill_result.owner_of(MODULE)
WHERE = f"{MODULE.__name__}.{OWNER.__name__}.{METHOD}"
# The release's own method, taken before any test can patch it.
STOCK = vars(OWNER)[METHOD]
HARNESS = Harness(OWNER)
FIXED_BY_RELEASE = ROW.skip_advances_logprob_pt


def current():
    return vars(OWNER)[METHOD]


def input_logprobs(state: dict):
    """A request's ``input_token_logprobs_val``: on the request up to
    0.5.12, on ``req.logprob`` from 0.5.13."""
    flat, nested = state["input_token_logprobs_val"], state["logprob"]["input_token_logprobs_val"]
    assert flat is None or nested is None, state
    return flat if nested is None else nested


def assert_as_without_skipped(function, specs, return_logprob=True):
    """``function`` gives every request of the batch what the release's own
    method gives it in the same batch without the requests it skips, and
    each of those what the release's method leaves on it."""
    skipped = HARNESS.skipped(STOCK, specs)
    kept = [k for k in range(len(specs)) if k not in skipped]
    got = HARNESS.run(function, specs, return_logprob=return_logprob)
    expected = HARNESS.run(STOCK, specs, kept, return_logprob=return_logprob)
    whole = HARNESS.run(STOCK, specs, return_logprob=return_logprob)
    assert isinstance(got, dict), got
    assert isinstance(expected, dict) and isinstance(whole, dict), (expected, whole)
    for k in kept:
        assert got[k] == expected[k], (k, specs)
    for k in skipped:
        assert got[k] == whole[k], (k, specs)


# --- the seed example ------------------------------------------------------------------------


@pytest.mark.matrix
def test_seed_example_the_third_request_gets_its_own_logprobs():
    """[A, S, B] with S retracted: the flat input logprobs are A's block
    [1000.5, 1001.5, 1002.5], S's [2000.5, 2001.5], B's [3000.5, 3001.5,
    3002.5]. The release serves B a block starting at S's; installed, B gets
    its own (the first position has none: SGLang's None)."""
    specs = [Request(3, 0), Request(2, 0, skipped="retracted"), Request(3, 0)]
    stock = HARNESS.run(STOCK, specs)
    assert input_logprobs(stock[0]) == [None, 1000.5, 1001.5]
    assert input_logprobs(stock[1]) is None  # skipped: nothing stored
    if not FIXED_BY_RELEASE:
        assert input_logprobs(stock[2]) == [None, 2000.5, 2001.5]  # issue #36938
    report = flatgather.sglang.install()
    assert (FIX in report.backports) is not FIXED_BY_RELEASE
    ours = HARNESS.run(current(), specs)
    assert input_logprobs(ours[0]) == [None, 1000.5, 1001.5]
    assert input_logprobs(ours[2]) == [None, 3000.5, 3001.5]
    assert ours[1] == stock[1]


@pytest.mark.matrix
def test_the_release_behaves_as_its_row_of_the_table_says():
    assert prefill_result.skip_advances(HARNESS, STOCK) is FIXED_BY_RELEASE
    assert (FIX in ROW.backports) is not FIXED_BY_RELEASE


@pytest.mark.matrix
def test_the_stand_ins_run_the_releases_own_logprob_code():
    """The stand-in ``self`` (and its logprob processor, from 0.5.13) runs
    the release's own code objects: the count, ``add_logprob_return_values``,
    ``add_input_logprob_return_values`` and what they call."""
    scheduler = HARNESS.scheduler
    holders = [
        scheduler,
        *(v for v in vars(scheduler).values() if "stands_in_for" in vars(type(v))),
    ]
    seen = set()
    for holder in holders:
        real = holder.stands_in_for
        for name, value in vars(type(holder)).items():
            code = getattr(getattr(value, "__func__", value), "__code__", None)
            if code is not None and name != "__getattr__":
                own = inspect.getattr_static(real, name)
                assert code is getattr(own, "__func__", own).__code__, name
                seen.add(name)
    assert {"add_logprob_return_values", "add_input_logprob_return_values"} <= seen, seen
    assert [n for n in seen if n.endswith("calculate_num_input_logprobs")], seen


@pytest.mark.matrix
def test_retracted_and_finished_requests_are_skipped():
    """What the property below leaves out of the release's batch."""
    specs = [Request(3, 0, skipped="retracted"), Request(2, 0, skipped="finished"), Request(2, 0)]
    assert HARNESS.skipped(STOCK, specs) == [0, 1]


# --- installed against the release, property-based --------------------------------------------


@st.composite
def stand_in_requests(draw):
    extend = draw(st.integers(1, 6))
    return Request(
        extend,
        draw(st.sampled_from([0, extend, draw(st.integers(0, extend))])),
        return_logprob=draw(st.booleans()),
        top=draw(st.sampled_from([0, 0, 1, 2])),
        token_ids=draw(st.booleans()),
        middle_chunk=draw(st.integers(0, 7)) == 0,
        skipped=draw(st.sampled_from([None, None, None, "retracted", "finished"])),
    )


@pytest.mark.matrix
@settings(max_examples=int(os.environ.get("FLATGATHER_HYPOTHESIS_EXAMPLES", "300")) // 3)
@given(
    specs=(st.integers(1, 8) | st.integers(1, 64)).flatmap(
        lambda n: st.lists(stand_in_requests(), min_size=n, max_size=n)
    ),
    return_logprob=st.booleans() | st.just(True),
)
def test_every_request_gets_what_the_release_gives_it_without_the_skipped(specs, return_logprob):
    flatgather.sglang.install()
    assert_as_without_skipped(current(), specs, return_logprob)


@pytest.mark.matrix
@pytest.mark.parametrize("size", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("kind", ["retracted", "finished"])
def test_a_skipped_request_at_every_position(size, kind):
    """Requests of every kind around it: no logprobs, a middle chunk, top
    logprobs, token-id logprobs, an empty block (start == extend)."""
    flatgather.sglang.install()
    kinds = [
        dict(),
        dict(return_logprob=False),
        dict(top=2, token_ids=True),
        dict(middle_chunk=True),
        dict(top=1),
    ]
    base = [Request(2 + k % 4, (k % 3) * (k % 2), **kinds[k % len(kinds)]) for k in range(size)]
    base[-1] = Request(3, 3) if size > 4 else base[-1]
    for position in range(size):
        specs = list(base)
        specs[position] = Request(2 + position % 3, 0, skipped=kind)
        assert_as_without_skipped(current(), specs)


SKIPPED = [
    ("only", [Request(3, 0, skipped="retracted")]),
    ("all", [Request(3, 0, skipped="finished"), Request(2, 1, skipped="retracted")]),
    ("adjacent", [Request(2, 0), *[Request(3, 1, skipped="retracted")] * 2, Request(4, 0)]),
    ("empty block", [Request(2, 0), Request(3, 3, skipped="retracted"), Request(2, 0)]),
    (
        "retracted middle chunk",
        [Request(2, 0), Request(4, 1, skipped="retracted", middle_chunk=True), Request(3, 0)],
    ),
    (
        # Skipped up to 0.5.13; from 0.5.14 its chunk is drained in the chunked branch.
        "finished middle chunk",
        [Request(2, 0), Request(4, 0, skipped="finished", middle_chunk=True), Request(3, 1)],
    ),
    (
        "before a middle chunk",
        [Request(3, 0, skipped="finished"), Request(4, 1, middle_chunk=True)],
    ),
    (
        "before no logprob",
        [Request(3, 0, skipped="retracted"), Request(2, 0, return_logprob=False)],
    ),
]


@pytest.mark.matrix
@pytest.mark.parametrize("return_logprob", [True, False])
@pytest.mark.parametrize(("name", "specs"), SKIPPED, ids=[n for n, _ in SKIPPED])
def test_named_edge_cases(name, specs, return_logprob):
    flatgather.sglang.install()
    assert_as_without_skipped(current(), specs, return_logprob)


@pytest.mark.matrix
def test_no_skipped_request_the_same_as_the_release():
    flatgather.sglang.install()
    specs = [Request(3, 0), Request(4, 1, middle_chunk=True), Request(2, 0, return_logprob=False)]
    for return_logprob in (True, False):
        assert HARNESS.run(current(), specs, return_logprob=return_logprob) == HARNESS.run(
            STOCK, specs, return_logprob=return_logprob
        )


# --- install and uninstall --------------------------------------------------------------------


def scheduler_calls():
    """How ``Scheduler`` reaches the method, read off the release's
    ``scheduler.py``: ``self.<method>`` (inherited from a base class) or
    ``self.<attr>.<method>`` (an instance it holds), with what it assigns
    to ``<attr>`` and the names of its bases."""
    path = importlib.util.find_spec("sglang.srt.managers.scheduler").origin
    tree = ast.parse(Path(path).read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler"]
    calls = {
        ast.unparse(n.func)
        for n in ast.walk(cls)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == METHOD
    }
    assigned = {
        ast.unparse(n.targets[0]): ast.unparse(n.value.func)
        for n in ast.walk(cls)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and len(n.targets) == 1
    }
    return calls, assigned, [ast.unparse(b) for b in cls.bases]


@pytest.mark.matrix
def test_the_scheduler_calls_the_class_attribute_that_is_patched():
    calls, assigned, bases = scheduler_calls()
    assert calls, "Scheduler never calls the method"
    for call in calls:
        if call == f"self.{METHOD}":
            assert OWNER.__name__ in bases
        else:
            holder = call.rsplit(".", 1)[0]
            assert assigned.get(holder) == OWNER.__name__, (call, assigned.get(holder))


@pytest.mark.matrix
def test_install_rewrites_the_method_and_uninstall_restores_the_very_function():
    report = flatgather.sglang.install()
    assert MODULE.__name__ not in report.pending
    assert not [n for n in report.notes if METHOD in n], report.notes
    if FIXED_BY_RELEASE:
        assert current() is STOCK and WHERE not in report.patched
        return
    patched = current()
    assert WHERE in report.patched and FIX in report.backports
    assert patched is not STOCK and patched.__wrapped__ is STOCK
    # Still the release's method: its file, its line numbers, its signature.
    assert patched.__code__.co_filename == STOCK.__code__.co_filename
    assert patched.__code__.co_firstlineno == STOCK.__code__.co_firstlineno
    assert patched.__defaults__ == STOCK.__defaults__
    assert patched.__qualname__ == STOCK.__qualname__
    assert patched.__globals__ is STOCK.__globals__
    assert flatgather.sglang.uninstall()
    assert current() is STOCK


def test_patched_when_the_scheduler_module_is_imported_after_install():
    """install() does not import the scheduler's module (the mixin needs
    sgl_kernel); the fix lands when something imports it. The module a
    release lacks is not left pending."""
    code = textwrap.dedent(
        f"""
        import importlib, sys
        import flatgather.sglang as fs
        from flatgather.sglang.patches import prefill_result as pr
        from flatgather.testing import install_sgl_kernel_stand_in

        report = fs.install()
        names = [n for n in pr.MODULES if n in report.pending]
        assert names == [{MODULE.__name__!r}], report.pending
        assert not any(n in sys.modules for n in pr.MODULES), "install() imported it"
        install_sgl_kernel_stand_in()
        module = importlib.import_module(names[0])
        report = fs.installed_report()
        assert names[0] not in report.pending, report
        assert ({FIX!r} in report.backports) is not {FIXED_BY_RELEASE!r}, report
        owner = pr.owner_of(module)
        patched = hasattr(vars(owner)[pr.METHOD], "__wrapped__")
        assert patched is not {FIXED_BY_RELEASE!r}
        print("lazy-ok")
        """
    )
    assert_prints(code, "lazy-ok")


# --- a release that fixed it, and refusals -----------------------------------------------------


def _skip_branch(method: ast.FunctionDef) -> ast.If:
    (skip,) = [
        n
        for n in ast.walk(method)
        if isinstance(n, ast.If)
        and "is_retracted" in ast.unparse(n.test)
        and "finished()" in ast.unparse(n.test)  # not the embedding loop's
        and isinstance(n.body[-1], ast.Continue)
    ]
    return skip


def _advance_as_upstream(method: ast.FunctionDef) -> None:
    """The fix as a release would ship it (in the manner of SGLang PR
    #36939), in words of its own: the block length, inline."""
    fix = ast.parse(
        "if batch.return_logprob and extend_input_len_per_req is not None:\n"
        "    logprob_pt += extend_input_len_per_req[i] - extend_logprob_start_len_per_req[i]"
    ).body
    _skip_branch(method).body[:0] = fix


def _more_than_continue(method: ast.FunctionDef) -> None:
    _skip_branch(method).body.insert(0, ast.Pass())


def _loop_over_a_copy(method: ast.FunctionDef) -> None:
    """``zip(batch.reqs, ...)`` becomes ``zip(list(batch.reqs), ...)``."""
    (zipped,) = [
        n
        for n in ast.walk(method)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "zip"
        if ast.unparse(n.args[0]) == "batch.reqs"
    ]
    zipped.args[0] = ast.Call(ast.Name("list", ast.Load()), [zipped.args[0]], [])


def _unchanged(method: ast.FunctionDef) -> None:
    pass


def module_with(edit, tmp_path: Path):
    """A copy of the release's module, its own source file, with the
    method's syntax tree edited by ``edit``: a release that differs there."""
    path = Path(MODULE.__file__)
    tree = ast.parse(path.read_text(), str(path))
    edit(method_node(tree, OWNER.__name__, METHOD))
    return module_from_tree(tree, tmp_path, f"flatgather_test_scheduler_{edit.__name__.strip('_')}")


@pytest.mark.matrix
def test_a_faithful_copy_of_the_method_is_rewritten(tmp_path):
    """The control for the refusals below: the same module builder, no edit."""
    result = prefill_result.PATCH.prepare(module_with(_unchanged, tmp_path))
    assert result.applied == (() if FIXED_BY_RELEASE else (FIX,)), result.notes
    assert result.notes == ()


@pytest.mark.matrix
def test_a_release_that_advances_the_cursor_is_left_alone(tmp_path, monkeypatch):
    module = module_with(_advance_as_upstream, tmp_path)
    owner = prefill_result.owner_of(module)
    fixed = vars(owner)[METHOD]
    assert prefill_result.skip_advances(Harness(owner, module), fixed) is True
    assert prefill_result.PATCH.prepare(module) == Prepared()
    # The same method in the release's own class: told by its behaviour.
    monkeypatch.setattr(OWNER, METHOD, fixed)
    # Without the output-logprob chain, which would rebuild this method for
    # its own loops (up to 0.5.12) and so put it among the patched.
    report = flatgather.sglang.install(output_logprobs=False)
    assert FIX not in report.backports and WHERE not in report.patched
    assert current() is fixed
    assert not [n for n in report.notes if METHOD in n], report.notes


@pytest.mark.matrix
@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (_more_than_continue, "does more than `continue`"),
        (_loop_over_a_copy, "expected one loop"),
    ],
)
def test_a_method_not_in_the_expected_shape_is_left_stock(edit, why, tmp_path):
    module = module_with(edit, tmp_path)
    owner = prefill_result.owner_of(module)
    original = vars(owner)[METHOD]
    result = prefill_result.PATCH.prepare(module)
    assert result.swaps == [] and result.applied == ()
    if FIXED_BY_RELEASE:
        assert result.notes == ()
        return
    (note,) = result.notes
    assert "left stock (SGLang issue #36938 unfixed)" in note and why in note, note
    assert vars(owner)[METHOD] is original


@pytest.mark.matrix
def test_a_source_file_edited_after_import_is_left_stock(tmp_path):
    module = module_with(_unchanged, tmp_path)
    edit_after_import(module, OWNER.__name__, METHOD, _more_than_continue)
    result = prefill_result.PATCH.prepare(module)
    assert result.swaps == [] and result.applied == ()
    if not FIXED_BY_RELEASE:
        (note,) = result.notes
        assert "does not compile to the code that runs" in note, note


@pytest.mark.matrix
def test_a_rewrite_that_differs_from_the_release_is_caught_before_patching():
    """An advance one row short: the check at install sees it."""
    real = prefill_result.advance_in_skip

    def one_short(shape):
        real(shape)
        step = shape.skip.body[0].body[0]
        step.value = ast.BinOp(step.value, ast.Sub(), ast.Constant(1))

    with mock.patch.object(prefill_result, "advance_in_skip", one_short):
        result = prefill_result.PATCH.prepare(MODULE)
    assert result.swaps == []
    if not FIXED_BY_RELEASE:
        (note,) = result.notes
        assert "checked against the release's own method" in note, note
        assert "input_token_logprobs_val" in note, note


@pytest.mark.matrix
def test_prepare_never_raises():
    empty = type(MODULE)("flatgather_test_empty")
    assert prefill_result.PATCH.prepare(empty).notes == (
        f"flatgather_test_empty defines {METHOD} in 0 classes, not one",
    )
    with mock.patch.object(prefill_result, "skip_advances", side_effect=RuntimeError("boom")):
        result = prefill_result.PATCH.prepare(MODULE)
    assert result.swaps == []
    owner = prefill_result.owner_of(MODULE)
    assert result.notes == (
        f"{owner.__qualname__}.{METHOD} left stock (SGLang issue #36938 unfixed): "
        "RuntimeError: boom",
    )


@pytest.mark.matrix
def test_the_fix_and_the_logprob_chain_share_one_method():
    """Up to 0.5.12 the output-logprob chain has loops in the method #36938
    fixes: the chain rebuilds it from the fix's tree, so the one method is
    both flat and fixed; uninstall restores the release's function."""
    if METHOD not in output_logprobs.methods_with_loops(OWNER):
        pytest.skip("the chain has no loop in this release's method")
    report = flatgather.sglang.install()
    build = getattr(current(), "__flatgather_build__", None)
    assert build is not None and output_logprobs.TOLIST in build.closure, report.notes
    assert (FIX in report.backports) is not FIXED_BY_RELEASE
    assert build.method.function is STOCK
    specs = [Request(3, 0, top=2, token_ids=True), Request(2, 0, skipped="retracted")]
    specs += [Request(3, 1, top=1, token_ids=True)]
    assert_as_without_skipped(current(), specs)
    assert flatgather.sglang.uninstall()
    assert current() is STOCK
