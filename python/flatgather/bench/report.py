"""Tables, Markdown and a plot from the benchmark's results (a plain dict,
as written by ``--json``), so a report can be regenerated from a saved run."""

from __future__ import annotations

from pathlib import Path


def _ms(stats: dict) -> str:
    return f"{stats['median'] * 1e3:.3f}"


def _us(stats: dict) -> str:
    return f"{stats['median'] * 1e6:.1f}"


def _ratio(num: dict, den: dict) -> str:
    """Ratio of medians, with the interval from the two 95% intervals."""
    r = num["median"] / den["median"]
    lo, hi = num["low"] / den["high"], num["high"] / den["low"]
    return f"{r:.2f} [{lo:.2f}-{hi:.2f}]"


def shape_rows(results: dict) -> list[list[str]]:
    rows = []
    for row in results["shapes"]:
        t = row["time"]
        s = row["shape"]
        rows.append(
            [
                str(s["batch"]),
                str(row["tokens"]),
                str(row["pruned"]),
                row["family"].rsplit(" ext~", 1)[0],
                f"{row['gathered_bytes'] / 2**20:.1f}",
                _ms(t["stock"]),
                _ms(t["flatgather"]),
                _ms(t["numpy"]),
                _ms(t["memcpy"]),
                _ratio(t["stock"], t["flatgather"]),
                _ratio(t["numpy"], t["flatgather"]),
                _ratio(t["flatgather"], t["memcpy"]),
                f"{row['aten_ops']['stock']}/{row['aten_ops']['flatgather']}",
            ]
        )
    return rows


SHAPE_HEADER = [
    "B",
    "tokens",
    "pruned",
    "tensors",
    "MiB",
    "stock ms",
    "flatgather ms",
    "numpy ms",
    "memcpy ms",
    "stock/fg",
    "numpy/fg",
    "fg/memcpy",
    "aten ops stock/fg",
]

PLAN_HEADER = ["B", "tokens", "flatgather µs", "stock loop µs", "numpy µs", "loop/fg", "numpy/fg"]


def plan_rows(results: dict) -> list[list[str]]:
    rows = []
    for row in results["plans"]:
        t = row["time"]
        rows.append(
            [
                str(row["batch"]),
                str(row["tokens"]),
                _us(t["flatgather"]),
                _us(t["stock_loop"]),
                _us(t["numpy"]),
                _ratio(t["stock_loop"], t["flatgather"]),
                _ratio(t["numpy"], t["flatgather"]),
            ]
        )
    return rows


def targets(results: dict) -> list[tuple[str, bool, str]]:
    """The speed targets, each judged on this run's own figures."""
    shapes = results["shapes"]

    def ratio(row, a, b):
        return row["time"][a]["median"] / row["time"][b]["median"]

    out = []
    b256 = [ratio(r, "stock", "flatgather") for r in shapes if r["shape"]["batch"] == 256]
    if b256:
        out.append(
            (
                "_get_pruned_states >= 6x stock at B=256",
                min(b256) >= 6,
                f"{min(b256):.2f}x to {max(b256):.2f}x",
            )
        )
    anchor = [ratio(r, "numpy", "flatgather") for r in shapes]
    out.append(
        (
            ">= 1.2x the numpy anchor at every shape",
            min(anchor) >= 1.2,
            f"{min(anchor):.2f}x to {max(anchor):.2f}x",
        )
    )
    b1 = [ratio(r, "stock", "flatgather") for r in shapes if r["shape"]["batch"] == 1]
    if b1:
        out.append(("never slower than stock at B=1", min(b1) >= 1.0, f"min {min(b1):.2f}x"))
    plans = results["plans"]
    big = [p for p in plans if p["tokens"] >= 30000]
    if big:
        r = [p["time"]["stock_loop"]["median"] / p["time"]["flatgather"]["median"] for p in big]
        out.append(("plan >= 100x SGLang's loop at >= 30k tokens", min(r) >= 100, f"{min(r):.0f}x"))
    small = [p for p in plans if p["batch"] <= 64]
    if small:
        r = [p["time"]["numpy"]["median"] / p["time"]["flatgather"]["median"] for p in small]
        out.append(("plan >= 4x numpy at B <= 64", min(r) >= 4, f"min {min(r):.1f}x"))
    fixed = results["binding_fixed_cost"]["median"] * 1e6
    out.append(("binding fixed cost <= 2 µs", fixed <= 2, f"{fixed:.2f} µs"))
    largest = max(r["gathered_bytes"] for r in shapes)
    top = [r for r in shapes if r["gathered_bytes"] >= largest / 2]
    r = [ratio(x, "flatgather", "memcpy") for x in top]
    out.append(
        (
            "largest shapes within 1.3x of the memory-copy bound",
            max(r) <= 1.3,
            f"{min(r):.2f}x to {max(r):.2f}x",
        )
    )
    return out


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def table(results: dict) -> str:
    v, m = results["versions"], results["machine"]
    head = (
        f"flatgather {v['flatgather']}  sglang {v['sglang']}  torch {v['torch']}  "
        f"device {m['device']}  torch threads {m['torch_threads']}  "
        f"({results['samples']} samples per variant, medians, ratios with 95% intervals)"
    )
    parts = [head, "", _text_table(SHAPE_HEADER, shape_rows(results)), ""]
    parts += ["index plan alone:", _text_table(PLAN_HEADER, plan_rows(results)), ""]
    parts.append(f"binding fixed cost: {results['binding_fixed_cost']['median'] * 1e6:.2f} µs")
    parts += ["", "targets:"]
    parts += [
        f"  [{'met' if ok else 'NOT met'}] {name}: {got}" for name, ok, got in targets(results)
    ]
    return "\n".join(parts)


def markdown(results: dict) -> str:
    v, m = results["versions"], results["machine"]
    lines = [
        "# Benchmarks",
        "",
        "Generated by the command below from one run; every ratio compares figures measured",
        "side by side in that run (samples of the variants interleaved, same tensors).",
        "",
        "```",
        results["command"],
        "```",
        "",
        f"- flatgather {v['flatgather']}, SGLang {v['sglang']}, torch {v['torch']}, "
        f"numpy {v['numpy']}, Python {v['python']}",
        f"- {m['platform']}, {m['cpu_count']} CPUs, torch threads {m['torch_threads']}, "
        f"device `{m['device']}`" + (f" ({m['gpu']})" if "gpu" in m else ""),
        f"- grid `{results['grid']}`, {results['samples']} samples per variant, "
        f"{results['seconds']} s in all",
        "",
        "Variants: **stock** is SGLang's own `LogitsProcessor._get_pruned_states` (logprob",
        "prefill branch); **fg** is flatgather installed; **numpy** is a NumPy-vectorised index",
        "plus one `index_select` per tensor; **memcpy** is a contiguous copy of the same bytes",
        "into fresh tensors (the bound). Times are medians per call; ratios are ratios of",
        "medians with the interval spanned by the two 95% bootstrap intervals.",
        "",
        "## `_get_pruned_states`",
        "",
        _md_table(SHAPE_HEADER, shape_rows(results)),
        "",
        "## Index plan alone",
        "",
        "flatgather: `Plan(...)` and `fill` into a fresh array. stock loop: SGLang's own",
        "function on a zero-width `hidden_states` (its Python loop, slicing nothing).",
        "numpy: the anchor's index computation.",
        "",
        _md_table(PLAN_HEADER, plan_rows(results)),
        "",
        f"Binding fixed cost (`Plan([1], [0], 1).fill(...)`): "
        f"{results['binding_fixed_cost']['median'] * 1e6:.2f} µs.",
        "",
        "## Targets",
        "",
        "| target | met | this run |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {'yes' if ok else 'no'} | {got} |" for name, ok, got in targets(results)]
    lines.append("")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families: dict[str, list[tuple[int, float]]] = {}
    for row in results["shapes"]:
        t = row["time"]
        speedup = t["stock"]["median"] / t["flatgather"]["median"]
        families.setdefault(row["family"], []).append((row["shape"]["batch"], speedup))
    fig, ax = plt.subplots(figsize=(8, 5))
    for family, points in sorted(families.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=family)
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("batch size B (requests)")
    ax.set_ylabel("speed-up: stock / flatgather")
    v = results["versions"]
    ax.set_title(f"_get_pruned_states, SGLang {v['sglang']}, {results['machine']['device']}")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
