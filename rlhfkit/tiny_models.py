"""Tiny randomly initialised Llama models with a real tokenizer: the models of the tests and of the benchmarks'
fast settings (2 layers, d=64 unless asked otherwise)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerBase

from .models import disable_dropout, load_tokenizer
from .vocab import match_vocab


def tiny_config(tokenizer: PreTrainedTokenizerBase, hidden_size: int = 64, layers: int = 2) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )


def tiny_policy(
    tokenizer_source: str = "smollm2-135m", seed: int = 0, hidden_size: int = 64, layers: int = 2
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """A randomly initialised 2-layer Llama with the real tokenizer of `tokenizer_source`, for tests."""
    tokenizer = load_tokenizer(tokenizer_source)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(tokenizer, hidden_size, layers), dtype=torch.float32)
    match_vocab(model, tokenizer)
    return disable_dropout(model), tokenizer


def save_tiny_policy(folder: str | Path, **kwargs) -> Path:
    model, tokenizer = tiny_policy(**kwargs)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)
