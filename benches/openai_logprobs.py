"""The OpenAI ``logprobs`` object, side by side: the release's own
``to_openai_style_logprobs`` against flatgather's, on the same tuples, in one
run (rounds interleaved, the order rotating), with the byte-level tokenizer
of the engine tests (``tests/engine/models.py``).

    PYTHONPATH=$PWD/.sglang/0.5.23 .venv/bin/python benches/openai_logprobs.py

The shapes are one ``/v1/completions`` request: echo scoring (300 prompt
positions and one output token, the top 5 of each, as evaluation harnesses
ask) and a 64-token completion with the top 5. Each runs twice: with the
tokenizer's own texts, among which this small byte-level vocabulary decodes
about a quarter of the tokens to U+FFFD (bytes of a longer character, which
from 0.5.21 both sides hand to the release's ``_lossless_token_text``), and
with those texts made whole (a large vocabulary on English text has few
fragments). Every call's objects are compared first; the figure is the
release's time over flatgather's (above 1: flatgather faster), the median of
the per-round ratios with its bootstrap 95% interval.
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
    # name, prompt positions, output positions, top k
    ("echo scoring: 300 + 1 positions, top 5", 300, 1, 5),
    ("completion: 64 positions, top 5", 0, 64, 5),
)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, argv)
    import sglang.srt.layers.logits_processor  # noqa: F401 - before the stand-in
    from flatgather.testing import install_sgl_kernel_stand_in

    install_sgl_kernel_stand_in()
    import flatgather.sglang
    import sglang.srt.entrypoints.openai.utils as utils
    from engine import models
    from flatgather.sglang.patches.openai_logprobs import runtime
    from transformers import AutoTokenizer

    where = Path(os.environ.get("TMPDIR", "/tmp")) / "flatgather-front-end-tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(str(models.make_tokenizer(where)))
    stock = vars(utils)[runtime.NAME]
    lossless = runtime.takes_tokenizer(stock)
    report = flatgather.sglang.install()
    ours = vars(utils)[runtime.NAME]
    if getattr(ours, "__flatgather__", None) != runtime.NAME:
        print(f"flatgather left the OpenAI conversion stock: {report.notes}", file=sys.stderr)
        return 1

    def run(fn, call):
        return fn(*call, tokenizer) if lossless else fn(*call)

    def seen(out):
        return type(out), sorted(out.model_fields_set), vars(out)

    rng = random.Random(0)
    bench = SideBySide(args.samples, args.sample_s)
    print(
        f"SGLang {report.release} ({'lossless' if lossless else 'plain'} texts), "
        f"torch threads 1, {args.samples} rounds per shape"
    )
    for shape, prompt, output, k in SHAPES:
        for whole in (False, True):

            def entry(token, whole=whole):
                text = tokenizer.decode([token])
                return (
                    rng.uniform(-9.0, 0.0),
                    token,
                    text.replace("\ufffd", "?") if whole else text,
                )

            def tokens(n):
                return [entry(rng.randrange(models.VOCAB)) for _ in range(n)]

            inputs = tokens(prompt) if prompt else None
            if inputs:
                inputs[0] = (None, *inputs[0][1:])
            tops = [None, *[tokens(k) for _ in range(prompt - 1)]] if prompt else None
            call = (inputs, tokens(output), tops, [tokens(k) for _ in range(output)])
            entries = [*(inputs or []), *call[1]]
            entries += [t for rows in call[2:] if rows for row in rows if row for t in row]
            fragments = sum("\ufffd" in (t[2] or "") for t in entries)
            name = f"{shape}, {'no fragments' if whole else f'{fragments} fragments'}"
            if seen(run(stock, call)) != seen(run(ours, call)):
                print(f"{name}: the objects differ", file=sys.stderr)
                return 1
            bench.measure(name, lambda c=call: run(stock, c), lambda c=call: run(ours, c))

    bench.report("one request's OpenAI logprobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
