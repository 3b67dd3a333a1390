"""The requests the engine tests send: deterministic from a seed, and built
to reach every path flatgather patches.

Every request carries input ids (the engine runs without a tokenizer). Among
them: prompts from 1 token to several chunks long, ``logprob_start_len`` at
every boundary (the default, 0, 1, the middle, the last token, the length
itself), top-k 0, 1 and 5 mixed, token-id lists ``None``, empty and ragged,
and requests that ask for no logprobs at all.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from models import VOCAB


@dataclass(frozen=True)
class Request:
    input_ids: list[int]
    max_new_tokens: int
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    token_ids_logprob: list[int] | None

    ignore_eos: bool = False

    def as_kwargs(self) -> dict:
        sampling = {"max_new_tokens": self.max_new_tokens, "temperature": 0.0}
        if self.ignore_eos:
            sampling["ignore_eos"] = True
        return {
            "input_ids": self.input_ids,
            "sampling_params": sampling,
            "return_logprob": self.return_logprob,
            "logprob_start_len": self.logprob_start_len,
            "top_logprobs_num": self.top_logprobs_num,
            "token_ids_logprob": self.token_ids_logprob,
        }


def _starts(length: int) -> list[int]:
    """Every boundary of a prompt of ``length`` tokens (-1 is the default:
    no input logprobs but the last)."""
    return sorted({-1, 0, min(1, length - 1), length // 2, length - 1, length})


def requests(
    n: int,
    seed: int = 0,
    max_len: int = 150,
    new_tokens: tuple[int, int] = (1, 6),
    min_len: int = 1,
    ignore_eos: bool = False,
    descending: bool = False,
    mixed_ids: bool = True,
    all_logprobs: bool = False,
):
    """``n`` requests; the first few are the named edge cases (a one-token
    prompt, a start at the last token, ragged ids), the rest random. With
    ``min_len`` above 1 every prompt is at least that long (no edge cases);
    with ``descending``, each prompt is shorter than the one before, so that
    SGLang's retraction (fewest outputs, then the longest prompt, first) picks
    the first request of a prefill batch. Without ``mixed_ids`` every
    request asks for logprobs with one id or more: the releases up to 0.5.20
    fill a row without ids with a list, and their own scheduler then fails on
    ``list.tolist()`` when a batch mixes requests with ids and without.
    ``all_logprobs`` makes every request the bench's: input logprobs from
    its first token, the top 5, three token ids."""
    rng = random.Random(seed)
    out: list[Request] = []
    lengths = [1, 2, 3, max_len, max_len // 2 + 1] if min_len <= 1 else []
    for i in range(n):
        # Two in three short, so that a prefill batch holds many requests;
        # the rest up to several chunks long.
        short = rng.random() < 2 / 3
        if descending:
            length = max(min_len, max_len - i)
        elif i < len(lengths):
            length = lengths[i]
        else:
            length = rng.randint(min_len, max(min_len, 16) if short else max_len)
        ids = [rng.randrange(3, VOCAB) for _ in range(length)]
        # One request in seven asks for no logprobs.
        wants = i % 7 != 6 or not mixed_ids
        start = _starts(length)[i % len(_starts(length))]
        token_ids = (None, [], [rng.randrange(VOCAB)], [rng.randrange(VOCAB) for _ in range(3)])[
            # The first request's is a list: SGLang reads a batch's shape
            # from its first entry.
            (i // 2 + 2) % 4 if mixed_ids else 2 + i % 2
        ]
        if all_logprobs:
            out.append(
                Request(
                    input_ids=ids,
                    max_new_tokens=rng.randint(*new_tokens),
                    return_logprob=True,
                    logprob_start_len=0,
                    top_logprobs_num=5,
                    token_ids_logprob=[rng.randrange(VOCAB) for _ in range(3)],
                    ignore_eos=ignore_eos,
                )
            )
            continue
        out.append(
            Request(
                input_ids=ids,
                max_new_tokens=rng.randint(*new_tokens),
                return_logprob=wants,
                logprob_start_len=start,
                top_logprobs_num=(0, 1, 5)[i % 3] if wants else 0,
                token_ids_logprob=token_ids if wants else None,
                ignore_eos=ignore_eos,
            )
        )
    return out


# Text prompts for the front end: ASCII, accented and CJK text and an emoji,
# so that the tokenizer's pieces (and the model's answers) include tokens
# that are part of a character (they decode to U+FFFD alone).
PROMPTS = (
    "the quick brown fox",
    "café naïve 日本語 😀 → the word",
    "print(len(tokens))",
)


def _logprob_fields(rng: random.Random, start: int = 0) -> dict:
    return {
        "return_logprob": True,
        "logprob_start_len": start,
        "top_logprobs_num": 5,
        # Special ids among them: their text is the special token's.
        "token_ids_logprob": [0, 2, *(rng.randrange(VOCAB) for _ in range(3))],
        "return_text_in_logprobs": True,
    }


def front_end_calls(seed: int = 0) -> list[tuple[str, str, dict]]:
    """The front-end scenario's HTTP calls, in order: ``(name, path, body)``.

    ``/generate`` as a batch with input logprobs from the first token, the
    top 5, token ids and their text, then one request of it streamed;
    ``/v1/completions`` in the shape evaluation harnesses send to score
    text (``echo``, ``logprobs: 5``, ``max_tokens`` 0 and 1) and a plain
    one, streamed and not; ``/v1/chat/completions`` with ``top_logprobs: 5``,
    streamed and not. Greedy everywhere."""
    rng = random.Random(seed)
    batch = requests(5, seed=seed, max_len=40, new_tokens=(3, 8), all_logprobs=True)
    ids = [r.input_ids for r in batch]
    greedy = {"temperature": 0.0}
    generate = {
        "input_ids": ids,
        "sampling_params": [greedy | {"max_new_tokens": r.max_new_tokens} for r in batch],
        "return_logprob": True,
        "logprob_start_len": [0, 0, 1, len(ids[3]) // 2, -1],
        "top_logprobs_num": [5, 5, 1, 0, 5],
        "token_ids_logprob": [[0, 2, *(rng.randrange(VOCAB) for _ in range(2))] for _ in batch],
        "return_text_in_logprobs": True,
    }
    one = {
        "text": PROMPTS[1],
        "sampling_params": greedy | {"max_new_tokens": 8, "ignore_eos": True},
        **_logprob_fields(rng),
    }
    completions = {"model": "default", "temperature": 0.0, "logprobs": 5}
    scoring = completions | {"echo": True}
    chat = {
        "model": "default",
        "messages": [{"role": "user", "content": PROMPTS[1]}],
        "temperature": 0.0,
        "max_tokens": 8,
        "logprobs": True,
        "top_logprobs": 5,
    }
    return [
        ("generate batch", "/generate", generate),
        ("generate stream", "/generate", one | {"stream": True}),
        ("generate one", "/generate", one),
        # 0.5.23 refuses max_tokens 0 (400, "max_tokens must be positive"):
        # the refusal's bytes are compared like any answer.
        (
            "completions echo, max_tokens 0",
            "/v1/completions",
            scoring | {"prompt": list(PROMPTS[:2]), "max_tokens": 0},
        ),
        (
            "completions echo, max_tokens 1",
            "/v1/completions",
            scoring | {"prompt": list(PROMPTS[:2]), "max_tokens": 1},
        ),
        (
            "completions echo, max_tokens 1, stream",
            "/v1/completions",
            scoring | {"prompt": PROMPTS[1], "max_tokens": 1, "stream": True},
        ),
        (
            "completions, max_tokens 8",
            "/v1/completions",
            completions | {"prompt": PROMPTS[2], "max_tokens": 8},
        ),
        (
            "completions, max_tokens 8, stream",
            "/v1/completions",
            completions | {"prompt": PROMPTS[2], "max_tokens": 8, "stream": True},
        ),
        ("chat", "/v1/chat/completions", chat),
        ("chat, stream", "/v1/chat/completions", chat | {"stream": True}),
    ]


def front_end_engine_calls(seed: int = 0) -> list[tuple[str, dict]]:
    """``Engine.generate`` calls: a batch of ids and one text prompt with
    ``return_text_in_logprobs``, then the batch without it (the logprob
    tuples' text is None)."""
    rng = random.Random(seed)
    batch = requests(3, seed=seed, max_len=30, new_tokens=(3, 6), all_logprobs=True)
    greedy = {"temperature": 0.0}
    plain = {
        "input_ids": [r.input_ids for r in batch],
        "sampling_params": [greedy | {"max_new_tokens": r.max_new_tokens} for r in batch],
        **_logprob_fields(rng),
    }
    del plain["return_text_in_logprobs"]
    return [
        (
            "batch",
            {
                "input_ids": [r.input_ids for r in batch],
                "sampling_params": [greedy | {"max_new_tokens": r.max_new_tokens} for r in batch],
                **_logprob_fields(rng),
            },
        ),
        (
            "text",
            {
                "prompt": PROMPTS[1],
                "sampling_params": greedy | {"max_new_tokens": 6, "ignore_eos": True},
                **_logprob_fields(rng, start=1),
            },
        ),
        ("batch, no text", plain),
    ]
