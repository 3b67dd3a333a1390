"""The rotation alone: python benches/rotation_block.py [ROUNDS]

The release's own block of ``_draft_extend_for_prefill`` (its statements up
to and including the one holding the rotation loop: the tail tokens and the
loop) against the same block rewritten by flatgather, compiled exactly as
``install()`` verifies them, on the CPU with one torch thread, samples
interleaved round by round. Both blocks run the release's own tail tokens
(``_eagle_prefill_tail_tokens``, where it has one), timed alone in the same
rounds: the loop's own cost is a block's minus that. SGLang on PYTHONPATH (an
absolute path); prints medians per call and the ratios, per batch size.
"""

from __future__ import annotations

import copy
import importlib
import statistics
import sys
import time


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    import torch

    torch.set_num_threads(1)
    import sglang.srt.layers.logits_processor  # noqa: F401  (before the stand-in)
    from flatgather.sglang import source
    from flatgather.sglang.patches import draft_prefill as dp
    from flatgather.sglang.patches.draft_prefill import check as draft_check
    from flatgather.sglang.patches.draft_prefill import match as draft_match
    from flatgather.sglang.patches.draft_prefill import rewrite as draft_rewrite
    from flatgather.testing import install_sgl_kernel_stand_in

    install_sgl_kernel_stand_in()
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    worker = importlib.import_module(dp.MODULE)
    method = source.parse_method(getattr(worker, dp.OWNER), dp.METHOD)
    tree = copy.deepcopy(method.tree)
    loop = draft_match.find_loop(method, tree)
    k = draft_match.top_index(tree, loop.node)
    names = draft_rewrite.Names(
        "flatgather_rotate", "flatgather_takes", "flatgather_lens", "flatgather_end"
    )
    branch = draft_rewrite.replace_loop(tree, loop, names)
    closure = {names.rotate: dp.rotate, names.takes: dp.takes}
    stock, ours = draft_check.blocks(method, tree, k, branch, closure)
    params = [a.arg for a in (*method.tree.args.posonlyargs, *method.tree.args.args)]
    from flatgather.sglang.releases import sglang_release

    tail_tokens = getattr(worker, "_eagle_prefill_tail_tokens", None)
    print(f"SGLang {sglang_release()}, {rounds} interleaved rounds, 1 torch thread")
    print("   B  tokens  block stock   block fg     tails  block stock/fg  loop stock/fg")
    for b in (1, 8, 64, 256, 1024):
        lens = [16] * b
        times = {"stock": [], "fg": [], "tails": []}
        order = [("stock", stock), ("fg", ours), ("tails", None)]
        for r in range(rounds):
            for name, fn in order[r % 3 :] + order[: r % 3]:
                batch, tails, _, _ = draft_check.probe_inputs(
                    lens, None, 0, ForwardMode.EXTEND, False, (torch.int64, torch.int64), r
                )
                args = dict.fromkeys(params)
                args.update(self=None, batch=batch, next_token_ids=tails)
                started = time.perf_counter()
                if fn is not None:
                    fn(*args.values())
                elif tail_tokens is not None:
                    tail_tokens(batch, tails)
                times[name].append(time.perf_counter() - started)
        s, f, t = (statistics.median(times[n]) for n in ("stock", "fg", "tails"))
        print(
            f"{b:4d} {sum(lens):7d} {s * 1e6:9.1f} µs {f * 1e6:7.1f} µs {t * 1e6:6.1f} µs"
            f" {s / f:13.1f}x {(s - t) / (f - t):13.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
