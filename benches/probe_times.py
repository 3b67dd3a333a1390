"""install() across the release table: python benches/probe_times.py [RUNS]

For every release set up by .ci/setup (.sglang/<release>), a fresh child
interpreter imports it (the logits processor, the draft worker, the
scheduler's result processor and the output-logprob chain's modules), then
runs ``flatgather.sglang.install()`` / ``uninstall()`` RUNS times (default
7) and reports:

- the contract the probe found, whether it is the table's row, the probe
  cases compared;
- the probe time and the whole install() time (median and max of the runs;
  the first includes torch's warm-up);
- whether FULL capture gathers no aux row;
- the token-id logprob functions replaced (and how the release walks them);
- whether SGLang #36938 was found and fixed;
- what the draft worker's rewrite applied and how long its ``prepare`` took
  (timed once, on the release's own method, before the installs, which apply
  the same patch);
- the output-logprob chain's stages: the modules whose helpers were replaced
  and the methods rebuilt (each verified at install).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import importlib, json, statistics, sys, time
    runs = int(sys.argv[1])
    import flatgather.sglang as fs
    from flatgather.sglang import installer, releases
    from flatgather.sglang.patches import draft_prefill, prefill_result, pruned_states
    from flatgather.sglang.patches import output_logprobs as chain
    from flatgather.sglang.patches.output_logprobs import runtime as flat_logprobs
    from flatgather.testing import install_sgl_kernel_stand_in
    import sglang.srt.layers.logits_processor  # noqa: F401  (imported before timing)
    install_sgl_kernel_stand_in()
    worker = importlib.import_module(draft_prefill.MODULE)
    for name in (*prefill_result.MODULES, *chain.PRODUCER_MODULES, *chain.CONSUMER_CLASSES):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    started = time.perf_counter()
    draft = draft_prefill.PATCH.prepare(worker)  # on the release's own method
    prepare_s = time.perf_counter() - started
    seconds, installs, report = [], [], None
    for _ in range(runs):
        fs.uninstall()
        started = time.perf_counter()
        report = fs.install()  # the modules are imported: every patch applies now
        installs.append(time.perf_counter() - started)
        seconds.append(report.probe_seconds)
    patches = installer.installed_swaps()
    chain_names = (flat_logprobs.TOP, flat_logprobs.TOKEN_IDS)
    token_ids = [
        p for p in patches
        if p.name.startswith("get_token_ids_logprobs") and p.name not in chain_names
    ]
    producers = sorted({
        p.target.__name__.rsplit(".", 1)[-1] for p in patches
        if p.name in chain_names
    })
    consumers = [
        p.where.rsplit(".", 2)[-2] + "." + p.name for p in patches
        if getattr(p.new, "__flatgather__", None) == chain.CONSUMERS
    ]
    row = releases.by_version(report.release)
    c = report.contract
    print(json.dumps({
        "release": report.release,
        "table_row_true": bool(row) and (
            c.trailing_token_to_seq, c.packed_aux, c.writes_cpu_indices, c.prunes_aux
        ) == (row.trailing_token_to_seq, row.packed_aux, row.writes_cpu_indices, row.prunes_aux),
        "lazy_aux": report.lazy_aux,
        "lazy_full": report.lazy_full,
        "token_ids": [
            p.name.rsplit("_", 1)[-1] + (" (skips empty)" * p.new.__flatgather__.skip_empty)
            for p in token_ids
        ],
        "skip_fix": prefill_result.FIX in report.backports,
        "cases": next(
            s for s in installer.in_service() if isinstance(s, pruned_states.Pruning)
        ).probed.verdict.cases,
        "chain_producers": producers,
        "chain_consumers": consumers,
        "probe_ms_median": statistics.median(seconds[1:] or seconds) * 1e3,
        "probe_ms_max": max(seconds) * 1e3,
        "install_ms_median": statistics.median(installs[1:] or installs) * 1e3,
        "backports": list(report.backports),
        "draft_applied": list(draft.applied),
        "draft_notes": list(draft.notes),
        "draft_prepare_ms": prepare_s * 1e3,
        "notes": list(report.notes),
    }))
    """
)


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    sys.path.insert(0, str(ROOT / "python" / "flatgather" / "sglang"))
    import releases  # the table, as a plain module: no flatgather import here

    print(
        "| SGLang | table row true | lazy aux (FULL) | cases | probe ms (median / max) "
        "| install ms | token-id functions | #36938 | draft rewrite | prepare ms | backports "
        "| output-logprob helpers replaced in | chain methods rebuilt |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in releases.RELEASES:
        site = ROOT / ".sglang" / row.version
        if not (site / ".complete").is_file():
            print(f"| {row.version} | not set up (.ci/setup) |" + " |" * 12)
            continue
        env = {**os.environ, "PYTHONPATH": str(site)}
        env.pop("FLATGATHER_SGLANG", None)
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(runs)],
            env=env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode != 0:
            print(f"| {row.version} | FAILED: {out.stderr.strip().splitlines()[-1]} |" + " |" * 12)
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        draft = ", ".join(r["draft_applied"]) or "; ".join(r["draft_notes"]) or "none"
        lazy = (
            "off" if not r["lazy_aux"] else "on (FULL too)" if r["lazy_full"] else "on (not FULL)"
        )
        print(
            f"| {r['release']} | {'yes' if r['table_row_true'] else 'NO'} "
            f"| {lazy} | {r['cases']} "
            f"| {r['probe_ms_median']:.1f} / {r['probe_ms_max']:.1f} "
            f"| {r['install_ms_median']:.0f} | {', '.join(r['token_ids']) or 'none'} "
            f"| {'present, fixed' if r['skip_fix'] else 'not fixed here'} | {draft} "
            f"| {r['draft_prepare_ms']:.0f} | {', '.join(r['backports']) or 'none'} "
            f"| {', '.join(r['chain_producers']) or 'none'} "
            f"| {', '.join(r['chain_consumers']) or 'none'} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
