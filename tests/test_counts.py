"""The bench's host-sync count (flatgather.bench.counts.HostSyncs): what it
counts and what it leaves out, that it leaves torch as it found it, and
that it sees the release's own blocking host-to-device copies."""

from __future__ import annotations

import ast
import inspect
import textwrap

import flatgather.sglang
import pytest
import torch
from _sglang import STOCK_PRUNED_STATES, pruned_states
from flatgather.bench.batches import make_states, metadata
from flatgather.bench.counts import HostSyncs, host_syncs


def _counted(fn) -> dict:
    with HostSyncs() as syncs:
        fn()
    return dict(syncs.calls)


def test_reads_on_the_host_count():
    t = torch.arange(4)
    assert _counted(lambda: (t.tolist(), t[1].item(), t.tolist())) == {"tolist": 2, "item": 1}


def test_host_data_made_on_a_device_counts():
    """On a GPU ``torch.tensor(list, device=x.device)`` is a blocking copy
    (0.5.10's index sets); on a CPU run ``x.device`` is the CPU, and the call
    counts as the one a server makes."""
    x = torch.zeros(2)
    assert _counted(lambda: torch.tensor([1, 2], device=x.device, dtype=torch.int64)) == {
        "tensor": 1
    }
    assert _counted(lambda: torch.as_tensor([1, 2], device=x.device)) == {"as_tensor": 1}


def test_what_does_not_wait_is_not_counted():
    x = torch.zeros(2)

    def calls():
        torch.tensor([1, 2])  # made on the host
        torch.tensor([1, 2], device="cpu")  # the host by name
        torch.as_tensor(x, device=x.device)  # a tensor already: no copy of host data
        # The release's pinned and pageable uploads: non-blocking.
        torch.tensor([1, 2], dtype=torch.long, pin_memory=False).to(x.device, non_blocking=True)
        x.to(torch.float64)  # a dtype, no device
        x.to("cpu")  # nothing crosses on a CPU run
        x.cpu()
        torch.empty(2).copy_(x)
        torch.zeros(1).sum()

    assert _counted(calls) == {}


def test_torch_is_left_as_it_was_even_after_a_failure():
    before_tensor = dict(vars(torch.Tensor))
    before = {name: getattr(torch, name) for name in ("tensor", "as_tensor")}
    with pytest.raises(RuntimeError), HostSyncs():
        torch.tensor([1]).tolist()
        raise RuntimeError("inside")
    assert dict(vars(torch.Tensor)) == before_tensor
    assert {name: getattr(torch, name) for name in before} == before
    assert host_syncs(lambda: torch.tensor([1.0]).item()) == 1


def _device_tensor_calls() -> list[ast.Call]:
    """The ``torch.tensor(..., device=...)`` calls of the release's
    ``_get_pruned_states`` source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(STOCK_PRUNED_STATES)))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) == "torch.tensor"
        and any(k.arg == "device" for k in node.keywords)
    ]


@pytest.mark.matrix
def test_the_release_s_blocking_uploads_are_host_syncs():
    """The release's logprob branch up to 0.5.11 makes its index sets with
    ``torch.tensor(list, device=...)``, a blocking copy on a GPU, once each
    per call: the stock count has one sync per such call, flatgather's
    none (its index sets are staged and copied without blocking)."""
    extend = [5, 3, 7, 4] * 4
    start = [min(i % 6, e) for i, e in enumerate(extend)]
    states = make_states(extend, 0, torch.float32, 8, True, "list", 2, 0)
    md = metadata(extend, start)
    stock = _counted(lambda: pruned_states(*states, md))
    expected = len(_device_tensor_calls())
    assert stock.get("tensor", 0) == expected and sum(stock.values()) == expected, stock
    flatgather.sglang.install()
    assert _counted(lambda: pruned_states(*states, metadata(extend, start))) == {}


@pytest.mark.cuda
def test_blocking_copies_between_host_and_device_count():
    d = torch.arange(4, device="cuda")
    h = torch.arange(4)
    pinned = torch.empty(4, dtype=h.dtype, pin_memory=True)

    def calls():
        h.to("cuda")  # blocking upload
        h.cuda()
        d.cpu()  # blocking download
        d.to("cpu")
        h.clone().copy_(d)
        torch.tensor([1, 2], device="cuda")
        # Not: non-blocking, or nothing crosses.
        h.to("cuda", non_blocking=True)
        pinned.copy_(d, non_blocking=True)
        d.to("cpu", non_blocking=True)
        d.to(d.device)
        d.clone()

    assert _counted(calls) == {"to": 2, "cuda": 1, "cpu": 1, "copy_": 1, "tensor": 1}
