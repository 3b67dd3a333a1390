"""The V2 draft worker's prefill, ``EagleDraftWorker._draft_extend_for_prefill``,
driven through the release's own method up to ``ForwardBatch.init_new``
(:mod:`flatgather.bench.draft_harness`): stock against installed.

Gated on the release's row of the table (``ROW.rotation``,
``ROW.draft_no_logprob``), never on its version.
"""

from __future__ import annotations

import ast
import dataclasses
import dis
import importlib
import importlib.util
import textwrap
import types
from pathlib import Path
from unittest import mock

import flatgather.sglang
import pytest
import torch
from _child import assert_prints
from _modules import edit_after_import, module_from_tree
from _sglang import DRAFT_NO_LOGPROB, ROW
from flatgather.bench import draft_harness
from flatgather.bench.draft_harness import make_inputs
from flatgather.sglang.patches import draft_prefill
from flatgather.sglang.patches.draft_prefill import match as draft_match
from flatgather.sglang.releases import IN_PLACE, NEW_TENSOR_MM
from flatgather.testing import install_sgl_kernel_stand_in
from hypothesis import given, settings
from hypothesis import strategies as st

install_sgl_kernel_stand_in()
worker = importlib.import_module(draft_prefill.MODULE)

OWNER, METHOD = draft_prefill.OWNER, draft_prefill.METHOD
WHERE = f"{draft_prefill.MODULE}.{OWNER}.{METHOD}"
# The release's own method, taken before any test can patch it.
STOCK = vars(getattr(worker, OWNER))[METHOD]
ROTATES_MM = ROW.rotation == NEW_TENSOR_MM


def current():
    return vars(getattr(worker, OWNER))[METHOD]


def outcome(inputs, method=None, count=False):
    try:
        return draft_harness.run(worker, inputs, method, count)
    except Exception as exc:  # compared by type: the same failure, or none
        return type(exc)


def defined_rows(lens, rows):
    """The rows of the rotated ``mm_input_embeds`` the release writes: all
    but each request's last."""
    mask = torch.ones(rows, dtype=torch.bool)
    mask[torch.tensor(lens, dtype=torch.int64).cumsum(0) - 1] = False
    return mask


def assert_same_as_stock(inputs, ours, stock):
    """``ours`` (installed) gives the draft forward what ``stock`` (the
    release's own method) gives it, the same way (in place or new)."""
    if isinstance(stock, type):
        assert ours is stock
        return
    assert ours.input_ids.dtype == stock.input_ids.dtype
    assert torch.equal(ours.input_ids_values, stock.input_ids_values)
    assert ours.ids_in_place == stock.ids_in_place
    assert ours.target_return_logprob is stock.target_return_logprob is True
    if stock.mm_input_embeds is None:
        assert ours.mm_input_embeds is None
        return
    assert ours.mm_in_place == stock.mm_in_place
    rows = slice(None)
    if not stock.mm_in_place:
        rows = defined_rows(inputs.lens, stock.mm_input_embeds.shape[0])
    assert torch.equal(ours.mm_input_embeds[rows], stock.mm_input_embeds[rows])


def check_table_row(inputs, stock):
    """The release does what its row of the table says."""
    if inputs.idle:
        assert stock.ids_in_place
        return
    assert stock.ids_in_place == (ROW.rotation == IN_PLACE)
    if inputs.mm_input_embeds is not None:
        assert stock.mm_in_place == (not ROTATES_MM)


# --- the seed example ------------------------------------------------------------------------


@pytest.mark.matrix
def test_seed_example_three_requests():
    """Lengths [3, 1, 2]: each request's ids shift left by one and its last
    position takes its tail token."""
    inputs = dataclasses.replace(
        make_inputs([3, 1, 2], mm_width=2),
        input_ids=torch.tensor([10, 11, 12, 20, 30, 31]),
        next_token_ids=torch.tensor([13, 21, 32]),
    )
    stock = draft_harness.run(worker, inputs)
    assert stock.input_ids_values.tolist() == [11, 12, 13, 21, 31, 32]
    flatgather.sglang.install()
    ours = draft_harness.run(worker, inputs)
    assert ours.input_ids_values.tolist() == [11, 12, 13, 21, 31, 32]
    assert_same_as_stock(inputs, ours, stock)
    check_table_row(inputs, stock)
    if ROTATES_MM:
        mm = inputs.mm_input_embeds
        assert torch.equal(ours.mm_input_embeds[[0, 1, 4]], mm[[1, 2, 5]])


# --- stock against installed, property-based -------------------------------------------------


@st.composite
def draft_batches(draw):
    """Batches of 1 to 1024 requests: lengths of one, short and long ones,
    a chunked request (in the batch or not) with its next prompt token,
    ``mm_input_embeds`` or not, tails as the sampler or the release types
    them, idle mode now and then."""
    b = draw(st.one_of(st.integers(1, 8), st.integers(1, 1024)))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    longest = draw(st.sampled_from([1, 2, 8, 64]))
    lens = torch.randint(1, longest + 1, (b,), generator=gen)
    ones = torch.rand(b, generator=gen) < draw(st.sampled_from([0.0, 0.3, 1.0]))
    lens[ones] = 1
    chunked = draw(st.none() | st.integers(0, b))  # b: a chunked request not in this batch
    return make_inputs(
        lens.tolist(),
        seed=seed,
        mm_width=draw(st.none() | st.sampled_from([1, 3])),
        chunked=chunked,
        next_prompt_token=None if chunked is None else draw(st.integers(0, 60_000)),
        idle=draw(st.sampled_from([False] * 9 + [True])),
        tails_dtype=draw(st.sampled_from([torch.int64, torch.int32])),
    )


@pytest.mark.matrix
@settings(max_examples=min(200, settings.default.max_examples))
@given(inputs=draft_batches())
def test_installed_gives_the_draft_forward_what_the_release_gives(inputs):
    stock = draft_harness.run(worker, inputs, STOCK)
    check_table_row(inputs, stock)
    flatgather.sglang.install()  # once per test: it is idempotent
    ours = draft_harness.run(worker, inputs, count=True)
    assert current() is not STOCK
    assert_same_as_stock(inputs, ours, stock)
    if not inputs.idle and len(inputs.lens) > 1:
        # The gather ran (the release's loop has no index_select, a cat per
        # request); a single request keeps the release's loop, as cheap.
        assert "index_select" in ours.ops and ours.ops.count("cat") == 1, ours.ops


@pytest.mark.matrix
@pytest.mark.parametrize(
    "case",
    ["zero length", "rows past the tokens", "a tail short", "a tail too many", "one row short"],
)
def test_inputs_the_gather_does_not_take_run_the_release_loop(case):
    inputs = make_inputs([2, 3, 1], mm_width=2, seed=5)
    if case == "zero length":
        inputs = make_inputs([2, 0, 3], mm_width=2, seed=5)
    elif case == "rows past the tokens":
        inputs = make_inputs([2, 3, 1], mm_width=2, seed=5, rows=8)
    elif case == "one row short":
        inputs = make_inputs([2, 3, 1], mm_width=2, seed=5, rows=5)
    elif case == "a tail short":
        inputs = dataclasses.replace(inputs, next_token_ids=inputs.next_token_ids[:2])
    else:
        tails = torch.cat((inputs.next_token_ids, torch.tensor([7])))
        inputs = dataclasses.replace(inputs, next_token_ids=tails)
    stock = outcome(inputs, STOCK)
    flatgather.sglang.install()
    ours = outcome(inputs, count=True)
    assert_same_as_stock(inputs, ours, stock)
    if not isinstance(ours, type):
        assert "index_select" not in ours.ops  # the release's own loop ran


@pytest.mark.cuda
@pytest.mark.parametrize("lens", [[1], [5, 1, 7], [1] * 300, list(range(1, 200))])
@pytest.mark.parametrize("mm_width", [None, 8])
def test_on_cuda_pinned_staging_and_one_gather(lens, mm_width):
    inputs = make_inputs(lens, mm_width=mm_width, seed=len(lens), device="cuda")
    stock = draft_harness.run(worker, inputs, STOCK)
    flatgather.sglang.install()
    for _ in range(6):  # more calls than pinned buffers: each one reused
        ours = draft_harness.run(worker, inputs, count=True)
        assert ours.input_ids.device.type == "cuda"
        assert_same_as_stock(inputs, ours, stock)
    assert "index_select" in ours.ops and ours.ops.count("cat") == 1, ours.ops


# --- the loop's expressions, evaluated where the release evaluates them -----------------------

WATCHED = ("input_ids", "extend_lens", "extend_seq_lens")


def watched_batches(monkeypatch, limit=None):
    """Batches from the harness that count the reads of the loop's source
    and lengths (``batch.input_ids``, ``batch.extend_lens`` or
    ``batch.extend_seq_lens``); ``input_ids`` raises once read more than
    ``limit`` times."""
    reads = dict.fromkeys(WATCHED, 0)

    def watched(name):
        def get(self):
            reads[name] += 1
            if name == "input_ids" and limit is not None and reads[name] > limit:
                raise LookupError("batch.input_ids read where the release does not read it")
            return self.__dict__[name]

        def put(self, value):
            self.__dict__[name] = value

        return property(get, put)

    batch_type = type("WatchedBatch", (types.SimpleNamespace,), {n: watched(n) for n in WATCHED})
    make = draft_harness._batch
    monkeypatch.setattr(draft_harness, "_batch", lambda inputs: batch_type(**vars(make(inputs))))
    return reads


@pytest.mark.matrix
@pytest.mark.parametrize("lens", [[], [5]], ids=["no request", "one request"])
def test_where_the_release_loop_runs_its_expressions_are_read_as_the_release_reads_them(
    monkeypatch, lens
):
    """An empty batch (and one request, which the gather leaves to the
    release's loop): the loop's lengths are read once, and its source as
    often as the release reads it; a source that fails on any further read
    changes nothing."""
    inputs = make_inputs(lens, mm_width=2, seed=3)
    reads = watched_batches(monkeypatch)
    stock = outcome(inputs, STOCK)
    stock_reads = dict(reads)
    flatgather.sglang.install()
    assert rotation_in(current())
    reads.update(dict.fromkeys(WATCHED, 0))
    ours = outcome(inputs)
    assert_same_as_stock(inputs, ours, stock)
    assert reads == stock_reads
    reads = watched_batches(monkeypatch, limit=stock_reads["input_ids"])
    assert_same_as_stock(inputs, outcome(inputs), stock)


# --- compiled code and CUDA-graph capture ----------------------------------------------------


def rotation_args(device="cpu"):
    """Three requests of lengths 3, 1, 2: ids, lengths, tails, destination."""
    src = torch.arange(10, 16, device=device)
    tails = torch.tensor([7, 8, 9], device=device)
    return src, [3, 1, 2], tails, torch.zeros_like(src)


ROTATED = [11, 12, 7, 8, 15, 9]


def test_under_torch_compile_the_release_loop_is_traced():
    """Compiled, ``rotate`` hands over at once: no plan, no graph break."""
    src, lens, tails, dst = rotation_args()
    compiled = torch.compile(
        lambda s, t, d: draft_prefill.rotate(s, lens, t, d, None, None, 0),
        fullgraph=True,
        backend="eager",
    )
    assert compiled(src, tails, dst) is None
    assert not dst.any()  # untouched
    assert draft_prefill.rotate(src, lens, tails, dst, None, None, 0) == 6
    assert dst.tolist() == ROTATED


@pytest.mark.matrix
def test_the_installed_method_runs_the_release_loop_while_compiling(monkeypatch):
    inputs = make_inputs([2, 3, 1], mm_width=2, seed=5)
    stock = draft_harness.run(worker, inputs, STOCK, count=True)
    flatgather.sglang.install()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    ours = draft_harness.run(worker, inputs, count=True)
    assert_same_as_stock(inputs, ours, stock)
    assert ours.ops == stock.ops  # the release's own loop ran


def test_a_capturing_cuda_stream_does_not_concern_a_cpu_rotation(monkeypatch):
    """Only CUDA work is captured: on the CPU the gather applies as ever."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    src, lens, tails, dst = rotation_args()
    assert draft_prefill.rotate(src, lens, tails, dst, None, None, 0) == 6
    assert dst.tolist() == ROTATED


@pytest.mark.cuda
def test_while_a_cuda_stream_captures_the_release_loop_runs(monkeypatch):
    src, lens, tails, dst = rotation_args("cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        end = draft_prefill.rotate(src, lens, tails, dst, None, None, 0)
    assert end is None and not dst.any()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert draft_prefill.rotate(src, lens, tails, dst, None, None, 0) is None
    monkeypatch.undo()
    assert draft_prefill.rotate(src, lens, tails, dst, None, None, 0) == 6
    assert dst.tolist() == ROTATED


# --- one gather, whatever the batch size ------------------------------------------------------

OP_COUNTS: dict = {}


@pytest.mark.matrix
@pytest.mark.parametrize("batch", [1, 16, 256, 1024])
def test_installed_op_count_does_not_grow_with_batch(batch):
    """Non-view aten ops from the start of the method to ``init_new``."""
    inputs = make_inputs([3] * batch)
    stock = draft_harness.run(worker, inputs, STOCK, count=True).ops
    flatgather.sglang.install()
    ours = draft_harness.run(worker, inputs, count=True).ops
    OP_COUNTS[batch] = (len(stock), len(ours))
    print(f"B={batch}: stock {len(stock)} ops, installed {len(ours)} ({', '.join(ours)})")
    # The stock loop slices, concatenates and copies per request.
    assert stock.count("cat") == batch
    assert len(stock) >= 2 * batch
    if batch == 1:
        # One request keeps the release's loop: no more ops than stock.
        assert ours == stock
        return
    assert ours.count("cat") == 1 and ours.count("index_select") == 1
    assert len(ours) <= 4, ours
    with_mm = draft_harness.run(worker, make_inputs([3] * batch, mm_width=4), count=True).ops
    assert with_mm.count("index_select") == (2 if ROTATES_MM else 1)
    assert len(with_mm) <= 6, with_mm


# --- install and uninstall --------------------------------------------------------------------


@pytest.mark.matrix
def test_install_rewrites_the_method_and_uninstall_restores_the_very_function():
    report = flatgather.sglang.install()
    patched = current()
    assert WHERE in report.patched
    assert draft_prefill.MODULE not in report.pending
    assert not [n for n in report.notes if METHOD in n], report.notes
    assert patched is not STOCK and patched.__wrapped__ is STOCK
    # Still the release's method: its file, its line numbers, its signature.
    assert patched.__code__.co_filename == STOCK.__code__.co_filename
    assert patched.__code__.co_firstlineno == STOCK.__code__.co_firstlineno
    assert patched.__defaults__ == STOCK.__defaults__
    assert patched.__qualname__ == STOCK.__qualname__
    assert flatgather.sglang.install() == report  # idempotent
    assert current() is patched
    assert flatgather.sglang.uninstall()
    assert current() is STOCK
    flatgather.sglang.install()
    assert current() is not STOCK
    flatgather.sglang.uninstall()
    assert current() is STOCK


# --- refusals ---------------------------------------------------------------------------------


def _rotation_loop(method: ast.FunctionDef) -> ast.For:
    (loop,) = [
        n
        for n in ast.walk(method)
        if isinstance(n, ast.For)
        and isinstance(n.iter, ast.Call)
        and getattr(n.iter.func, "id", None) == "enumerate"
    ]
    return loop


def _change_a_constant(method: ast.FunctionDef) -> None:
    """``<tmp>[1:]`` becomes ``<tmp>[2:]``."""
    loop = _rotation_loop(method)
    (one,) = [
        n.lower
        for n in ast.walk(loop.body[1])
        if isinstance(n, ast.Slice) and isinstance(n.lower, ast.Constant) and n.lower.value == 1
    ]
    one.value = 2


def _read_the_length_after_the_loop(method: ast.FunctionDef) -> None:
    loop = _rotation_loop(method)
    (guard,) = [s for s in method.body if any(n is loop for n in ast.walk(s))]
    length = loop.target.elts[1].id
    read = ast.parse(f"flatgather_test_last = {length}").body[0]
    guard.body.append(read)


def _unchanged(method: ast.FunctionDef) -> None:
    pass


def module_with(edit, tmp_path: Path):
    """A module whose ``OWNER`` class holds the release's method, its
    syntax tree edited by ``edit``, importing what the release's module
    imports: a source file of its own, as ``parse_method`` needs."""
    path = Path(worker.__file__)
    tree = ast.parse(path.read_text(), str(path))
    imports = [
        stmt
        for stmt in tree.body
        if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(stmt))
    ]
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == OWNER]
    (method,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == METHOD]
    edit(method)
    cls.body, cls.bases, cls.keywords = [method], [], []
    name = f"flatgather_test_worker_{edit.__name__.strip('_')}"
    return module_from_tree(ast.Module([*imports, cls], []), tmp_path, name)


def rotation_in(function) -> bool:
    return any(name.startswith("flatgather_rotate") for name in function.__code__.co_freevars)


@pytest.mark.matrix
def test_a_faithful_copy_of_the_method_is_rewritten(tmp_path):
    """The control for the refusals below: the same module builder, no edit."""
    result = draft_prefill.PATCH.prepare(module_with(_unchanged, tmp_path))
    assert draft_prefill.ROTATION in result.applied, result.notes
    assert result.notes == ()


@pytest.mark.matrix
@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (_change_a_constant, "is neither"),
        (_read_the_length_after_the_loop, "which the loop binds"),
    ],
)
def test_a_loop_not_in_the_expected_shape_is_left_stock(edit, why, tmp_path):
    module = module_with(edit, tmp_path)
    original = vars(getattr(module, OWNER))[METHOD]
    result = draft_prefill.PATCH.prepare(module)
    assert draft_prefill.ROTATION not in result.applied
    (note,) = [n for n in result.notes if "rotation loop left stock" in n]
    assert why in note, note
    # The backport is independent of the loop.
    assert (draft_prefill.BACKPORT in result.applied) == (not DRAFT_NO_LOGPROB)
    for patch in result.swaps:
        assert not rotation_in(patch.new)
    assert vars(getattr(module, OWNER))[METHOD] is original  # prepare patches nothing


@pytest.mark.matrix
def test_a_source_file_edited_after_import_is_left_stock(tmp_path):
    """The file on disk no longer compiles to the code that runs: nothing
    is rewritten from it."""
    module = module_with(_unchanged, tmp_path)
    edit_after_import(module, OWNER, METHOD, _change_a_constant)
    result = draft_prefill.PATCH.prepare(module)
    assert result.swaps == [] and result.applied == ()
    (note,) = result.notes
    assert "does not compile to the code that runs" in note, note


@pytest.mark.matrix
def test_imports_inside_other_functions_do_not_disturb_the_check(tmp_path):
    """Only the module's own imports are compiled along with the method: a
    function elsewhere in the file that imports a name locally (the release's
    modules have many) changes nothing."""
    module = module_with(_unchanged, tmp_path)
    path = Path(module.__file__)
    text = path.read_text()
    helper = "def flatgather_test_helper():\n    import torch\n    return torch\n\n\n"
    path.write_text(helper + text)
    spec = importlib.util.spec_from_file_location(module.__name__ + "_helper", path)
    edited = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(edited)
    result = draft_prefill.PATCH.prepare(edited)
    assert draft_prefill.ROTATION in result.applied, result.notes


@pytest.mark.matrix
def test_a_gather_that_differs_from_the_release_is_caught_before_patching():
    real = draft_prefill.rotate

    def off_by_one(**kwargs):
        end = real(**kwargs)
        if end is not None:
            kwargs["dst"][0] += 1
        return end

    with mock.patch.object(draft_prefill, "rotate", off_by_one):
        result = draft_prefill.PATCH.prepare(worker)
    assert draft_prefill.ROTATION not in result.applied
    (note,) = result.notes
    assert "checked against the release's own loop" in note, note
    assert "locals.batch.input_ids.values" in note, note
    for patch in result.swaps:
        assert not rotation_in(patch.new)


@pytest.mark.matrix
def test_prepare_never_raises():
    broken = type(worker)("flatgather_test_broken")
    assert draft_prefill.PATCH.prepare(broken).notes == (
        f"{draft_prefill.MODULE} has no class {OWNER}: nothing patched there",
    )
    with mock.patch.object(draft_match, "find_loop", side_effect=RuntimeError("boom")):
        result = draft_prefill.PATCH.prepare(worker)
    assert result.swaps == []
    assert result.notes == (f"{draft_prefill.WHERE} left stock: RuntimeError: boom",)


# --- the return_logprob backport (SGLang PR #21589) -------------------------------------------


def logprob_stores(function) -> int:
    return sum(
        ins.opname == "STORE_ATTR" and ins.argval == "return_logprob"
        for ins in dis.get_instructions(function)
    )


@pytest.mark.matrix
def test_draft_forward_runs_without_logprob_once_installed():
    inputs = make_inputs([2, 3])
    stock = draft_harness.run(worker, inputs)
    # Before PR #21589 the draft forward inherits the target batch's logprobs.
    assert stock.return_logprob is (not DRAFT_NO_LOGPROB)
    report = flatgather.sglang.install()
    ours = draft_harness.run(worker, inputs)
    assert ours.return_logprob is False
    assert ours.target_return_logprob is True  # the target batch keeps its logprobs
    assert (draft_prefill.BACKPORT in report.backports) == (not DRAFT_NO_LOGPROB)
    # Inserted once where it is missing, never where the release has it.
    assert logprob_stores(current()) == logprob_stores(STOCK) + (not DRAFT_NO_LOGPROB)
    assert logprob_stores(current()) == 1


# --- eagle_worker_v2 imported after install() --------------------------------------------------


def test_patched_when_the_worker_module_is_imported_after_install():
    """install() must not import eagle_worker_v2 (it needs sgl_kernel): the
    rewrite lands the moment something imports it."""
    code = textwrap.dedent(
        f"""
        import importlib
        import sys
        import flatgather.sglang as fs
        from flatgather.bench import draft_harness as h
        from flatgather.testing import install_sgl_kernel_stand_in

        name = {draft_prefill.MODULE!r}
        report = fs.install()
        assert name not in sys.modules, "install() imported the worker module"
        assert name in report.pending, report
        install_sgl_kernel_stand_in()
        w = importlib.import_module(name)
        report = fs.installed_report()
        assert name not in report.pending and {WHERE!r} in report.patched, report
        seen = h.run(w, h.make_inputs([2, 3, 1]), count=True)
        assert seen.return_logprob is False, seen
        assert "index_select" in seen.ops, seen.ops
        print("lazy-ok")
        """
    )
    assert_prints(code, "lazy-ok")
