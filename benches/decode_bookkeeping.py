"""What the scheduler's per-token logprob bookkeeping of a decode step costs,
measured without a profiler: the release's own ``_apply_decode_logprobs``
(the batch result processor's, 0.5.13 on), called as the release's decode
loop calls it, once per request and step, against the same loop without it.

    PYTHONPATH=$PWD/.sglang/0.5.23 .venv/bin/python benches/decode_bookkeeping.py

Why it is here: the engine bench's cProfile round puts this function at
0.33 ms a request at 256 running (six ``append`` calls per request and step,
each of which the profiler times), the largest logprob item in the
scheduler's step that flatgather leaves stock. A profiler's cost per call
inflates exactly such code, so before a patch is built for it, this times
it by the thread's CPU clock alone: if removing it whole cannot save a
measurable part of what a request costs, it is not the next target.

The stand-ins hold what the function reads: a batch of ``--requests``
requests, each asking for the top 5 and 3 token ids (the engine bench's
shape), the step's values already host lists (what the release's
``_normalize_decode_outputs`` hands it). Every sample makes fresh requests,
runs ``--steps`` steps (the engine bench's requests decode 16 to 32 tokens)
with the collector off, the two sides interleaved; each figure is the
median over samples.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
import types

TOP, TOKEN_IDS, VOCAB = 5, (1, 2, 3), 384


class _Logprobs:
    """A request's output-logprob lists, as the release's ``req.logprob``
    holds them."""

    def __init__(self) -> None:
        self.output_token_logprobs_val: list = []
        self.output_token_logprobs_idx: list = []
        self.output_top_logprobs_val: list = []
        self.output_top_logprobs_idx: list = []
        self.output_token_ids_logprobs_val: list = []
        self.output_token_ids_logprobs_idx: list = []
        self.top_logprobs_num = TOP
        self.token_ids_logprob = list(TOKEN_IDS)


class _Request:
    def __init__(self) -> None:
        self.logprob = _Logprobs()


def _step_values(n: int, rng: random.Random):
    """One step's values for ``n`` requests, as host lists."""
    output = types.SimpleNamespace(
        next_token_top_logprobs_val=[[-rng.random() for _ in range(TOP)] for _ in range(n)],
        next_token_top_logprobs_idx=[[rng.randrange(VOCAB) for _ in range(TOP)] for _ in range(n)],
        next_token_token_ids_logprobs_val=[[-rng.random() for _ in TOKEN_IDS] for _ in range(n)],
        next_token_token_ids_logprobs_idx=[list(TOKEN_IDS) for _ in range(n)],
    )
    logprobs = [-rng.random() for _ in range(n)]
    ids = [rng.randrange(VOCAB) for _ in range(n)]
    return output, logprobs, ids


def _token_form(function, batch, output, logprobs, ids):
    """How the release's function takes a request's token: a one-token list
    (0.5.15 on) or the id itself; None if neither gives the request its
    token."""
    for form in ([ids[0]], ids[0]):
        req = _Request()
        function(
            None,
            req=req,
            i=0,
            batch=batch,
            next_token_id=form,
            next_token_logprobs=logprobs,
            logits_output=output,
        )
        got = req.logprob
        if (
            got.output_token_logprobs_idx == [ids[0]]
            and got.output_token_logprobs_val == [logprobs[0]]
            and got.output_top_logprobs_idx == [output.next_token_top_logprobs_idx[0]]
            and got.output_token_ids_logprobs_val == [output.next_token_token_ids_logprobs_val[0]]
        ):
            return type(form)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    try:
        from sglang.srt.managers.scheduler_components import batch_result_processor
    except ModuleNotFoundError:
        print("this SGLang has no batch result processor (before 0.5.13)", file=sys.stderr)
        return 1
    import sglang

    owner = batch_result_processor.SchedulerBatchResultProcessor
    function = vars(owner).get("_apply_decode_logprobs")
    if function is None:
        print(f"SGLang {sglang.__version__} has no _apply_decode_logprobs", file=sys.stderr)
        return 1
    batch = types.SimpleNamespace(
        spec_algorithm=types.SimpleNamespace(is_none=lambda: True), is_spec_v2=False
    )
    rng = random.Random(0)
    output, logprobs, ids = _step_values(args.requests, rng)
    form = _token_form(function, batch, output, logprobs, ids)
    if form is None:
        print("the release's function did not give a stand-in request its token", file=sys.stderr)
        return 1
    tokens = [[t] for t in ids] if form is list else ids

    def release(reqs):
        for i, req in enumerate(reqs):
            function(
                None,
                req=req,
                i=i,
                batch=batch,
                next_token_id=tokens[i],
                next_token_logprobs=logprobs,
                logits_output=output,
            )

    def loop_alone(reqs):
        for _i, _req in enumerate(reqs):
            pass

    load = os.getloadavg()[0]
    sides = {"the release's bookkeeping": release, "the loop alone": loop_alone}
    samples: dict[str, list[float]] = {name: [] for name in sides}
    enabled = gc.isenabled()
    gc.disable()
    try:
        for sample in range(args.samples):
            order = list(sides) if sample % 2 == 0 else list(reversed(sides))
            for name in order:
                reqs = [_Request() for _ in range(args.requests)]
                start = time.thread_time_ns()
                for _ in range(args.steps):
                    sides[name](reqs)
                spent = time.thread_time_ns() - start
                samples[name].append(spent / args.steps / args.requests / 1e3)
    finally:
        if enabled:
            gc.enable()

    print(
        f"SGLang {sglang.__version__}: {args.requests} requests (top {TOP}, {len(TOKEN_IDS)} "
        f"token ids), {args.steps} decode steps, {args.samples} samples, torch threads 1"
    )
    medians = {name: statistics.median(v) for name, v in samples.items()}
    for name, value in medians.items():
        print(f"  {name}: {value:.3f} us a request and step")
    extra = medians["the release's bookkeeping"] - medians["the loop alone"]
    print(f"  the bookkeeping over {args.steps} steps: {extra * args.steps / 1e3:.4f} ms a request")
    if load > 0.5:
        print(f"warning: the machine was busy before the run (load average {load:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
