"""What a flat wire could save: one output message of the scheduler,
pickled by the release's own ``sock_send`` and unpickled as its reader does,
against the least a flat encoding of the same logprob lists must cost.

    PYTHONPATH=$PWD/.sglang/0.5.23 .venv/bin/python benches/wire.py

The message is the release's ``BatchTokenIDOutput`` for 64 requests of each
shape the engine bench sends (echo scoring: 300 prompt positions with the
top 5 and one output token; ``Engine.generate``: 16-64 prompt positions and
16-32 output tokens, top 5 and 3 token ids each). Per request:

- *send*: the release's ``sock_send`` on a socket that pickles as ZeroMQ's
  does, against flattening the same lists into typed arrays
  (``array.array`` over the chained rows, the ``None`` bookkeeping left
  out), the least a sender of a flat wire must spend;
- *receive*: ``pickle.loads`` of those bytes, against building the same
  nested lists from the arrays (``tolist()`` and one slice per row), the
  least a reader that needs the release's lists must spend.

The figure is the release's time over the floor's (median of per-round
ratios, 95% bootstrap interval), samples interleaved, torch pinned to one
thread, the garbage collector off while timing (both sides make the same
objects). Below about 1.1x on the receiving side, a wire that hands the reader
the release's lists cannot pay for its sending side: the Python objects are
the cost, not the pickle.
"""

from __future__ import annotations

import gc
import itertools
import pickle
import random
import sys
from array import array

from side_by_side import SideBySide, arguments  # beside this script, first on sys.path

SHAPES = (
    # name, prompt positions (low, high), output tokens (low, high), top k, token ids
    ("echo scoring: 300 positions, top 5", (300, 300), (1, 1), 5, 0),
    ("Engine.generate: 16-64 positions, 16-32 outputs, top 5, 3 ids", (16, 64), (16, 32), 5, 3),
)
REQUESTS = 64


class PicklingSocket:
    def send_pyobj(self, obj, flags=0, protocol=pickle.DEFAULT_PROTOCOL, **kwargs):
        self.data = pickle.dumps(obj, protocol)


def fields(rng: random.Random, prompt, output, k: int, ids: int) -> dict:
    """The logprob fields of one message, as the scheduler fills them: a
    list over the requests, input lists led by ``None``."""

    def value():
        return rng.uniform(-12.0, 0.0)

    def token():
        return rng.randrange(150_000)

    out: dict[str, list] = {}
    for _ in range(REQUESTS):
        n, m = rng.randint(*prompt), rng.randint(*output)
        row = {
            "input_token_logprobs_val": [None, *(value() for _ in range(n - 1))],
            "input_token_logprobs_idx": [token() for _ in range(n)],
            "output_token_logprobs_val": [value() for _ in range(m)],
            "output_token_logprobs_idx": [token() for _ in range(m)],
            "input_top_logprobs_val": [None, *([value() for _ in range(k)] for _ in range(n - 1))],
            "input_top_logprobs_idx": [None, *([token() for _ in range(k)] for _ in range(n - 1))],
            "output_top_logprobs_val": [[value() for _ in range(k)] for _ in range(m)],
            "output_top_logprobs_idx": [[token() for _ in range(k)] for _ in range(m)],
        }
        if ids:
            chosen = [token() for _ in range(ids)]
            row |= {
                "input_token_ids_logprobs_val": [
                    None,
                    *([value() for _ in chosen] for _ in range(n - 1)),
                ],
                "input_token_ids_logprobs_idx": [None, *(list(chosen) for _ in range(n - 1))],
                "output_token_ids_logprobs_val": [[value() for _ in chosen] for _ in range(m)],
                "output_token_ids_logprobs_idx": [list(chosen) for _ in range(m)],
            }
        for name, v in row.items():
            out.setdefault(name, []).append(v)
    return out


def _flat(field: list) -> tuple[array, list[int] | None]:
    """A field's values as one typed array, and its rows' lengths where its
    items are rows (the ``None`` items dropped, not recorded: a floor)."""
    items = [x for x in itertools.chain.from_iterable(field) if x is not None]
    lengths = None
    if items and type(items[0]) is list:
        lengths = list(map(len, items))
        items = list(itertools.chain.from_iterable(items))
    code = "q" if items and type(items[0]) is int else "d"
    return array(code, items), lengths


def flatten(message: dict) -> list:
    return [_flat(field) for field in message.values()]


def rebuild(flat: list) -> list:
    out = []
    for values, lengths in flat:
        items = values.tolist()
        if lengths is not None:
            ends = list(itertools.accumulate(lengths))
            items = list(map(items.__getitem__, map(slice, [0, *ends[:-1]], ends)))
        out.append(items)
    return out


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, argv)
    import sglang
    import sglang.srt.managers.io_struct as io

    cls = io.BatchTokenIDOutput
    send = SideBySide(args.samples, args.sample_s)
    receive = SideBySide(args.samples, args.sample_s)
    print(
        f"SGLang {sglang.__version__}, pickle IPC {io._USE_PICKLE_IPC}, {REQUESTS} requests "
        f"a message, torch threads 1, {args.samples} rounds per shape; times per request"
    )
    rng = random.Random(0)
    # Both sides make the same objects; a full collection falling in one
    # side's sample would swamp the comparison, so none runs while timing.
    gc.disable()
    for name, prompt, output, k, ids in SHAPES:
        message = fields(rng, prompt, output, k, ids)
        obj = cls(**dict.fromkeys(cls.__struct_fields__))
        for field, value in message.items():
            setattr(obj, field, value)
        socket = PicklingSocket()
        io.sock_send(socket, obj)
        data = socket.data
        flat = flatten(message)
        # What the floor builds is what the release's reader gets, the
        # dropped Nones apart.
        read = pickle.loads(data)
        rebuilt = rebuild(flat)
        for (field, value), again in zip(message.items(), rebuilt, strict=True):
            kept = [x for x in itertools.chain.from_iterable(getattr(read, field)) if x is not None]
            if kept != again or value != getattr(read, field):
                print(f"{name}: {field} read back differently", file=sys.stderr)
                return 1
        print(f"{name}: {len(data) / REQUESTS:,.0f} bytes pickled a request")
        send.measure(name, lambda o=obj, s=socket: io.sock_send(s, o), lambda m=message: flatten(m))
        receive.measure(name, lambda d=data: pickle.loads(d), lambda f=flat: rebuild(f))
    for bench, what in (
        (send, "sending one message (release: `sock_send`; floor: flattening into arrays)"),
        (receive, "receiving it (release: `pickle.loads`; floor: the same lists from arrays)"),
    ):
        bench.report(f"{what}, per request", per=REQUESTS, names=("release", "floor"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
