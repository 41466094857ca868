"""Small Llamas under deferred init, for the planner's tests: 4 heads, 2 key-value heads, seed 0."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import explorer


def deferred_llama(layers: int, hidden_size: int, intermediate_size: int, vocab_size: int) -> torch.nn.Module:
    """A `LlamaForCausalLM` of `layers` decoder layers under `explorer.deferred_init`, from seed 0."""
    config = LlamaConfig(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
    )
    torch.manual_seed(0)
    return explorer.deferred_init(LlamaForCausalLM, config)
