"""The install-time check of the rewritten
``EagleDraftWorker._draft_extend_for_prefill``, before anything is patched:
the release's block (the method's statements up to the one holding the
rotation loop) and the rewritten block are compiled on their own and run side
by side on small CPU batches (one request, lengths of one, several requests,
a chunked request, padding and zero lengths that must fall back, an idle
batch, with and without ``mm_input_embeds``). A difference in the ids, in
the ``mm_input_embeds`` rows the release defines, or in which tensor object
ends up where (in place or new) is reported, and so is a case where the
gather should apply and does not. It costs a few milliseconds.

Where the check sits in the patch is told in
:mod:`flatgather.sglang.patches.draft_prefill`.
"""

from __future__ import annotations

import ast
import types
from dataclasses import dataclass

import torch

from flatgather.sglang import source
from flatgather.sglang.patches.draft_prefill.match import Loop, top_index
from flatgather.sglang.patches.draft_prefill.rewrite import Names

__all__ = ["blocks", "probe_inputs", "verify"]


# (extend lengths, index of the chunked request or None, rows past the tokens,
# whether the gather must apply): the last two go to the release's loop.
_CASES = (
    ([5], None, 0, False),  # one request: the release's loop is as cheap
    ([1, 1, 1], None, 0, True),  # lengths of one: nothing but the tails
    ([3, 1, 4, 2], None, 0, True),
    ([3, 4, 2], 1, 0, True),  # a chunked request: its tail is its next prompt token
    ([2, 3], None, 2, False),  # rows past the tokens
    ([2, 0, 3], None, 0, False),  # a request of length zero
)
_NEXT_PROMPT_TOKEN = 977
# (ids, tails): as SGLang has them, tails as the sampler returns them, and the reverse.
_DTYPES = ((torch.int64, torch.int64), (torch.int64, torch.int32), (torch.int32, torch.int64))


class _ProbeBatch(types.SimpleNamespace):
    """What the block reads of a batch (``ScheduleBatch`` or
    ``ModelWorkerBatch``), under both names the releases give the lengths."""


class _Counting:
    """``rotate``, counting the calls where the gather applied."""

    def __init__(self, rotate) -> None:
        self.rotate = rotate
        self.applied = 0

    def __call__(self, **kwargs):
        end = self.rotate(**kwargs)
        self.applied += end is not None
        return end


def _block_function(method: source.Method, body: list[ast.stmt], closure: dict):
    """``body`` (the method's first statements) compiled as a function of the
    method's parameters that returns its locals, with the module's globals.

    As :func:`flatgather.sglang.source.build_method` compiles (both by
    :func:`~flatgather.sglang.source.compile_def`), minus what only the
    bytecode comparison needs (the module's imports) and minus the
    parameters' annotations and defaults (every argument is passed): a
    fraction of the cost, the same behaviour.
    """
    params = [ast.arg(a.arg) for a in (*method.tree.args.posonlyargs, *method.tree.args.args)]
    block = ast.FunctionDef(
        name=method.name,
        args=ast.arguments(posonlyargs=[], args=params, kwonlyargs=[], kw_defaults=[], defaults=[]),
        # Shared, not copied: compiling leaves a tree as it is.
        body=[*body, ast.Return(ast.Call(ast.Name("locals", ast.Load()), [], []))],
        decorator_list=[],
    )
    return source.compile_def(method, ast.copy_location(block, method.tree), closure)


def blocks(method: source.Method, rewritten: ast.FunctionDef, k: int, branch, closure: dict):
    """The release's block (its statements up to the ``k``-th, which holds
    the loop) and the rewritten one (up to ``branch``, the call of the gather
    and its fallback), each compiled by :func:`_block_function`."""
    stock = _block_function(method, method.tree.body[: k + 1], {})
    ours = _block_function(method, rewritten.body[: top_index(rewritten, branch) + 1], closure)
    return stock, ours


def probe_inputs(lens, chunked, pad, mode, with_mm, dtypes, seed):
    """A probe case's batch, tails and ``mm_input_embeds`` (or None), and the
    input objects by the names the check reports them under."""
    gen = torch.Generator().manual_seed(seed)
    rows = sum(lens) + pad
    reqs = [object() for _ in lens]
    batch = _ProbeBatch(
        forward_mode=mode,
        input_ids=torch.randint(0, 1000, (rows,), generator=gen).to(dtypes[0]),
        extend_lens=list(lens),
        extend_seq_lens=list(lens),
        seq_lens=torch.tensor(lens, dtype=torch.int64),
        reqs=reqs,
        chunked_req=None if chunked is None else reqs[chunked],
        chunked_req_next_prompt_token=None if chunked is None else _NEXT_PROMPT_TOKEN,
        return_logprob=True,
    )
    tails = torch.randint(1000, 2000, (len(lens),), generator=gen).to(dtypes[1])
    embeds = torch.randn(rows, 3, generator=gen) if with_mm else None
    objects = {"batch.input_ids": batch.input_ids, "next_token_ids": tails}
    objects |= {f"batch.reqs[{i}]": r for i, r in enumerate(reqs)}
    if embeds is not None:
        objects["mm_input_embeds"] = embeds
    return batch, tails, embeds, objects


def _snapshot(value, objects: dict, mask: torch.Tensor | None = None):
    """``value`` in terms :func:`first_difference` compares across runs: an
    input object by its name, a new tensor by its bytes (only the rows of
    ``mask``), a batch by its attributes."""
    name = next((k for k, v in objects.items() if v is value), None)
    if isinstance(value, torch.Tensor):
        if name is None and mask is not None and value.shape[:1] == mask.shape:
            value = value[mask]
        return {"object": name or "new", "values": value.detach().clone()}
    if name is not None:
        return name
    if isinstance(value, types.SimpleNamespace):
        return {k: _snapshot(v, objects) for k, v in vars(value).items()}
    if isinstance(value, (list, tuple)):
        return [_snapshot(v, objects) for v in value]
    return value


@dataclass(frozen=True)
class Rewritten:
    """The rotation loop rewritten, as :func:`verify` checks it."""

    loop: Loop
    tree: ast.FunctionDef
    """The method's tree after
    :func:`~flatgather.sglang.patches.draft_prefill.rewrite.replace_loop`."""
    k: int
    """The index of the statement of the release's body that holds ``loop``."""
    branch: ast.If
    """What ``replace_loop`` returned."""
    names: Names
    closure: dict
    """What the rewritten method will call by ``names``: the very functions
    checked here."""


def verify(method: source.Method, rewritten: Rewritten) -> str | None:
    """None when the rewritten block does what the release's does on every
    probe case (and the gather applies where it should); else what differs."""
    loop, k, branch, names, closure = (
        rewritten.loop,
        rewritten.k,
        rewritten.branch,
        rewritten.names,
        rewritten.closure,
    )
    rewritten = rewritten.tree
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from flatgather.sglang.compare import first_difference

    tree = method.tree
    a = tree.args
    params = [arg.arg for arg in (*a.posonlyargs, *a.args)]
    if a.vararg or a.kwonlyargs or a.kwarg or params[:1] != ["self"]:
        return "the method's parameters are not plain positional ones after self"
    if not {"batch", "next_token_ids"} <= set(params):
        return f"the method's parameters {params} lack batch or next_token_ids"
    counting = _Counting(closure[names.rotate])
    stock, ours = blocks(method, rewritten, k, branch, {**closure, names.rotate: counting})
    live = {
        n.id
        for stmt in tree.body[k + 1 :]
        for n in ast.walk(stmt)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    rotated = {loop.local("MM"), loop.local("MM_DST")} - {None} if loop.rotates_mm else set()
    # Each case once, mm_input_embeds present in every other one; where the
    # loop rotates them, every case the gather takes both with and without.
    runs = [
        (case, ForwardMode.EXTEND, with_mm, _DTYPES[n % len(_DTYPES)])
        for n, case in enumerate(_CASES)
        for with_mm in ((False, True) if loop.rotates_mm and case[3] else (n % 2 == 1,))
    ]
    runs.append((([2, 2], None, 0, False), ForwardMode.IDLE, True, _DTYPES[0]))
    applied = 0
    for seed, (case, mode, with_mm, dtypes) in enumerate(runs):
        lens, chunked, pad, gathers = case
        where = (
            f"the {mode.name} batch of lengths {lens}"
            f"{', one chunked' if chunked is not None else ''}"
            f"{f', {pad} rows past the tokens' if pad else ''}, "
            f"{'with' if with_mm else 'no'} mm_input_embeds, ids {dtypes[0]}, tails {dtypes[1]}"
        )
        mask = torch.ones(sum(lens) + pad, dtype=torch.bool)
        mask[torch.tensor(lens).cumsum(0) - 1] = False  # each request's last row: unwritten
        outcomes = []
        for fn in (stock, ours):
            batch, tails, embeds, objects = probe_inputs(*case[:3], mode, with_mm, dtypes, seed)
            args = dict.fromkeys(params)
            args.update(self=types.SimpleNamespace(), batch=batch, next_token_ids=tails)
            if "mm_input_embeds" in args:
                args["mm_input_embeds"] = embeds
            try:
                result = fn(*args.values())
            except Exception as exc:  # compared by type: the same failure, or none
                if fn is stock and gathers:
                    return f"the release's own block fails on {where}: {exc!r}"
                outcomes.append({"raised": type(exc).__name__})
                continue
            seen = {
                name: _snapshot(result[name], objects, mask if name in rotated else None)
                for name in sorted(live & result.keys())
            }
            seen["inputs afterwards"] = {
                name: _snapshot(obj, {})
                for name, obj in objects.items()
                if isinstance(obj, torch.Tensor)
            }
            outcomes.append(seen)
        found = first_difference(outcomes[1], outcomes[0], "locals")
        if found:
            return f"on {where}: {found}"
        if gathers and mode == ForwardMode.EXTEND:
            applied += 1
            if counting.applied != applied:
                return f"the gather did not apply on {where}"
    return None
