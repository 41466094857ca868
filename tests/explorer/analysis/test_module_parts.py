"""A step's peak split by part of the model (note [Bytes by part]): which parts a model has, and each
storage counted under the module that owns it, adding up to the peak."""

from __future__ import annotations

import math

import pytest
import torch

import explorer
from explorer._torch_compat.memory_tracker import FastMemTracker, PartKey
from explorer.analysis.module_parts import OUTSIDE_MODULES, ROOT_PART, module_parts
from tests.support.small_llama import deferred_llama

IDS = torch.zeros(2, 64, dtype=torch.long)
PARTS = ("model.embed_tokens", "model.layers", "model.norm", "lm_head")


@pytest.fixture(scope="module")
def llama4() -> torch.nn.Module:
    return deferred_llama(4, hidden_size=256, intermediate_size=1024, vocab_size=300)


def _parameter_bytes(model: torch.nn.Module, part: str, shards: int = 1) -> int:
    """The bytes of `part`'s parameters, or of rank 0's FSDP2 shard of each (dim 0 split in `shards`)."""
    total = 0
    for name, param in model.named_parameters():
        if name.startswith(part + "."):
            rows = math.ceil(param.shape[0] / shards)
            total += rows * (param.numel() // param.shape[0]) * param.element_size()
    return total


def test_a_llamas_parts_are_its_top_level_modules_with_the_blocks_as_one(llama4: torch.nn.Module) -> None:
    parts = module_parts(llama4)
    assert parts.labels() == [
        ROOT_PART,
        "lm_head",
        "model (own code)",
        "model.embed_tokens",
        "model.layers",
        "model.norm",
        "model.rotary_emb",
        OUTSIDE_MODULES,
    ]
    assert parts.of_path("model.layers.3.self_attn.q_proj") == "model.layers"
    assert parts.of_path("model") == "model (own code)"
    assert parts.of_path("") == ROOT_PART


def test_a_model_without_repeated_blocks_is_split_by_its_children() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    assert module_parts(model).labels() == [ROOT_PART, "0", "1", "2", OUTSIDE_MODULES]


def test_the_optimizer_peak_counts_each_parameters_state_under_the_module_holding_it(
    llama4: torch.nn.Module,
) -> None:
    def sgd(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    step = explorer.train_step(llama4, IDS, labels=IDS, optimizer=sgd)
    assert step.phase == "optimizer"
    for part in PARTS:
        weights = _parameter_bytes(llama4, part)
        by_category = step.peak_by_module[part]
        # SGD's momentum buffer is made during the step as a copy of the gradient
        assert (by_category["parameters"], by_category["gradients"], by_category["optimizer_state"]) == (
            weights,
            weights,
            weights,
        )
    # the logits are kept through the optimizer step (note [The loop as users write it]): 2 × 64 × 300 floats
    assert step.peak_by_module["lm_head"]["activations"] == 2 * 64 * 300 * 4
    assert step.peak_by_module[OUTSIDE_MODULES] == {"inputs": IDS.numel() * 8}


def test_adamws_moments_belong_to_their_parameters_and_its_step_counters_to_no_module(
    llama4: torch.nn.Module,
) -> None:
    step = explorer.train_step(llama4, IDS, labels=IDS)
    assert step.phase == "optimizer"
    for part in PARTS:  # two moments per parameter, plus whatever temporaries the step holds at its peak
        assert step.peak_by_module[part]["optimizer_state"] >= 2 * _parameter_bytes(llama4, part)
    # the step counters are made from no tensor, outside every module: one float per parameter
    counters = sum(1 for _ in llama4.parameters()) * 4
    assert step.peak_by_module[OUTSIDE_MODULES] == {"inputs": IDS.numel() * 8, "optimizer_state": counters}


@pytest.mark.parametrize(("world_size", "checkpointing"), [(1, True), (4, False), (4, True)])
def test_the_parts_add_up_to_the_peak_in_every_category(
    llama4: torch.nn.Module, world_size: int, checkpointing: bool
) -> None:
    step = explorer.train_step(llama4, IDS, labels=IDS, world_size=world_size, activation_checkpointing=checkpointing)
    summed: dict[str, int] = {}
    for by_category in step.peak_by_module.values():
        for category, value in by_category.items():
            summed[category] = summed.get(category, 0) + value
    assert summed == {category: value for category, value in step.peak.items() if value}
    assert sum(summed.values()) == step.peak_bytes


def test_fsdp_shards_are_counted_under_the_module_holding_the_parameter(llama4: torch.nn.Module) -> None:
    step = explorer.train_step(llama4, IDS, labels=IDS, world_size=4)
    for part in PARTS:
        assert step.peak_by_module[part]["sharded_parameters"] == _parameter_bytes(llama4, part, shards=4)


def test_a_tracker_not_asked_to_split_keeps_pytorchs_snapshot() -> None:
    model = torch.nn.Linear(8, 8)
    tracker = FastMemTracker()
    tracker.track_external(model)
    with tracker:
        model(torch.ones(2, 8)).sum().backward()
    snapshots = tracker.get_tracker_snapshot("peak")
    assert snapshots and not any(type(key) is PartKey for snap in snapshots.values() for key in snap)


def test_a_plans_rank_lists_its_peak_by_module_largest_first(llama4: torch.nn.Module) -> None:
    plan = explorer.plan_parallel(llama4, IDS, labels=IDS, gpus=2, gpu_memory="1GB", fsdp=(2,), tp=(1,), pp=(1,))
    (result,) = [result for result in plan.results if result.layout.activation_checkpointing == "none"]
    (rank,) = result.ranks
    table = rank.module_table()
    assert table["bytes"].tolist() == sorted(table["bytes"], reverse=True)
    assert table["bytes"].sum() == rank.peak_bytes
    assert table.columns.tolist() == ["module", "bytes", *(c for c, value in rank.peak.items() if value)]
    layers = table.set_index("module").loc["model.layers"]
    assert layers["sharded_parameters"] == _parameter_bytes(llama4, "model.layers", shards=2)


@pytest.mark.parametrize(("checkpointing", "accumulation_steps"), [(False, 1), (True, 1), (False, 3)])
def test_the_fake_steps_split_equals_the_same_split_of_the_eager_step(checkpointing: bool, accumulation_steps: int):
    """The split tracker on the eager model's real loop (real storages, real optimizer states) gives
    the fake step's split to the byte: the fake step attributes what a real run would."""
    from explorer.analysis.fake_fsdp import checkpoint_blocks, repeated_blocks
    from explorer.analysis.module_parts import nested, split_by_part
    from explorer.analysis.train_step import SINGLE_CATEGORIES, breakdown
    from tests.explorer.analysis.test_train_step import LLAMA, eager_loop, llama_inputs
    from tests.support.hf_configs import build_eager

    torch.manual_seed(0)
    deferred = explorer.deferred_init(LLAMA.cls, LLAMA.config())
    loop = {"accumulation_steps": accumulation_steps}
    step = explorer.train_step(deferred, **llama_inputs(), activation_checkpointing=checkpointing, **loop)
    model = build_eager(LLAMA).train()
    if checkpointing:
        checkpoint_blocks(model, repeated_blocks(model))
    optimizer = torch.optim.AdamW(model.parameters())
    tracker = FastMemTracker()
    parts = module_parts(model)
    split_by_part(tracker, parts, [model], optimizer)
    inputs = llama_inputs()
    tracker.track_external(model, optimizer, inputs["input_ids"])  # the labels are the same tensor
    eager_loop(model, inputs, optimizer, tracker, accumulation_steps=accumulation_steps)
    (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    total, _, by_part = breakdown(snapshot, SINGLE_CATEGORIES)
    assert step.peak_bytes == total
    assert step.peak_by_module == nested(by_part, parts.labels())
    assert {"model.layers", "lm_head"} <= set(step.peak_by_module)
