"""Tiny checkpoint-backed modules for the provenance tests: safetensors files written in a test's
tmp_path, loaded into deferred modules (the "disk" state)."""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch
import torch
from torch import nn

import explorer
from explorer import deferred_init


class Pair(nn.Module):
    """Two linears (in the checkpoint) and a non-persistent buffer (never in it: stays "fake")."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 3)
        self.second = nn.Linear(3, 2)
        self.register_buffer("scale", torch.ones(2), persistent=False)


def pair_weights() -> dict[str, torch.Tensor]:
    """The checkpoint's bfloat16 tensors, in the order `save_file` is given them."""
    generator = torch.Generator().manual_seed(0)
    shapes = {"first.weight": (3, 4), "first.bias": (3,), "second.weight": (2, 3), "second.bias": (2,)}
    return {key: torch.randn(shape, generator=generator).to(torch.bfloat16) for key, shape in shapes.items()}


def loaded_pair(directory: Path) -> tuple[nn.Module, Path]:
    """A deferred `Pair` with `pair.safetensors` (bfloat16 on disk) loaded into it, and the file."""
    file = directory / "pair.safetensors"
    safetensors.torch.save_file(pair_weights(), file)
    module = deferred_init(Pair)
    explorer.load_checkpoint(module, file)
    return module, file


def data_at(file: Path, offset: int, nbytes: int) -> bytes:
    with open(file, "rb") as stream:
        stream.seek(offset)
        return stream.read(nbytes)


def saved_tiny_llama(directory: Path, *, layers: int = 2) -> dict[str, str]:
    """A tiny bfloat16 Llama saved in shards under `directory`; returns the index's key → shard map."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory, max_shard_size="4KB")
    return json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]


def deferred_tiny_llama(directory: Path) -> nn.Module:
    """`LlamaForCausalLM.from_pretrained(directory, dtype=float32)` under deferred_init."""
    import transformers

    return deferred_init(transformers.LlamaForCausalLM.from_pretrained, directory, dtype=torch.float32)
