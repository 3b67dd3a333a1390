"""Tables, Markdown and a plot from the bench's results: a plain dict, as
``bench --json`` writes it, so that ``flatgather report FILE`` regenerates
everything from a saved run. Needs neither torch nor SGLang (matplotlib for
the plot only)."""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
from pathlib import Path

from flatgather.bench import machine
from flatgather.bench.stats import spans_one

MIN_ROUNDS = 5
"""Fewer rounds than this and the intervals are not worth much."""

SPANS = "?"
"""Marks a ratio whose 95% interval holds 1.0."""


class ReportError(Exception):
    """The file is not a result of this bench."""


# -- formatting ----------------------------------------------------------------


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e9:.0f} ns"


def fmt_ratio(r: dict, decisive: bool) -> str:
    mark = f" {SPANS}" if decisive and spans_one(r) else ""
    return f"{r['median']:.2f}x [{r['low']:.2f}-{r['high']:.2f}]{mark}"


def fmt_info(value) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def split_series(series: list[str]) -> tuple[list[str], dict[str, str]]:
    """The parts (joined by ", ") every series shares, and each series
    without them: what a legend needs to say."""
    parts = {s: s.split(", ") for s in series}
    common = [p for p in parts[series[0]] if all(p in q for q in parts.values())] if series else []
    short = {s: ", ".join(p for p in q if p not in common) or s for s, q in parts.items()}
    return common, short


# -- warnings ------------------------------------------------------------------


def measured(results: dict) -> list[dict]:
    return [s for s in results["sections"] if s["status"] == "measured" and s["rows"]]


def spanning(section: dict) -> tuple[int, int]:
    """(ratios whose interval holds 1.0, decisive ratios) of a section."""
    keys = [r["key"] for r in section["ratios"] if r["decisive"]]
    total = held = 0
    for row in section["rows"]:
        for key in keys:
            r = row.get("ratios", {}).get(key)
            if r is not None:
                total += 1
                held += spans_one(r)
    return held, total


def collect_warnings(results: dict) -> list[str]:
    """Everything that may make a figure of this run untrustworthy."""
    load = results["load"]
    out = machine.judge(load, load.get("max_other_load", machine.DEFAULT_MAX_OTHER_LOAD))
    if any(w.startswith("busy") for w in out):
        out.append(
            "figures measured on a busy machine may mislead (multi-threaded copies suffer "
            "most, SGLang's small slices least): rerun on an idle machine before quoting them"
        )
    rounds = results.get("timing", {}).get("samples", MIN_ROUNDS)
    if rounds < MIN_ROUNDS:
        out.append(
            f"{rounds} round(s) per measurement: intervals from fewer than {MIN_ROUNDS} rounds "
            "say little (drop --samples for the grid's default)"
        )
    for section in measured(results):
        held, total = spanning(section)
        if held:
            out.append(
                f"`{section['name']}`: {held} of {total} ratios have a 95% interval that holds "
                f"1.0 (marked {SPANS}): those rows do not say which side is faster"
            )
    return out


# -- tables --------------------------------------------------------------------


def columns(section: dict, cuda: bool) -> list[tuple[str, callable]]:
    """(header, row -> cell) for one section's table."""
    cols = [("B", lambda row: str(row["batch"]))]
    for key, header in section["info"]:
        cols.append((header, lambda row, key=key: fmt_info(row["info"].get(key, ""))))
    unit = " (GPU)" if cuda else ""
    for key, name in section["variants"].items():
        cols.append(
            (
                f"{name}{unit}",
                lambda row, key=key: (
                    fmt_time(row["time"][key]["median"]) if key in row["time"] else ""
                ),
            )
        )
    for r in section["ratios"]:
        cols.append(
            (
                r["header"],
                lambda row, r=r: (
                    fmt_ratio(row["ratios"][r["key"]], r["decisive"])
                    if r["key"] in row.get("ratios", {})
                    else ""
                ),
            )
        )
    counted = section["counted"]
    names = "/".join(section["variants"][k] for k in counted)
    cols.append(
        (
            f"aten ops {names}",
            lambda row: "/".join(str(row["aten_ops"].get(k, "")) for k in counted),
        )
    )
    cols.append(
        (
            f"host syncs {names}",
            lambda row: "/".join(str(row.get("syncs", {}).get(k, "")) for k in counted),
        )
    )
    if cuda:
        for key in counted:
            name = section["variants"][key]
            cols.append(
                (f"{name} host", lambda row, key=key: fmt_time(row["host_time"][key]["median"]))
            )
        first = section["ratios"][0]
        cols.append(
            (
                f"{first['header']} host",
                lambda row: fmt_ratio(row["host_ratios"][first["key"]], first["decisive"]),
            )
        )
        cols.append(
            (
                f"GPU ops {names}",
                lambda row: "/".join(
                    "?" if (n := row["launches"].get(k)) is None else str(n) for k in counted
                ),
            )
        )
    return cols


def groups(section: dict) -> tuple[list[str], list[tuple[str, list[dict]]]]:
    """The parts all rows share, and the rows grouped by the rest of their
    series, in order of first appearance."""
    order: list[str] = []
    by: dict[str, list[dict]] = {}
    for row in section["rows"]:
        if row["series"] not in by:
            order.append(row["series"])
            by[row["series"]] = []
        by[row["series"]].append(row)
    common, short = split_series(order)
    return common, [(short[s], by[s]) for s in order]


def _cells(cols, row) -> list[str]:
    if "skipped" in row:
        return [str(row["batch"]), f"not timed: {row['skipped']}"] + [""] * (len(cols) - 2)
    return [fn(row) for _, fn in cols]


def _text_table(header: list[str], body: list[list[str] | str]) -> str:
    rows = [r for r in body if not isinstance(r, str)]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for r in body:
        if isinstance(r, str):
            lines.append(r)
        else:
            lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(lines)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _is_cuda(results: dict) -> bool:
    return str(results["machine"]["device"]).startswith("cuda")


def headline(results: dict) -> list[str]:
    v, m, inst, load = results["versions"], results["machine"], results["install"], results["load"]
    t = results["timing"]
    before = load.get("before") or ["?"]
    after = load.get("after") or ["?"]
    gpu = f" ({m['gpu']})" if "gpu" in m else ""
    return [
        f"flatgather {v['flatgather']}, SGLang {v['sglang']} (contract verified by "
        f"{inst['verified_by']}, probe {inst['probe_ms']:.0f} ms), torch {v['torch']}, "
        f"numpy {v['numpy']}, Python {v['python']}",
        f"device {m['device']}{gpu}; torch threads {results['threads']} (pinned, --threads); "
        f"{m['cpus']} cores; {m['processor']}",
        f"load average (1, 5, 15 min) {', '.join(map(str, before))} before, "
        f"{', '.join(map(str, after))} after",
        f"{results['size']} grid, {t['samples']} interleaved rounds per measurement, "
        f"{results['seconds']} s in all; medians per call, ratios with 95% intervals",
    ]


def table(results: dict) -> str:
    """The terminal report."""
    cuda = _is_cuda(results)
    parts = headline(results)
    parts += [f"NOTE: {n}" for n in results.get("notes", [])]
    parts.append("")
    for section in results["sections"]:
        parts.append(f"== {section['name']}: {section['title'].replace('`', '')}")
        if section["status"] != "measured":
            parts += [f"   not measured: {section['reason']}", ""]
            continue
        common, grouped = groups(section)
        cols = columns(section, cuda)
        body: list[list[str] | str] = []
        for series, rows in grouped:
            if len(grouped) > 1:
                body.append(f"-- {series}")
            body += [
                f"{row['batch']:>3}  not timed: {row['skipped']}"
                if "skipped" in row
                else _cells(cols, row)
                for row in rows
            ]
        if common:
            parts.append(f"   all rows: {', '.join(common)}")
        parts.append(_text_table([h for h, _ in cols], body))
        use = results["load"]["sections"].get(section["name"], {})
        if use.get("other_cores") is not None:
            parts.append(
                f"   {section['seconds']} s; other processes used {use['other_cores']:.2f} "
                "cores meanwhile"
            )
        parts += [f"   {n}" for n in section.get("notes", [])]
        for t in section.get("targets", []):
            parts.append(f"   [{'met' if t['met'] else 'NOT met'}] {t['name']}: {t['got']}")
        parts.append("")
    warnings = results.get("warnings", [])
    if warnings:
        parts.append("=" * 78)
        parts += [f"WARNING: {w}" for w in warnings]
        parts.append("=" * 78)
    else:
        parts.append("no warning: the machine was quiet and every speed-up interval excludes 1.0")
    return "\n".join(parts)


READING = """\
## How to read this

- **Variants** are timed side by side in one process, on the same tensors: one sample of each
  in turn (the order rotating), so that anything the machine does meanwhile hits all of them
  alike. A sample is a calibrated number of calls (about 10 ms); the time shown is the median
  per call over the samples, outliers (beyond 1.5 IQR) dropped.
- **stock** is SGLang's own code, as shipped. **fg** is flatgather, installed the way
  `flatgather.sglang.install()` installs it (the probe verified the contract first).
- **Ratios** such as `stock/fg` are computed round by round (the stock sample of a round
  divided by the fg sample of the same round) and summarised by their median, with a 95%
  bootstrap interval in brackets. `stock/fg` above 1 means flatgather is faster. A `?` marks an
  interval that holds 1.0: that row cannot say which side is faster.
- `fg/memcpy` is the distance to the bound (a plain copy of the same bytes): 1.0 is the bound.
- **aten ops** counts the torch operations one call dispatches, views not counted (stock/fg);
  on a GPU each is at least one kernel launch or copy, which is why the `host-cost` section
  matters there. **host syncs** counts the calls of one call after which, on a GPU, the host
  waits for the device: `Tensor.tolist` and `Tensor.item`, `torch.tensor` and
  `torch.as_tensor` of host data given a device (a blocking upload there; counted on a CPU
  run too, where the device is the CPU), and copies between host and device without
  `non_blocking` (only a run on a device has those).
- **B** is the batch size (requests); **tokens** the rows of `hidden_states`; **kept rows**
  the rows the logprob branch keeps; **MiB gathered** the bytes it copies; **input
  logprobs** the input logprobs `forward` returns.
- **Targets** are the goals the project set itself; each is judged on this run's medians.
- **Warnings** come first: a busy machine (other processes using more than the threshold,
  `--max-other-load`, of CPU while a section ran, or a high load average), or ratios whose
  interval holds 1.0. torch is pinned to `--threads` threads (default 1) so that the bench
  cannot oversubscribe the cores itself.
"""


def image_link(markdown_path: Path, plot_path: Path | None) -> str | None:
    """The plot as the Markdown file links it (relative when it can be)."""
    if plot_path is None:
        return None
    return os.path.relpath(Path(plot_path).resolve(), Path(markdown_path).resolve().parent)


def markdown(results: dict, image: str | None = None) -> str:
    cuda = _is_cuda(results)
    lines = [
        "# Benchmarks",
        "",
        "Generated from one run of the command below; every ratio compares figures measured",
        "side by side in that run. `flatgather report FILE.json --markdown ... --plot ...`",
        "regenerates this page and the plot from the run's saved JSON.",
        "",
        "```sh",
        results["command"],
        "```",
        "",
    ]
    lines += [f"- {line}" for line in headline(results)]
    lines += [f"- {n}" for n in results.get("notes", [])]
    lines.append("")
    warnings = results.get("warnings", [])
    if warnings:
        lines += ["> **Warning**", ">"]
        lines += [f"> - {w}" for w in warnings]
        lines.append("")
    else:
        lines += [
            "No warning: the machine was quiet during the run and every speed-up interval",
            "excludes 1.0.",
            "",
        ]
    if image:
        lines += [f"![speed-up against batch size, one panel per section]({image})", ""]
    lines.append(READING)
    for section in results["sections"]:
        lines += [f"## {section['name']}: {section['title']}", "", section["about"], ""]
        if section["status"] != "measured":
            lines += [f"**Not measured:** {section['reason']}", ""]
            continue
        common, grouped = groups(section)
        cols = columns(section, cuda)
        if common:
            lines += [f"All rows: {', '.join(common)}.", ""]
        header = [h for h, _ in cols]
        rows = [_cells(cols, row) for _, group in grouped for row in group]
        if len(grouped) > 1:
            header = ["case", *header]
            rows = [
                [f"**{series}**" if i == 0 else "", *_cells(cols, row)]
                for series, group in grouped
                for i, row in enumerate(group)
            ]
        lines += [_md_table(header, rows), ""]
        use = results["load"]["sections"].get(section["name"], {})
        if use.get("other_cores") is not None:
            lines += [
                f"{section['seconds']} s; other processes used {use['other_cores']:.2f} cores "
                "on average meanwhile.",
                "",
            ]
        lines += [f"{n}" for n in section.get("notes", [])]
        if section.get("notes"):
            lines.append("")
        if section.get("targets"):
            lines += ["| target | met | this run |", "|---|---|---|"]
            lines += [
                f"| {t['name']} | {'yes' if t['met'] else 'no'} | {t['got']} |"
                for t in section["targets"]
            ]
            lines.append("")
    return "\n".join(lines)


# -- plot ----------------------------------------------------------------------


def plot(results: dict, path: Path) -> None:
    """One PNG, one panel per section: speed-up against batch size, the 95%
    interval as error bars, a line at 1x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = results["sections"]
    n = max(1, len(sections))
    ncols = 1 if n == 1 else 2
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.5 * ncols, 4.8 * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, section in zip(axes.flat, sections, strict=False):
        title = section["title"].replace("`", "")
        if section["status"] != "measured" or not section["rows"]:
            ax.set_title(title, fontsize=10)
            reason = textwrap.fill(f"not measured: {section.get('reason', 'no rows')}", 60)
            ax.text(0.5, 0.5, reason, ha="center", va="center", fontsize=9)
            ax.set_axis_off()
            continue
        _panel(ax, section, title)
    v, m = results["versions"], results["machine"]
    fig.suptitle(
        f"flatgather vs SGLang {v['sglang']} ({m['device']}, {results['threads']} torch "
        f"thread{'s' if results['threads'] > 1 else ''}): speed-up = SGLang's time / "
        "flatgather's time; bars: 95% interval",
        fontsize=11,
    )
    if any(w.startswith("busy") for w in results.get("warnings", [])):
        fig.text(
            0.5,
            0.005,
            "Measured on a busy machine: see the warnings in the report before quoting a figure.",
            ha="center",
            color="firebrick",
            fontsize=10,
        )
    fig.tight_layout(rect=(0, 0.03, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panel(ax, section: dict, title: str) -> None:
    plotted = [r for r in section["ratios"] if r.get("plot") is not None]
    rows = [r for r in section["rows"] if "ratios" in r]
    common, short = split_series(list(dict.fromkeys(r["series"] for r in rows)))
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

    styles = ["-", "--", ":", "-."]
    values = []
    lines = len(short) * len(plotted)
    for i, (series, label) in enumerate(short.items()):
        color = f"C{i % 10}"
        for j, ratio in enumerate(plotted):
            points = sorted(
                (r["batch"], r["ratios"][ratio["key"]])
                for r in rows
                if r["series"] == series and ratio["key"] in r["ratios"]
            )
            if not points:
                continue
            # Lines side by side at each batch size, so error bars do not hide each other.
            dodge = 2 ** (0.05 * (i * len(plotted) + j - (lines - 1) / 2))
            xs = [b * dodge for b, _ in points]
            ys = [p["median"] for _, p in points]
            err = [
                [p["median"] - p["low"] for _, p in points],
                [p["high"] - p["median"] for _, p in points],
            ]
            values += [p["low"] for _, p in points] + [p["high"] for _, p in points]
            ax.errorbar(
                xs,
                ys,
                yerr=err,
                color=color,
                linestyle=styles[j % len(styles)],
                marker="o",
                markersize=4,
                capsize=3,
                label=label + ratio["plot"],
            )
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xscale("log", base=2)
    batches = sorted({r["batch"] for r in rows})
    ax.xaxis.set_major_locator(FixedLocator(batches))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 8:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}x"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))
    ax.set_xlabel("batch size (requests)")
    ax.set_ylabel("speed-up over SGLang's own code")
    ax.set_title(title + (f"\n{', '.join(common)}" if common else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


# -- command -------------------------------------------------------------------


def load(path: Path) -> dict:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ReportError(f"no such file: {path}") from None
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        results = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(results, dict) or results.get("schema") != 2:
        raise ReportError(
            f"{path} was not written by this version's `flatgather bench --json` "
            "(rerun the bench to get one)"
        )
    return results


def main(argv: list[str] | None = None) -> int:
    import argparse

    from flatgather.cli import prog

    parser = argparse.ArgumentParser(
        prog=f"{prog()} report",
        description="Print the table again, and write Markdown and a plot, from a saved "
        "`bench --json` file.",
    )
    parser.add_argument("json", type=Path, help="a file written by `bench --json`")
    parser.add_argument("--markdown", type=Path, help="write the Markdown report here")
    parser.add_argument("--plot", type=Path, help="write the PNG here")
    args = parser.parse_args(argv)
    try:
        results = load(args.json)
    except ReportError as exc:
        print(f"{prog()} report: error: {exc}", file=sys.stderr)
        return 2
    # Judged again by this version's rules, from the figures the run saved.
    results["warnings"] = collect_warnings(results)
    print(table(results))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(results, image_link(args.markdown, args.plot)))
        print(f"wrote {args.markdown}")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0
