"""plan_devices: whole submodules to devices in order, tied tensors together, sizes checked by hand
and against `accelerate.infer_auto_device_map`; the plan materializes through materialize_module."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers
from accelerate.utils import modeling as accelerate_modeling
from torch import nn

from explorer import (
    DevicePlanError,
    MaterializationError,
    deferred_init,
    is_deferred,
    materialize_module,
    plan_devices,
)
from explorer.analysis.memory_plan import parse_size
from explorer.inspection.census import take_census
from tests.support.hf_configs import HF_BY_NAME, build_eager

LINEAR_10 = (10 * 10 + 10) * 4  # bytes of nn.Linear(10, 10) in float32


def resolve(device_map: dict, name: str):
    """accelerate's rule: the device of the longest dotted prefix present in the map."""
    probe = name
    while probe not in device_map:
        probe = probe.rpartition(".")[0] if probe else None
        assert probe is not None, name
    return device_map[probe]


def test_modules_fill_devices_in_order():
    model = deferred_init(lambda: nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10), nn.Linear(10, 10)))
    plan = plan_devices(model, {"cpu": 1000, "meta": 1000})
    assert plan.device_map == {"0": "cpu", "1": "cpu", "2": "meta"}
    assert plan.table.to_dict("list") == {
        "device": ["cpu", "meta"],
        "budget_bytes": [1000, 1000],
        "planned_bytes": [2 * LINEAR_10, LINEAR_10],
        "free_bytes": [1000 - 2 * LINEAR_10, 1000 - LINEAR_10],
        "entries": [2, 1],
    }


def test_whole_module_on_one_device_is_one_entry():
    model = deferred_init(lambda: nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10)))
    assert plan_devices(model, {"cpu": "1KB"}).device_map == {"": "cpu"}


def test_module_too_big_for_what_is_left_is_split_into_children():
    model = deferred_init(lambda: nn.Sequential(nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10)), nn.Linear(10, 10)))
    plan = plan_devices(model, {"cpu": 600, "meta": 2000})
    assert plan.device_map == {"0.0": "cpu", "0.1": "meta", "1": "meta"}
    assert plan.table["planned_bytes"].tolist() == [LINEAR_10, 2 * LINEAR_10]


def test_no_split_classes_move_whole():
    model = deferred_init(lambda: nn.Sequential(nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10)), nn.Linear(10, 10)))
    plan = plan_devices(model, {"cpu": 600, "meta": 2000}, no_split=[nn.Sequential])
    assert plan.device_map == {"": "meta"}  # the root is a Sequential too
    plan = plan_devices(model, {"cpu": 600, "meta": 2000}, no_split=["Linear"])
    assert plan.device_map == {"0.0": "cpu", "0.1": "meta", "1": "meta"}


class TiedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)  # 160 B
        self.middle = nn.Linear(4, 4)  # 80 B
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied: 0 extra bytes


def test_tied_tensors_stay_together():
    model = deferred_init(TiedHead)
    plan = plan_devices(model, {"cpu": 200, "meta": 1000})
    # The root does not fit; embed pulls head (its tie) along; middle no longer fits.
    assert plan.device_map == {"embed": "cpu", "middle": "meta", "head": "cpu"}
    assert plan.table["planned_bytes"].tolist() == [160, 80]
    materialize_module(model, device=plan)
    assert model.head.weight is model.embed.weight and model.embed.weight.device.type == "cpu"
    assert model.middle.weight.device.type == "meta"


def test_nothing_fits_names_the_module_and_its_bytes():
    model = deferred_init(lambda: nn.Sequential(nn.Linear(10, 10), nn.Linear(100, 100)))
    with pytest.raises(DevicePlanError) as error:
        plan_devices(model, {"cpu": 1000, "meta": "2KB"})
    assert str(error.value) == (
        "'1' (Linear) needs 40,400 bytes and fits on no device; bytes left: cpu: 560, meta: 2,000"
    )


def test_tied_group_that_fits_nowhere_is_named_whole():
    model = deferred_init(TiedHead)
    with pytest.raises(DevicePlanError) as error:
        plan_devices(model, {"cpu": 100})
    assert str(error.value) == (
        "'embed' + 'head' needs 160 bytes (tied tensors stay together) and fits on no device; bytes left: cpu: 100"
    )


@pytest.mark.parametrize(
    "text, expected",
    [("20GB", 20 * 10**9), ("16GiB", 16 * 2**30), ("1.5MB", 1_500_000), ("512 kib", 512 * 1024), (123, 123)],
)
def test_budget_sizes(text, expected):
    assert parse_size(text) == expected


def test_unreadable_budget_is_refused():
    with pytest.raises(DevicePlanError, match=r"^budget for cuda:0: cannot read size '20 gigs'"):
        plan_devices(nn.Linear(2, 2), {"cuda": "20 gigs"})


def test_plan_materializes_with_eager_values():
    arch = HF_BY_NAME["llama"]
    torch.manual_seed(0)
    model = deferred_init(arch.cls, arch.config())
    plan = plan_devices(model, {"cpu": 60_000, "meta": 10**6}, no_split=["LlamaDecoderLayer"])
    assert plan.device_map == {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "meta",
                               "model.norm": "meta", "model.rotary_emb": "meta", "lm_head": "meta"}
    rng = torch.get_rng_state()
    plan.materialize(model.model.layers[1])  # a submodule: names resolve through its path
    plan.materialize(model)
    assert torch.equal(torch.get_rng_state(), rng)
    assert not is_deferred(model)
    eager = dict(build_eager(arch).named_parameters())
    for name, tensor in model.named_parameters():
        assert tensor.device.type == plan.device_for(name).split(":")[0], name
        if tensor.device.type == "cpu":
            assert torch.equal(tensor, eager[name]), name


def test_plan_onto_absent_device_refuses_before_changing_anything():
    model = deferred_init(lambda: nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10)))
    plan = plan_devices(model, {"cpu": 500, "cuda:3": 1000})
    with pytest.raises(MaterializationError, match=r"cannot materialize onto cuda:3"):
        materialize_module(model, device=plan)
    assert is_deferred(model[0]) and is_deferred(model[1])


def test_eager_and_deferred_modules_get_the_same_plan():
    arch = HF_BY_NAME["qwen2"]  # tied embeddings
    budgets = {"cuda:0": 40_000, "cuda:1": 30_000, "cpu": 10**6}
    eager = plan_devices(build_eager(arch), budgets)
    deferred = plan_devices(deferred_init(arch.cls, arch.config()), budgets)
    assert eager.device_map == deferred.device_map
    assert eager.table.equals(deferred.table)


@pytest.mark.parametrize("arch_name, no_split", [("llama", ["LlamaDecoderLayer"]), ("qwen2", ["Qwen2DecoderLayer"])])
@pytest.mark.parametrize("fractions", [(0.9, 0.5), (0.5, 0.3)])
def test_plan_reproduces_accelerate_device_map(arch_name, no_split, fractions):
    """accelerate keeps room for the largest layer on the first GPU, so its budgets differ from
    ours; given the bytes accelerate put on each device as budgets, the plans must agree name by name."""
    logging.getLogger("accelerate").setLevel(logging.ERROR)  # "device 0 is not available" on this machine
    arch = HF_BY_NAME[arch_name]
    eager = build_eager(arch)
    total = accelerate_modeling.compute_module_sizes(eager)[""]
    max_memory = {0: int(total * fractions[0]), 1: int(total * fractions[1]), "cpu": 2 * total}
    theirs = accelerate_modeling.infer_auto_device_map(eager, max_memory=max_memory, no_split_module_classes=no_split)
    theirs = {name: f"cuda:{device}" if isinstance(device, int) else device for name, device in theirs.items()}

    census = take_census(eager)
    used = {"cuda:0": 0, "cuda:1": 0, "cpu": 0}
    for storage in census.storages:
        used[resolve(theirs, census.tensors[storage.names[0]].name)] += storage.nbytes
    assert sum(used.values()) == total  # sizes agree with accelerate's

    plan = plan_devices(deferred_init(arch.cls, arch.config()), used, no_split=no_split)
    assert plan.table["planned_bytes"].tolist() == list(used.values())
    for entry in census.tensors:
        assert plan.device_for(entry.name) == resolve(theirs, entry.name), entry.name


def test_70b_llama_plan_totals_by_hand():
    config = transformers.LlamaConfig(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8,
    )
    model = deferred_init(transformers.LlamaForCausalLM, config)
    plan = plan_devices(model, {"cuda:0": "80GB", "cuda:1": "80GB", "cpu": "200GB"}, no_split=["LlamaDecoderLayer"])
    h, i, kv, vocab = 8192, 28672, 1024, 32000
    layer = 4 * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h)
    rotary = 2 * 4 * 64  # inv_freq and original_inv_freq buffers: head_dim / 2 floats each
    total = 4 * (2 * vocab * h + h) + 80 * layer + rotary
    planned = plan.table["planned_bytes"].tolist()
    assert sum(planned) == total
    on_first = 4 * vocab * h + (80 * 10**9 - 4 * vocab * h) // layer * layer
    assert planned[0] == on_first  # the embedding, then as many whole layers as fit
    assert plan.device_for("model.layers.0.mlp.up_proj.weight") == "cuda:0"
    assert plan.device_for("lm_head.weight") == "cpu"


def test_world_size_counts_padded_dim0_shards_of_parameters_and_whole_buffers():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(11, 8)  # 11 rows: 4 per rank over 3 ranks (padded)
            self.head = nn.Linear(8, 11, bias=False)
            self.head.weight = self.embed.weight
            self.norm = nn.BatchNorm1d(3)

    module = deferred_init(Tied)
    plan = plan_devices(module, {"cpu": "1MB"}, world_size=3)
    embed, norm_affine, norm_stats = 4 * 8 * 4, 2 * (1 * 4), (3 + 3) * 4 + 8
    assert plan.table["planned_bytes"].tolist() == [embed + norm_affine + norm_stats]
    assert plan.world_size == 3
    assert plan_devices(module, {"cpu": "1MB"}).table["planned_bytes"].tolist() == [11 * 8 * 4 + 6 * 4 + 6 * 4 + 8]
    assert repr(plan).startswith("MemoryPlan (1 entries, per rank of 3)")


def test_a_per_rank_plan_is_refused_as_a_device_map_and_bad_world_sizes_are_named():
    module = deferred_init(nn.Linear, 4, 4)
    plan = plan_devices(module, {"cpu": "1MB"}, world_size=2)
    with pytest.raises(MaterializationError, match="counts one rank's FSDP2 shards over 2 ranks"):
        materialize_module(module, device=plan)
    assert is_deferred(module)
    with pytest.raises(DevicePlanError, match=r"world_size must be a positive int, got 0"):
        plan_devices(module, {"cpu": "1MB"}, world_size=0)
