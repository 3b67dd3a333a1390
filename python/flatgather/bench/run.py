"""``python -m flatgather bench``: flatgather side by side with SGLang's own
``_get_pruned_states``, a NumPy anchor and the memory-copy bound."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

import flatgather
from flatgather import _core
from flatgather.bench import report
from flatgather.bench.cases import (
    GRIDS,
    Grid,
    Shape,
    gathered_bytes,
    lengths,
    make_inputs,
    make_numpy_anchor,
    memcpy_bound,
    numpy_indices,
)
from flatgather.bench.stats import Stats, host_clock, measure_side_by_side

VARIANTS = ("stock", "flatgather", "numpy", "memcpy")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m flatgather bench",
        description=(
            "Time LogitsProcessor._get_pruned_states (logprob prefill branch) of the SGLang "
            "on sys.path against flatgather installed, a NumPy-vectorised anchor and a plain "
            "contiguous copy of the same bytes, side by side on the same tensors."
        ),
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a few shapes, seconds")
    size.add_argument("--full", action="store_true", help="the whole grid (many minutes)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--samples", type=int, help="samples per variant (grid default)")
    parser.add_argument("--json", type=Path, help="write every statistic here")
    parser.add_argument("--plot", type=Path, help="write a PNG: speed-up vs batch size")
    parser.add_argument(
        "--markdown", type=Path, help="write a Markdown report (e.g. docs/benchmarks.md)"
    )
    return parser.parse_args(argv)


class Progress:
    """One line on stderr, redrawn in place on a terminal."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.started = total, 0, time.perf_counter()
        self.tty = sys.stderr.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        width = 30
        filled = width * self.done // self.total
        elapsed = time.perf_counter() - self.started
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"{elapsed:5.1f}s  {label}"
        )
        if self.tty:
            sys.stderr.write("\r" + line[:120].ljust(120))
            if self.done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


class CountOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def aten_ops(fn) -> int:
    with CountOps() as counter:
        fn()
    return counter.count


def cuda_clock(fn, k: int) -> float:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(k):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / k


def kernel_launches(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def load_sglang():
    try:
        from sglang.srt.layers import logits_processor as lp
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
    except ImportError as exc:
        sys.exit(
            f"flatgather bench needs SGLang on sys.path ({exc}). After .ci/setup: "
            "PYTHONPATH=.sglang/0.5.23 .venv/bin/python -m flatgather bench"
        )
    return lp, ForwardMode


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
        )
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def versions() -> dict:
    from flatgather.sglang import sglang_release

    return {
        "flatgather": flatgather.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "sglang": sglang_release(),
        "python": platform.python_version(),
    }


def machine(device: torch.device) -> dict:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def bench_shapes(grid: Grid, shapes: list[Shape], device, fns_for, progress, samples) -> list:
    rows = []
    clock = cuda_clock if device.type == "cuda" else host_clock
    for shape in shapes:
        inputs = make_inputs(shape, grid.max_tokens, device)
        fns, num_pruned = fns_for(inputs)
        stats = measure_side_by_side(
            fns,
            samples=samples,
            warmup_s=grid.warmup_s,
            sample_s=grid.sample_s,
            clock=clock,
        )
        row = {
            "shape": shape.to_dict(),
            "family": shape.family,
            "tokens": inputs.tokens,
            "pruned": num_pruned,
            "gathered_bytes": gathered_bytes(inputs, num_pruned),
            "time": {k: v.to_dict() for k, v in stats.items()},
            "aten_ops": {k: aten_ops(fns[k]) for k in ("stock", "flatgather")},
        }
        if device.type == "cuda":
            host = measure_side_by_side(
                {k: fns[k] for k in ("stock", "flatgather")},
                samples=samples,
                warmup_s=grid.warmup_s,
                sample_s=grid.sample_s,
            )
            row["host_time"] = {k: v.to_dict() for k, v in host.items()}
            row["kernel_launches"] = {k: kernel_launches(fns[k]) for k in ("stock", "flatgather")}
        rows.append(row)
        progress.step(f"B={shape.batch} tokens={inputs.tokens} {shape.family}")
        del inputs, fns
    return rows


def bench_plans(grid: Grid, lp, md_for, stock, progress, samples) -> list:
    """Index plan alone: Rust, SGLang's loop, NumPy (no tensor data)."""
    rows = []
    for mean in grid.mean_extends:
        for b in grid.batches:
            extend, start = lengths(Shape(b, mean, 1, "bf16", 0, "none"), grid.max_tokens)
            tokens = sum(extend)
            empty = torch.empty(tokens, 0)
            md = md_for(extend, start)

            def rust(extend=extend, start=start, tokens=tokens):
                plan = _core.Plan(extend, start, tokens)
                plan.fill(np.empty(plan.buffer_len(False), dtype=np.int64), False)

            fns = {
                "flatgather": rust,
                "stock_loop": lambda md=md, empty=empty: stock(None, empty, None, None, md),
                "numpy": lambda extend=extend, start=start: numpy_indices(extend, start),
            }
            stats = measure_side_by_side(
                fns, samples=samples, warmup_s=grid.warmup_s, sample_s=grid.sample_s
            )
            rows.append(
                {
                    "batch": b,
                    "mean_extend": mean,
                    "tokens": tokens,
                    "time": {k: v.to_dict() for k, v in stats.items()},
                }
            )
            progress.step(f"plan B={b} tokens={tokens}")
    return rows


def binding_fixed_cost(samples: int) -> dict:
    out = np.empty(8, dtype=np.int64)
    one, zero = [1], [0]

    def call():
        _core.Plan(one, zero, 1).fill(out, False)

    stats: Stats = measure_side_by_side(
        {"binding": call}, samples=samples, warmup_s=0.05, sample_s=0.01
    )["binding"]
    return stats.to_dict()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    name = "quick" if args.quick else "full" if args.full else "default"
    grid = GRIDS[name]
    samples = args.samples or grid.samples
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device is available")

    lp, forward_mode = load_sglang()
    import flatgather.sglang as fs
    from flatgather.sglang._contracts import contract_for

    release = fs.sglang_release()
    contract = contract_for(release, force=True)
    raw = vars(lp.LogitsProcessor)["_get_pruned_states"]
    stock = getattr(raw, "__wrapped__", raw) if hasattr(raw, "__flatgather__") else raw
    fs.uninstall()
    fs.install(force=True)
    ours = lp.LogitsProcessor._get_pruned_states
    anchor = make_numpy_anchor(contract.writes_cpu_indices, contract.trailing_token_to_seq)

    def md_for(extend, start):
        return lp.LogitsMetadata(
            forward_mode=forward_mode.EXTEND,
            extend_return_logprob=True,
            extend_seq_lens_cpu=extend,
            extend_logprob_start_lens_cpu=start,
        )

    def fns_for(inputs):
        h, aux = inputs.hidden, inputs.aux
        mds = {k: md_for(inputs.extend, inputs.start) for k in ("stock", "flatgather", "numpy")}
        calls = {
            "stock": lambda: stock(None, h, None, aux, mds["stock"]),
            "flatgather": lambda: ours(None, h, None, aux, mds["flatgather"]),
            "numpy": lambda: anchor(None, h, None, aux, mds["numpy"]),
        }
        results = {k: fn() for k, fn in calls.items()}
        # Nothing is timed that does not compute the stock result (0.5.10's
        # stock drops list aux layers, so those are compared among the others).
        for k in ("flatgather", "numpy"):
            a, b = results[k], results["stock"]
            if "aux-logprob-prune" in contract.backports and isinstance(aux, list):
                a, b = (*a[:2], *a[3:]), (*b[:2], *b[3:])
            if not same(a, b):
                raise SystemExit(f"{k} differs from stock on {inputs.tokens} tokens: bug")
        num_pruned = results["flatgather"][0].shape[0]
        return {**calls, "memcpy": memcpy_bound(inputs, num_pruned)}, num_pruned

    shapes = grid.shapes(contract.packed_aux)
    plan_count = len(grid.batches) * len(grid.mean_extends)
    progress = Progress(len(shapes) + plan_count)
    started = time.perf_counter()
    shape_rows = bench_shapes(grid, shapes, device, fns_for, progress, samples)
    plan_rows = bench_plans(grid, lp, md_for, stock, progress, samples)
    results = {
        "command": "python -m flatgather bench "
        + shlex.join(sys.argv[2:] if argv is None else argv),
        "grid": name,
        "samples": samples,
        "seconds": round(time.perf_counter() - started, 1),
        "versions": versions(),
        "machine": machine(device),
        "shapes": shape_rows,
        "plans": plan_rows,
        "binding_fixed_cost": binding_fixed_cost(samples),
    }
    fs.uninstall()
    print(report.table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
        print(f"wrote {args.json}")
    if args.plot:
        report.plot(results, args.plot)
        print(f"wrote {args.plot}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(report.markdown(results))
        print(f"wrote {args.markdown}")
    return 0
