"""A tiny Llama config for tests that build real models quickly (the stand-in's family, 2 layers, 512 tokens)."""

from __future__ import annotations

from typing import Any

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "tie_word_embeddings": True,
    "max_position_embeddings": 128,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
}


def tiny_config(**overrides: Any) -> Any:
    """:data:`TINY` (with ``overrides``) as a transformers config."""
    from transformers import AutoConfig

    return AutoConfig.for_model(**{**TINY, **overrides})
