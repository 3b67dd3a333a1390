"""Tiny random models for the engine tests, made on the spot.

The target is a 4-layer Llama written by ``transformers`` (config and random
weights, safetensors); the draft is an EAGLE3 head for it, its weights named
as SGLang's ``LlamaForCausalLMEagle3`` loads them. Nothing is downloaded. The
same seed gives the same bytes, so both sides of a comparison load the same
model.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

VOCAB = 384
HIDDEN = 64
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 128
LAYERS = 4
CONTEXT = 1024
AUX_LAYERS = (0, 1, 2)
"""The target layers whose hidden states the draft reads. SGLang's default
for a 4-layer target (2, 2, 1) repeats a layer; the draft config names its
own."""


def _llama_config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }


def make_target(where: Path, seed: int = 0) -> Path:
    """A 4-layer Llama with random weights, in ``where`` (made if missing)."""
    import torch
    from safetensors.torch import save_file

    where.mkdir(parents=True, exist_ok=True)
    config = _llama_config()
    g = torch.Generator().manual_seed(seed)
    d, h, kv = HIDDEN // HEADS, HIDDEN, KV_HEADS * (HIDDEN // HEADS)
    weights = {"model.embed_tokens.weight": _rand(g, VOCAB, h, scale=1.0)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": 1 + _rand(g, h, scale=0.1),
            p + "post_attention_layernorm.weight": 1 + _rand(g, h, scale=0.1),
            p + "self_attn.q_proj.weight": _rand(g, HEADS * d, h),
            p + "self_attn.k_proj.weight": _rand(g, kv, h),
            p + "self_attn.v_proj.weight": _rand(g, kv, h),
            p + "self_attn.o_proj.weight": _rand(g, h, HEADS * d),
            p + "mlp.gate_proj.weight": _rand(g, INTERMEDIATE, h),
            p + "mlp.up_proj.weight": _rand(g, INTERMEDIATE, h),
            p + "mlp.down_proj.weight": _rand(g, h, INTERMEDIATE),
        }
    weights["model.norm.weight"] = 1 + _rand(g, h, scale=0.1)
    weights["lm_head.weight"] = _rand(g, VOCAB, h, scale=0.5)
    save_file(weights, str(where / "model.safetensors"), metadata={"format": "pt"})
    (where / "config.json").write_text(json.dumps(config, indent=1))
    (where / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2})
    )
    return where


def make_draft(where: Path, seed: int = 1) -> Path:
    """An EAGLE3 head (one decoder layer over [embedding, fc(aux states)])."""
    import torch
    from safetensors.torch import save_file

    where.mkdir(parents=True, exist_ok=True)
    config = _llama_config() | {
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": 1,
        "draft_vocab_size": VOCAB,
        "target_hidden_size": HIDDEN,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS)},
    }
    g = torch.Generator().manual_seed(seed)
    d, h, kv = HIDDEN // HEADS, HIDDEN, KV_HEADS * (HIDDEN // HEADS)
    p = "midlayer."
    weights = {
        "embed_tokens.weight": _rand(g, VOCAB, h, scale=1.0),
        "fc.weight": _rand(g, h, h * len(AUX_LAYERS)),
        p + "hidden_norm.weight": 1 + _rand(g, h, scale=0.1),
        p + "input_layernorm.weight": 1 + _rand(g, h, scale=0.1),
        p + "post_attention_layernorm.weight": 1 + _rand(g, h, scale=0.1),
        # The draft's attention reads [embedding, hidden]: twice the width.
        p + "self_attn.q_proj.weight": _rand(g, HEADS * d, 2 * h),
        p + "self_attn.k_proj.weight": _rand(g, kv, 2 * h),
        p + "self_attn.v_proj.weight": _rand(g, kv, 2 * h),
        p + "self_attn.o_proj.weight": _rand(g, h, HEADS * d),
        p + "mlp.gate_proj.weight": _rand(g, INTERMEDIATE, h),
        p + "mlp.up_proj.weight": _rand(g, INTERMEDIATE, h),
        p + "mlp.down_proj.weight": _rand(g, h, INTERMEDIATE),
        "norm.weight": 1 + _rand(g, h, scale=0.1),
        "lm_head.weight": _rand(g, VOCAB, h, scale=0.5),
    }
    save_file(weights, str(where / "model.safetensors"), metadata={"format": "pt"})
    (where / "config.json").write_text(json.dumps(config, indent=1))
    return where


def _rand(g, *shape: int, scale: float | None = None):
    import torch

    # Fan-in scaling keeps the activations of a random network in range.
    s = scale if scale is not None else shape[-1] ** -0.5
    return torch.randn(*shape, generator=g) * s


# The tokenizer's fixed corpus: its merges are learned from it, so they are
# the same on every run. Multi-byte characters merge into whole ones here,
# while the model, with random weights, emits their bytes alone as well:
# single tokens that decode to partial UTF-8 (U+FFFD), as real byte-level
# vocabularies do.
CORPUS = (
    "the quick brown fox jumps over the lazy dog; the logprob of each token "
    "is read by the server, then the text of the token is decoded. "
    "café naïve résumé über straße 日本語 テキスト ∑ → ≤ 😀 "
    "in the beginning there was the word, and the word was with the other words "
    "print(len(tokens)) == 384 and not tokens[0] "
)
SPECIAL = {"<pad>": 0, "<s>": 1, "</s>": 2}
"""pad, bos and eos, as the model's config numbers them."""
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _byte_chars() -> list[str]:
    """The byte-level alphabet, indexed by byte: printable bytes stand for
    themselves, the others are shifted past 255 (the usual byte-level BPE
    mapping, so the pieces are valid text in a JSON vocabulary)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(shifted)) for b in range(256)]


def _merges(words: list[list[str]], count: int) -> list[tuple[str, str]]:
    """``count`` BPE merges of ``words``: the most frequent pair first, ties
    broken by the pair itself (deterministic)."""
    merges = []
    for _ in range(count):
        pairs: dict[tuple[str, str], int] = {}
        for word in words:
            for pair in itertools.pairwise(word):
                pairs[pair] = pairs.get(pair, 0) + 1
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for word in words:
            i = 0
            while i < len(word) - 1:
                if (word[i], word[i + 1]) == best:
                    word[i : i + 2] = [word[i] + word[i + 1]]
                i += 1
    return merges


def make_tokenizer(where: Path) -> Path:
    """A byte-level BPE tokenizer whose vocabulary is the model's exactly
    (``VOCAB`` ids: pad, bos, eos, the 256 bytes, then merges), saved so that
    ``transformers.AutoTokenizer.from_pretrained(where)`` loads it as a
    ``PreTrainedTokenizerFast``, with a minimal chat template. Made from the
    fixed corpus alone: the same bytes every time."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    where.mkdir(parents=True, exist_ok=True)
    chars = _byte_chars()
    vocab = dict(SPECIAL)
    for char in chars:
        vocab[char] = len(vocab)
    # The pre-tokenizer's pieces are already in the byte alphabet.
    words = [
        list(piece)
        for piece, _ in pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(CORPUS)
    ]
    merges = []
    for a, b in _merges(words, VOCAB):
        if len(vocab) == VOCAB:
            break
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
    assert len(vocab) == VOCAB, f"{len(vocab)} tokens, the model has {VOCAB}"
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL])
    tokenizer.save(str(where / "tokenizer.json"))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    config = specials | {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": CONTEXT,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (where / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (where / "special_tokens_map.json").write_text(json.dumps(specials, indent=1))
    return where
