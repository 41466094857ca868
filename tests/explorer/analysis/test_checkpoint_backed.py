"""What works on deferred models keeps working when their tensors come from a checkpoint: the
analyses run on the read ops' fakes, read no bytes, and materialization still equals eager loading."""

from __future__ import annotations

import pytest
import torch

import explorer
from explorer import deferred_init, dry_run, inspect, materialize_module, plan_devices

transformers = pytest.importorskip("transformers")


@pytest.fixture
def checkpoint_backed(tmp_path):  # noqa: ANN201
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="30KB")
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, tmp_path, dtype=torch.float32)
    eager = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    return model, eager


def test_dry_run_plan_devices_and_search_of_a_checkpoint_backed_model_read_nothing(checkpoint_backed, tmp_path):
    model, eager = checkpoint_backed
    for file in tmp_path.glob("*.safetensors"):
        file.write_bytes(file.read_bytes()[:8])  # no tensor data left: any read would fail
    run = dry_run(model, torch.zeros(1, 5, dtype=torch.long))
    assert run.modules.loc[run.modules["name"] == "lm_head", "output_shapes"].tolist() == [[(1, 5, 256)]]
    assert run.flops == dry_run(eager, torch.zeros(1, 5, dtype=torch.long)).flops
    plan = plan_devices(model, {"cpu": "10GB"})
    assert set(plan.device_map.values()) == {"cpu"}
    found = inspect(model).search("layers.1.mlp.up_proj")
    assert found.tensors == ["model.layers.1.mlp.up_proj.weight"]
    assert all(explorer.is_fake(tensor) for tensor in model.state_dict(keep_vars=True).values())


def test_inspect_counts_a_checkpoint_backed_model_like_the_eager_one(checkpoint_backed):
    model, eager = checkpoint_backed
    deferred_table, eager_table = inspect(model).tensors, inspect(eager).tensors
    assert deferred_table["name"].tolist() == eager_table["name"].tolist()
    assert deferred_table["shape"].tolist() == eager_table["shape"].tolist()
    assert deferred_table["dtype"].tolist() == eager_table["dtype"].tolist()
    materialize_module(model.model.layers[0])
    for name, tensor in eager.model.layers[0].state_dict().items():
        assert torch.equal(model.model.layers[0].state_dict()[name], tensor), name
