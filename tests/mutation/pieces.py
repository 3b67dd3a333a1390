"""Tokenizers as the OpenAI layer's byte helpers read them (0.5.21+'s
``_lossless_token_text`` and the functions it calls): a vocabulary's size,
each id's piece, and at times an ``is_byte_level`` flag. Each is made once
and kept for the whole run, so that a release module's cache of byte-level
tokenizers, kept by ``id()``, never meets a reused id.

Their pieces are drawn to reach every branch of those helpers: byte-level
pieces (each byte written as the GPT-2 byte-to-character table writes it)
whose bytes are a valid UTF-8 text or a fragment of one, SentencePiece-style
pieces holding characters outside that table, empty and ``None`` pieces, ids
past the vocabulary, a flag that is not a bool and a vocabulary that cannot
be read.
"""

from __future__ import annotations

import functools
import random


def _printable() -> list[int]:
    """The bytes the table writes as themselves: ``!`` to ``~``, ``¡`` to
    ``¬`` and ``®`` to ``ÿ``."""
    return [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]


@functools.cache
def byte_chars() -> dict[int, str]:
    """Each byte's character in a byte-level piece: itself where printable,
    else the next code point from 256 up, in byte order."""
    kept = set(_printable())
    shifted = iter(range(256, 512))
    return {b: chr(b) if b in kept else chr(next(shifted)) for b in range(256)}


def byte_piece(data: bytes) -> str:
    return "".join(byte_chars()[b] for b in data)


_UNSET = object()


class PieceTokenizer:
    """A vocabulary of ``pieces`` (``convert_ids_to_tokens`` raises
    ``IndexError`` past it), with ``is_byte_level`` set where given."""

    def __init__(self, name: str, pieces: list, is_byte_level=_UNSET, vocab_fails=False):
        self.name, self.pieces, self.vocab_fails = name, pieces, vocab_fails
        if is_byte_level is not _UNSET:
            self.is_byte_level = is_byte_level

    def __repr__(self) -> str:
        return f"<{self.name} tokenizer>"

    def get_vocab(self) -> dict[str, int]:
        if self.vocab_fails:
            raise RuntimeError("no vocabulary")
        return {f"piece{i}": i for i in range(len(self.pieces))}

    def convert_ids_to_tokens(self, token_id: int):
        if not 0 <= token_id < len(self.pieces):
            raise IndexError(token_id)
        return self.pieces[token_id]


def _sampled(n: int) -> set[int]:
    """The ids the release's byte-level probe reads of a vocabulary of ``n``."""
    return {i for i in (0, 1, 2, 3, n // 2, n - 2) if 0 <= i < n}


def _draw_pieces(rng: random.Random, n: int, holes: bool = False, foreign: int | None = None):
    """``n`` pieces, those of the ids the probe reads byte-level; with
    ``holes`` the first two of those empty and ``None``; with ``foreign`` the
    one at that place among them a SentencePiece piece."""
    fragment = lambda: bytes([rng.randrange(0x80, 0x100)])  # noqa: E731
    whole = lambda: rng.choice(("é", "€", "ab", "\ufffd", "∑x", " z")).encode()  # noqa: E731
    any_byte = lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))  # noqa: E731

    def other():
        roll = rng.random()
        if roll < 0.35:
            return byte_piece(fragment())
        if roll < 0.6:
            return byte_piece(whole())
        if roll < 0.8:
            return byte_piece(any_byte())
        if roll < 0.9:
            return rng.choice(("▁é", "▁the", "日本", chr(0x144), chr(0x1FF)))
        return rng.choice(("", None))

    pieces = [other() for _ in range(n)]
    probed = sorted(_sampled(n))
    for k, i in enumerate(probed):
        pieces[i] = byte_piece(any_byte())
        if holes and k < 2:
            pieces[i] = ("", None)[k]
    if foreign is not None:
        pieces[probed[foreign]] = "▁é"
    return pieces


@functools.cache
def tokenizers() -> tuple[PieceTokenizer, ...]:
    rng = random.Random("flatgather-mutation-pieces")
    return (
        PieceTokenizer("byte-level", _draw_pieces(rng, 40)),
        PieceTokenizer("byte-level, flagged", _draw_pieces(rng, 40), is_byte_level=True),
        PieceTokenizer("byte-level, empty and None probed", _draw_pieces(rng, 40, holes=True)),
        PieceTokenizer("three pieces", _draw_pieces(rng, 3)),
        PieceTokenizer("two pieces", _draw_pieces(rng, 2)),
        PieceTokenizer("one piece", _draw_pieces(rng, 1)),
        *(
            PieceTokenizer(f"sentencepiece at probe {k}", _draw_pieces(rng, 40, foreign=k))
            for k in range(6)
        ),
        PieceTokenizer(
            "sentencepiece after empty and None",
            _draw_pieces(rng, 40, holes=True, foreign=5),
        ),
        PieceTokenizer("sentencepiece, flagged", _draw_pieces(rng, 40), is_byte_level=False),
        PieceTokenizer("flag not a bool", _draw_pieces(rng, 40), is_byte_level=1),
        PieceTokenizer("no vocabulary", _draw_pieces(rng, 40), vocab_fails=True),
    )


@functools.cache
def every_byte() -> PieceTokenizer:
    """Piece ``b`` holds byte ``b`` then 0xFF, for every byte; two more hold
    characters the byte table does not write (U+0144, past its last, and
    U+0190); the probe's ids hold byte pieces."""
    made = [byte_piece(bytes([b, 0xFF])) for b in range(256)]
    made += [chr(0x144), "a" + chr(0x190), byte_piece(b"\xff"), byte_piece(b"\xfe\xfe")]
    return PieceTokenizer("every byte", made)


@functools.cache
def _byte_of() -> dict[str, int]:
    return {c: b for b, c in byte_chars().items()}


def text_for(rng: random.Random, tokenizer: PieceTokenizer, token_id) -> str | None:
    """The display text an engine might send with the id: at times
    ``None``, at times U+FFFD alone or with more, else the piece's bytes
    decoded (U+FFFD where they are a fragment) or a plain word."""
    roll = rng.random()
    if roll < 0.15:
        return None
    if roll < 0.35:
        return rng.choice(("\ufffd", "a\ufffd", "\ufffd\ufffd"))
    if roll < 0.85 and isinstance(token_id, int) and 0 <= token_id < len(tokenizer.pieces):
        piece = tokenizer.pieces[token_id] or ""
        if all(c in _byte_of() for c in piece):
            return bytes(_byte_of()[c] for c in piece).decode("utf-8", "replace")
    return rng.choice(("word", "é", " x"))
