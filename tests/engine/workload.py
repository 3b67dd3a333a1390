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
