"""The front end's logprob tuples, side by side: the release's own
``TokenizerManager.detokenize_top_logprobs_tokens`` and
``detokenize_logprob_tokens`` against flatgather's, on the same calls, in one
run (rounds interleaved, the order rotating), on the byte-level tokenizer of
the engine tests (``tests/engine/models.py``).

    PYTHONPATH=$PWD/.sglang/0.5.23 .venv/bin/python benches/front_end.py

The shapes are what the tokenizer manager hands the functions for one
request: an echo-scoring request (300 prompt positions, the top 5, texts, as
``/v1/completions`` with ``echo`` and ``logprobs`` asks), a completion (64
positions), and ``Engine.generate`` without texts. Every call's answers are
compared first; the figure is the release's time over flatgather's (above 1:
flatgather faster), the median of the per-round ratios with its bootstrap
95% interval. flatgather's side runs warm: the texts of the ids it has seen
are decoded once per tokenizer, which is what a server does after its first
requests.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from side_by_side import SideBySide, arguments  # noqa: E402 - beside this script

SHAPES = (
    # name, positions, top k, texts
    ("echo scoring: 300 positions, top 5, texts", 300, 5, True),
    ("completion: 64 positions, top 5, texts", 64, 5, True),
    ("Engine.generate: 64 positions, top 5, no texts", 64, 5, False),
)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, argv)
    import sglang.srt.layers.logits_processor  # noqa: F401 - before the stand-in
    from flatgather.testing import install_sgl_kernel_stand_in

    install_sgl_kernel_stand_in()
    import flatgather.sglang
    import sglang.srt.managers.tokenizer_manager as tm
    from engine import models
    from flatgather.sglang.patches.front_end import runtime
    from transformers import AutoTokenizer

    where = Path(os.environ.get("TMPDIR", "/tmp")) / "flatgather-front-end-tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(str(models.make_tokenizer(where)))
    Manager = tm.TokenizerManager
    stock_one, stock_top = vars(Manager)[runtime.ONE], vars(Manager)[runtime.TOP]

    class Stock(Manager):
        detokenize_logprob_tokens = stock_one
        detokenize_top_logprobs_tokens = stock_top

    report = flatgather.sglang.install()
    if getattr(vars(Manager)[runtime.TOP], "__flatgather__", None) != runtime.TOP:
        print(f"flatgather left the front end stock: {report.notes}", file=sys.stderr)
        return 1
    stock, ours = object.__new__(Stock), object.__new__(Manager)
    stock.tokenizer = ours.tokenizer = tokenizer

    rng = random.Random(0)
    bench = SideBySide(args.samples, args.sample_s)
    print(f"SGLang {report.release}, torch threads 1, {args.samples} rounds per shape")
    for name, positions, k, text in SHAPES:
        vals = [[rng.uniform(-9.0, 0.0) for _ in range(k)] for _ in range(positions)]
        ids = [[rng.randrange(models.VOCAB) for _ in range(k)] for _ in range(positions)]
        one_vals, one_ids = [v[0] for v in vals], [i[0] for i in ids]
        calls = {
            "release": lambda v=vals, i=ids, t=text, o=one_vals, d=one_ids: (
                Stock.detokenize_top_logprobs_tokens(stock, v, i, t),
                Stock.detokenize_logprob_tokens(stock, o, d, t),
            ),
            "flatgather": lambda v=vals, i=ids, t=text, o=one_vals, d=one_ids: (
                ours.detokenize_top_logprobs_tokens(v, i, t),
                ours.detokenize_logprob_tokens(o, d, t),
            ),
        }
        if calls["release"]() != calls["flatgather"]():
            print(f"{name}: the answers differ", file=sys.stderr)
            return 1
        bench.measure(name, calls["release"], calls["flatgather"])

    bench.report("one request's logprobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
