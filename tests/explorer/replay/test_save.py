"""save_checkpoint writes a deferred model in eager's values, a shard at a time, in Hugging Face's
layout; nothing partial is left under a final name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import explorer
from explorer import deferred_init, save_checkpoint

transformers = pytest.importorskip("transformers")


def tiny_config(tie: bool = False) -> "transformers.LlamaConfig":
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=256, tie_word_embeddings=tie)


def saved(directory) -> dict[str, torch.Tensor]:  # noqa: ANN001
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied-embeddings"])
def test_a_deferred_llama_saved_in_shards_equals_eager_and_loads_with_from_pretrained(tmp_path, tie):
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(tiny_config(tie))
    torch.manual_seed(0)
    model = deferred_init(transformers.LlamaForCausalLM, tiny_config(tie))
    written = save_checkpoint(model, tmp_path, max_shard_size="40KB")
    assert explorer.is_deferred(model)  # nothing swapped into the module
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and [p.name for p in written] == [*shards, "model.safetensors.index.json"]
    stored = saved(tmp_path)
    expected = {name: tensor for name, tensor in eager.state_dict().items() if not (tie and name == "lm_head.weight")}
    assert sorted(stored) == sorted(expected)
    assert all(torch.equal(stored[name], tensor) for name, tensor in expected.items())
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    for name, tensor in eager.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert not list(tmp_path.glob(".*partial"))


def test_a_timm_model_saved_as_one_file_in_bfloat16_equals_eager_converted(tmp_path):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    eager = timm.create_model("resnet10t")
    torch.manual_seed(0)
    model = deferred_init(timm.create_model, "resnet10t")
    save_checkpoint(model, tmp_path, dtype=torch.bfloat16)
    stored = load_file(tmp_path / "model.safetensors")
    for name, tensor in eager.state_dict().items():
        expected = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert stored[name].dtype == expected.dtype and torch.equal(stored[name], expected), name


def test_a_cancel_mid_way_leaves_only_complete_shards(tmp_path):
    model = deferred_init(lambda: nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]))

    def cancel_after_two(done: int, total: int, done_bytes: int, total_bytes: int) -> None:
        if done >= 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(model, tmp_path, max_shard_size="17KB", progress=cancel_after_two)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-00001-of-00004.safetensors",
                                                          "model-00002-of-00004.safetensors"]


def test_a_write_that_fails_leaves_no_partial_file_and_names_it(tmp_path, monkeypatch):
    import safetensors.torch

    def disk_full(tensors, filename, metadata=None):  # noqa: ANN001, ANN202
        open(filename, "wb").write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    with pytest.raises(OSError, match=r"writing .*model.safetensors failed: No space left on device"):
        save_checkpoint(deferred_init(nn.Linear, 4, 4), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"max_shard_size='5 parsecs': expected bytes"):
        save_checkpoint(deferred_init(nn.Linear, 4, 4), tmp_path, max_shard_size="5 parsecs")
    with pytest.raises(ValueError, match=r"format='dcp': save_checkpoint writes 'safetensors'"):
        save_checkpoint(deferred_init(nn.Linear, 4, 4), tmp_path, format="dcp")
    assert list(tmp_path.iterdir()) == []
