"""The least a logprob answer can cost in the release's response format:
the work no implementation can skip, timed on its own, per request, for the
two shapes of the engine bench (``benches/engine.py``).

What a client asks for fixes three kinds of work, whatever the server does
between them:

- *the arithmetic*: every row that carries a logprob needs the
  vocabulary-wide ``log_softmax`` of its logits, the top k of it and the
  gathers of the asked-for ids and of the chosen token. Timed here as bare
  torch calls on the batch's rows, step by step as the engine computes them
  (one prefill of every prompt, then one decode step per output token over
  the requests still running), each field's results kept on the device
  until the call ends;
- *the hand-over*: one ``tolist()`` per field for the whole call and one
  pickled message of flat arrays between the processes (``pickle.dumps`` and
  ``loads`` of the raw bytes), the least a scheduler and a front end in two
  processes can exchange;
- *the objects the client receives*: for ``Engine.generate`` (the ``generate``
  shape) ``meta_info``'s six lists of ``(logprob, id, None)`` tuples as the
  release returns them (the first input position's value ``None``, its
  top-k and id lists ``None``); for echo scoring over ``/v1/completions``
  (the ``echo`` shape) the OpenAI ``logprobs`` object (texts, values, offsets
  and a dict of the top 5 per position), encoded to JSON with ``orjson``
  and parsed back with ``json.loads`` as a Python client does. The texts
  come from a table of every token's text, made before timing.

Everything else a server does for logprobs (per-step copies and
``tolist()``, per-request bookkeeping, nested lists pickled twice, the
release's response classes and encoder, the collector) is outside this
floor. So the figure reads against the engine bench's: its floor side (the
same batch without logprobs) plus this is the least time a logprob batch
can take; what a side spends beyond that is the release's way of doing it.

Each part is timed by the thread's CPU clock (waiting for another process
counts nothing), the median of ``--rounds`` rounds with the parts
interleaved, torch on one thread, the garbage collector off while timing
(a collection would land on whichever part set it off). The objects are
checked once, before timing: against what the running release's own
functions make of the same values (``TokenizerManager.detokenize_logprob_tokens``
and ``detokenize_top_logprobs_tokens``; ``to_openai_style_logprobs`` of the
texted tuples), where SGLang imports (put a release first on
``PYTHONPATH``), and for their shape in any case.

    PYTHONPATH=$PWD/.sglang/0.5.23 .venv/bin/python benches/answer_floor.py \
        --markdown docs/answer-floor.md
"""

# ruff: noqa: B905 - the objects are built with zip over itertools.repeat(None), which never
# ends; zip's strict= keyword alone made that part 1.8x slower (see meta_infos).
from __future__ import annotations

import argparse
import gc
import itertools
import json
import pickle
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

TOP = 5
IDS = 3
GENERATE = {"prompt": (16, 64), "output": (16, 32), "ids": IDS}
"""The engine bench's default shape (its ``REQUESTS_SHAPE``): prompts of
16-64 tokens, 16-32 output tokens, input logprobs from token 0, the top 5
and 3 token ids."""
ECHO = {"prompt": (100, 300), "output": (1, 1), "ids": 0}
"""Its ``--shape echo``: prompts of 100-300 tokens, one output token, input
logprobs from token 0 with the top 5, no ids."""
SHAPES = {"generate": GENERATE, "echo": ECHO}


def token_texts(vocab: int) -> list[str]:
    """A text per token, as a tokenizer's decode gives them (distinct,
    short)."""
    return [f"t{i}" for i in range(vocab)]


def lengths(shape: dict, n: int, seed: int = 0) -> list[tuple[int, int]]:
    """``n`` requests' prompt and output lengths: for ``Engine.generate`` the
    engine bench's own requests (``tests/engine/workload.requests`` with its
    ``REQUESTS_SHAPE``: two prompts in three short), for echo scoring its
    lengths' range, drawn uniformly. ``benches/engine.py`` passes the lengths
    of the requests it sent instead."""
    if shape is GENERATE:
        from engine import serve  # puts tests/engine on the path, for its workload

        reqs = serve.workload.requests(
            n,
            seed=seed,
            min_len=shape["prompt"][0],
            max_len=shape["prompt"][1],
            new_tokens=shape["output"],
            ignore_eos=True,
            all_logprobs=True,
        )
        return [(len(r.input_ids), r.max_new_tokens) for r in reqs]
    rng = random.Random(seed)
    return [(rng.randint(*shape["prompt"]), rng.randint(*shape["output"])) for _ in range(n)]


class Batch:
    """One call's logits, step by step: the prefill's rows (every prompt
    position), then each decode step's (one row per running request)."""

    def __init__(
        self, shape: dict, n: int, vocab: int, seed: int = 0, lens: list | None = None
    ) -> None:
        import torch

        gen = torch.Generator().manual_seed(seed)
        self.n = n
        self.lens = lengths(shape, n, seed) if lens is None else lens
        assert len(self.lens) == n
        self.vocab = vocab
        self.n_ids = shape["ids"]
        rows = sum(p for p, _ in self.lens)
        self.prefill = torch.randn(rows, vocab, generator=gen)
        steps = max(o for _, o in self.lens) - 1
        self.decode = [
            torch.randn(sum(1 for _, o in self.lens if o > s + 1), vocab, generator=gen)
            for s in range(steps)
        ]
        self.prompt_ids = torch.randint(vocab, (rows,), generator=gen)
        self.asked = torch.randint(vocab, (n, max(self.n_ids, 1)), generator=gen)


def arithmetic(batch: Batch) -> dict:
    """The logprob rows of the call, as bare torch calls: per step the
    ``log_softmax``, its top k, the asked-for ids' and the chosen token's
    values; each field concatenated once at the end (still tensors)."""
    import torch

    fields: dict[str, list] = {k: [] for k in ("val", "id", "top_val", "top_id", "ids_val")}

    def rows(logits, chosen, asked):
        lp = torch.log_softmax(logits, dim=-1)
        top = lp.topk(TOP, dim=-1)
        fields["val"].append(lp.gather(1, chosen[:, None])[:, 0])
        fields["id"].append(chosen)
        fields["top_val"].append(top.values)
        fields["top_id"].append(top.indices)
        if asked is not None:
            fields["ids_val"].append(lp.gather(1, asked))

    # The prefill: each prompt position's logprob is that of the next
    # prompt token (the last one's, of the first output token: argmax).
    starts = list(itertools.accumulate((p for p, _ in batch.lens), initial=0))
    nxt = batch.prompt_ids.roll(-1)
    lasts = torch.tensor([s - 1 for s in starts[1:]])
    nxt[lasts] = batch.prefill[lasts].argmax(-1)
    asked = None
    if batch.n_ids:
        per_row = torch.repeat_interleave(
            torch.arange(batch.n), torch.tensor([p for p, _ in batch.lens])
        )
        asked = batch.asked[per_row, : batch.n_ids]
    rows(batch.prefill, nxt, asked)
    for s, logits in enumerate(batch.decode):
        running = torch.tensor([r for r in range(batch.n) if batch.lens[r][1] > s + 1])
        chosen = logits.argmax(-1)
        rows(logits, chosen, batch.asked[running, : batch.n_ids] if batch.n_ids else None)
    return {k: torch.cat(v) if v else None for k, v in fields.items()}


def hand_over(fields: dict) -> dict:
    """One ``tolist()``'s worth of arrays per field, through one pickled
    message of their raw bytes, read back as Python lists."""
    import numpy as np

    sent = {
        k: (v.numpy().tobytes(), str(v.numpy().dtype), tuple(v.shape))
        for k, v in fields.items()
        if v is not None
    }
    read = pickle.loads(pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL))
    return {k: np.frombuffer(b, dtype=d).reshape(s).tolist() for k, (b, d, s) in read.items()}


def _order(batch: Batch) -> list[list[int]]:
    """Per request, the positions of its rows in the call's fields, in
    order: its prompt rows (prefill), then one row per decode step."""
    at = list(itertools.accumulate((p for p, _ in batch.lens), initial=0))
    where = [list(range(at[r], at[r + 1])) for r in range(batch.n)]
    row = at[-1]
    for s in range(len(batch.decode)):
        for r in range(batch.n):
            if batch.lens[r][1] > s + 1:
                where[r].append(row)
                row += 1
    return where


def _per_request(batch: Batch, order: list[list[int]], prompt_ids: list):
    """Per request: its index, its prompt rows (each the logprob of the next
    prompt token), its output rows, and its first prompt token (the
    position without a logprob)."""
    start = 0
    for r, (p, _) in enumerate(batch.lens):
        rows = order[r]
        yield r, rows[: p - 1], rows[p - 1 :], prompt_ids[start]
        start += p


def meta_infos(batch: Batch, lists: dict, order: list[list[int]], prompt_ids: list) -> list[dict]:
    """``Engine.generate``'s six logprob fields per request: ``(logprob, id,
    None)`` tuples as the release returns them without texts. (``zip`` here
    takes no ``strict=``: the keyword alone made this part 1.8x slower, and
    ``none`` never ends.)"""
    none = itertools.repeat(None)
    val, ids, tv, ti = lists["val"], lists["id"], lists["top_val"], lists["top_id"]
    iv = lists.get("ids_val")
    asked = batch.asked.tolist()
    out = []
    for r, pin, pout, first in _per_request(batch, order, prompt_ids):
        info = {
            "input_token_logprobs": [(None, first, None)]  # noqa: RUF005
            + list(zip([val[j] for j in pin], [ids[j] for j in pin], none)),
            "output_token_logprobs": list(
                zip([val[j] for j in pout], [ids[j] for j in pout], none)
            ),
            "input_top_logprobs": [None] + [list(zip(tv[j], ti[j], none)) for j in pin],
            "output_top_logprobs": [list(zip(tv[j], ti[j], none)) for j in pout],
        }
        if iv is not None:
            a = asked[r][: batch.n_ids]
            info["input_token_ids_logprobs"] = [None] + [list(zip(iv[j], a, none)) for j in pin]
            info["output_token_ids_logprobs"] = [list(zip(iv[j], a, none)) for j in pout]
        out.append(info)
    return out


def openai_objects(
    batch: Batch, lists: dict, order: list[list[int]], prompt_ids: list, texts: list
):
    """Echo scoring's OpenAI ``logprobs`` object per request (every prompt
    token and the one output token), as the dict a JSON encoder takes."""
    val, ids, tv, ti = lists["val"], lists["id"], lists["top_val"], lists["top_id"]
    out = []
    for r, _, _, first in _per_request(batch, order, prompt_ids):
        rows = order[r]
        tokens = [texts[first]] + [texts[ids[j]] for j in rows]
        out.append(
            {
                "tokens": tokens,
                "token_logprobs": [None] + [val[j] for j in rows],
                "text_offset": [-1] * len(tokens),
                "top_logprobs": [None]
                + [dict(zip(map(texts.__getitem__, ti[j]), tv[j], strict=True)) for j in rows],
            }
        )
    return out


def encode(objects: list) -> list[bytes]:
    import orjson

    return [orjson.dumps(o) for o in objects]


def parse(bodies: list[bytes]) -> list:
    return [json.loads(b) for b in bodies]


def check(batch: Batch, fields: dict, made: list, openai: bool) -> None:
    """What was built has the definition's shape, before any timing."""
    lens = batch.lens
    if not openai:
        infos = made
        assert len(infos) == batch.n
        for (p, o), info in zip(lens, infos, strict=True):
            assert len(info["input_token_logprobs"]) == p
            assert len(info["output_token_logprobs"]) == o
            assert info["input_token_logprobs"][0][0] is None
            assert info["input_top_logprobs"][0] is None
            assert all(len(t) == TOP for t in info["output_top_logprobs"])
            assert all(len(t) == batch.n_ids for t in info["output_token_ids_logprobs"])
        assert infos[0]["input_token_logprobs"][1][0] == fields["val"][0].item()
    else:
        for (p, o), body in zip(lens, made, strict=True):
            assert len(body["tokens"]) == p + o and body["token_logprobs"][0] is None
            assert all(len(t) == TOP for t in body["top_logprobs"][1:])


def release_functions():
    """The running release's own ``TokenizerManager`` and
    ``to_openai_style_logprobs``, as shipped; None where SGLang does not
    import (the objects are then checked for their shape alone)."""
    try:
        import sglang.srt.layers.logits_processor  # before the stand-in
        from flatgather.testing import install_sgl_kernel_stand_in

        install_sgl_kernel_stand_in()
        import sglang
        import sglang.srt.entrypoints.openai.utils as utils
        import sglang.srt.managers.tokenizer_manager as tm
    except ImportError as e:
        print(f"SGLang does not import ({e}): the objects are checked for their shape alone")
        return None
    manager = object.__new__(tm.TokenizerManager)
    openai = vars(utils)["to_openai_style_logprobs"]
    for fn in (tm.TokenizerManager.detokenize_logprob_tokens, openai):
        if hasattr(fn, "__flatgather__"):
            raise SystemExit("flatgather is installed here: the release's functions are the oracle")
    return sglang.__version__, manager, openai


def release_check(release, batch, lists, order, prompt_ids, texts, made, openai: bool) -> None:
    """Each request's objects are what the release's own functions make of
    its values as the scheduler hands them over (the input lists led by
    ``None``): ``detokenize_logprob_tokens`` and
    ``detokenize_top_logprobs_tokens`` without texts for ``Engine.generate``,
    and ``to_openai_style_logprobs`` of the texted tuples (the JSON of its
    four lists) for echo scoring."""
    _, manager, to_openai = release
    val, ids, tv, ti = lists["val"], lists["id"], lists["top_val"], lists["top_id"]
    iv = lists.get("ids_val")
    asked = batch.asked.tolist()
    for r, pin, pout, first in _per_request(batch, order, prompt_ids):
        in_vals, in_ids = [None] + [val[j] for j in pin], [first] + [ids[j] for j in pin]
        out_vals, out_ids = [val[j] for j in pout], [ids[j] for j in pout]
        in_top = ([None] + [tv[j] for j in pin], [None] + [ti[j] for j in pin])
        out_top = ([tv[j] for j in pout], [ti[j] for j in pout])
        if not openai:
            one, top = manager.detokenize_logprob_tokens, manager.detokenize_top_logprobs_tokens
            expected = {
                "input_token_logprobs": one(in_vals, in_ids, False),
                "output_token_logprobs": one(out_vals, out_ids, False),
                "input_top_logprobs": top(*in_top, False),
                "output_top_logprobs": top(*out_top, False),
            }
            if iv is not None:
                a = asked[r][: batch.n_ids]
                in_asked = [None] + [a] * len(pin)
                expected["input_token_ids_logprobs"] = top(
                    [None] + [iv[j] for j in pin], in_asked, False
                )
                expected["output_token_ids_logprobs"] = top(
                    [iv[j] for j in pout], [a] * len(pout), False
                )
            assert made[r] == expected, f"request {r}: not the release's objects"
            continue

        def texted(vals, ids):
            return [(v, i, texts[i]) for v, i in zip(vals, ids, strict=True)]

        def texted_top(vals, ids):
            return [None if v is None else texted(v, i) for v, i in zip(vals, ids, strict=True)]

        args = (
            texted(in_vals, in_ids),
            texted(out_vals, out_ids),
            texted_top(*in_top),
            texted_top(*out_top),
        )
        if "tokenizer" in to_openai.__code__.co_varnames[: to_openai.__code__.co_argcount]:
            args = (*args, None)  # a text without U+FFFD is kept as it is
        got = to_openai(*args)
        expected = {k: getattr(got, k) for k in ("tokens", "token_logprobs", "text_offset")}
        expected["top_logprobs"] = got.top_logprobs
        assert made[r] == expected, f"request {r}: not the release's OpenAI logprobs"


def python_objects(x) -> int:
    """The objects of an answer: every list, tuple, dict, key and value in
    it, ``None`` left out (one object the interpreter shares)."""
    if x is None:
        return 0
    if isinstance(x, list | tuple):
        return 1 + sum(python_objects(v) for v in x)
    if isinstance(x, dict):
        return 1 + sum(python_objects(k) + python_objects(v) for k, v in x.items())
    return 1


def _cpu(fn, *args):
    t = time.thread_time_ns()
    out = fn(*args)
    return out, (time.thread_time_ns() - t) / 1e6


def measure(name: str, n: int, rounds: int, vocab: int, release, lens: list | None = None) -> dict:
    """The least answer for ``n`` requests of the shape ``name`` (of
    :data:`SHAPES`), their lengths ``lens`` or :func:`lengths`'."""
    import torch

    texts = token_texts(vocab)
    batch = Batch(SHAPES[name], n, vocab, lens=lens)
    order = _order(batch)
    prompt_ids = batch.prompt_ids.tolist()
    openai = name == "echo"
    names = ["arithmetic", "hand-over", "objects"] + (
        ["JSON encoding", "client's parse"] if openai else []
    )
    parts: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    gc.disable()
    try:
        for k in range(rounds + 1):
            with torch.inference_mode():
                fields, t_math = _cpu(arithmetic, batch)
            lists, t_hand = _cpu(hand_over, fields)
            if openai:
                made, t_obj = _cpu(openai_objects, batch, lists, order, prompt_ids, texts)
            else:
                made, t_obj = _cpu(meta_infos, batch, lists, order, prompt_ids)
            times = [t_math, t_hand, t_obj]
            if openai:
                bodies, t_enc = _cpu(encode, made)
                parsed, t_parse = _cpu(parse, bodies)
                times += [t_enc, t_parse]
            if k == 0:
                if openai:
                    assert parsed == made, "the JSON read back is not the object encoded"
                check(batch, fields, made, openai)
                count = python_objects(made) / n
                if release is not None:
                    release_check(release, batch, lists, order, prompt_ids, texts, made, openai)
                continue  # the first round warms up
            for part, t in zip(parts, times, strict=True):
                parts[part].append(t / n)
            del made, lists, fields
    finally:
        gc.enable()
    medians = {p: statistics.median(v) for p, v in parts.items()}
    spread = {p: (min(v), max(v)) for p, v in parts.items()}
    return {
        "shape": name,
        "requests": n,
        "rows": batch.prefill.shape[0] + sum(d.shape[0] for d in batch.decode),
        "steps": 1 + len(batch.decode),
        "ms": medians,
        "range": spread,
        "total_ms": sum(medians.values()),
        "server_ms": sum(v for p, v in medians.items() if p != "client's parse"),
        "objects": count,
    }


WHAT = {
    "generate": "`Engine.generate`: prompts of 16-64 tokens, 16-32 output tokens, the top 5 and 3 "
    "token ids, input logprobs from token 0; the six `meta_info` lists",
    "echo": "echo scoring over `/v1/completions`: prompts of 100-300 tokens, 1 output token, the "
    "top 5 and texts; the OpenAI `logprobs` object, to JSON and back",
}


def markdown(rows: list[dict], args, command: str, vocab: int) -> str:
    import torch

    lines = [
        "# The least a logprob answer costs",
        "",
        "Generated by the command below (`benches/answer_floor.py`; what each part is, in its "
        "docstring).",
        "",
        "```sh",
        command,
        "```",
        "",
        f"- {' and '.join(map(str, args.requests))} requests a call (all in one prefill, as the "
        f"engine bench sends them), vocabulary {vocab} (the engine tests' tiny Llama), "
        f"torch {torch.__version__}, one torch thread, Python "
        f"{'.'.join(map(str, sys.version_info[:3]))}; {args.rounds} rounds, each part timed by "
        "the thread's CPU clock, the garbage collector off while timing",
        "- CPU ms per request, the median over rounds (the range in brackets)",
        "- the objects, checked before timing: "
        + (
            f"equal to what SGLang {rows[0]['oracle']}'s own functions make of the same values "
            "(`TokenizerManager.detokenize_logprob_tokens` and `detokenize_top_logprobs_tokens`; "
            "`to_openai_style_logprobs`)"
            if rows and rows[0].get("oracle")
            else "their shape alone (SGLang did not import)"
        ),
        "",
        "| shape | requests a call | logprob rows a call | the arithmetic | the hand-over "
        "| the objects the client receives | JSON encoding | the client's parse | in all "
        "| the server's part | Python objects in the answer, per request |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            f"{r['ms'][p]:.3f} ({r['range'][p][0]:.3f}-{r['range'][p][1]:.3f})"
            if p in r["ms"]
            else "-"
            for p in ("arithmetic", "hand-over", "objects", "JSON encoding", "client's parse")
        ]
        lines.append(
            f"| {WHAT[r['shape']]} | {r['requests']} | {r['rows']:,} in {r['steps']} steps | "
            + " | ".join(cells)
            + f" | {r['total_ms']:.3f} | {r['server_ms']:.3f} | {r['objects']:,.0f} |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--requests", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    import torch
    from engine import models

    torch.set_num_threads(1)
    vocab = models.VOCAB
    release = release_functions()
    if release is not None:
        print(f"the objects are checked against SGLang {release[0]}'s own functions")
    rows = []
    for name in args.shapes:
        for n in args.requests:
            row = measure(name, n, args.rounds, vocab, release)
            row["oracle"] = None if release is None else release[0]
            rows.append(row)
            ms = ", ".join(f"{p} {v:.3f}" for p, v in row["ms"].items())
            print(f"{name}, {n}: {ms}; in all {row['total_ms']:.3f} ms a request", flush=True)
    where = "" if release is None else f"PYTHONPATH=$PWD/.sglang/{release[0]} "
    command = " ".join(
        [f"{where}.venv/bin/python", "benches/answer_floor.py", *(argv or sys.argv[1:])]
    )
    text = markdown(rows, args, command, vocab)
    if args.markdown:
        args.markdown.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
