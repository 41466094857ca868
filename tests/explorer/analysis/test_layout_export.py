"""A Layout as torchtitan TOML and as Python source that applies it (explorer.analysis.layout_export).

The TOML is read back with tomllib and compared key for key with torchtitan's names (commit
238fa9953e4a, the last TOML-configured one); the Python is compiled, and its constants and
`apply_layout` body checked. Running it for real on gloo ranks: tests/examples/test_apply_layout.py.
"""

from __future__ import annotations

import sys

import pytest

from explorer.analysis.layout_export import mesh_dims, split_tp_plan, to_python, to_torchtitan
from explorer.analysis.parallel_layout import Layout, LayoutError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10 has no tomllib
    tomllib = pytest.importorskip("tomli")

LLAMA_PLAN = {
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.down_proj": "rowwise_rep",
    "lm_head": "colwise_rep",
}


def _namespace(source: str) -> dict:
    """The generated module's globals, without running it (imports and defs only, no mesh)."""
    namespace: dict = {}
    exec(compile(source, "<generated>", "exec"), namespace)
    return namespace


# -- torchtitan ----------------------------------------------------------------------------------
def test_fsdp_tp_selective_layout_reads_back_as_torchtitan_keys() -> None:
    layout = Layout(dp_shard=8, tp=2, activation_checkpointing="selective", micro_batch_size=2, accumulation_steps=4)
    assert tomllib.loads(to_torchtitan(layout)) == {
        "parallelism": {
            "data_parallel_replicate_degree": 1,
            "data_parallel_shard_degree": 8,
            "tensor_parallel_degree": 2,
            "pipeline_parallel_degree": 1,
        },
        "activation_checkpoint": {"mode": "selective", "selective_ac_option": "2"},
        "training": {  # 2 × 4 steps × 8 ranks; torchtitan's default bf16 said off, as float32
            "local_batch_size": 2, "global_batch_size": 64, "mixed_precision_param": "float32",
            "mixed_precision_reduce": "float32",
        },
    }  # fmt: skip


def test_bf16_mixed_precision_is_torchtitans_mixed_precision_param() -> None:
    training = tomllib.loads(to_torchtitan(Layout(dp_shard=4, mixed_precision="bfloat16")))["training"]
    assert (training["mixed_precision_param"], training["mixed_precision_reduce"]) == ("bfloat16", "float32")


def test_block_checkpointing_is_torchtitans_full_mode_and_none_is_none() -> None:
    assert tomllib.loads(to_torchtitan(Layout(activation_checkpointing="block")))["activation_checkpoint"] == {
        "mode": "full"
    }
    assert tomllib.loads(to_torchtitan(Layout()))["activation_checkpoint"] == {"mode": "none"}


def test_pipelined_layout_puts_every_microbatch_in_the_local_batch() -> None:
    layout = Layout(
        dp_shard=2, dp_replicate=2, pp=4, pp_schedule="Interleaved1F1B", stages_per_rank=2,
        micro_batch_size=2, accumulation_steps=8,
    )  # fmt: skip
    config = tomllib.loads(to_torchtitan(layout, layers=32))
    assert config["parallelism"] == {
        "data_parallel_replicate_degree": 2,
        "data_parallel_shard_degree": 2,
        "tensor_parallel_degree": 1,
        "pipeline_parallel_degree": 4,
        "pipeline_parallel_schedule": "Interleaved1F1B",
        "pipeline_parallel_microbatch_size": 2,
        "pipeline_parallel_first_stage_less_layers": 0,
        "pipeline_parallel_last_stage_less_layers": 0,
        "pipeline_parallel_layers_per_stage": 4,  # 32 layers / (4 ranks × 2 stages)
    }
    assert (config["training"]["local_batch_size"], config["training"]["global_batch_size"]) == (16, 64)


def test_torchtitan_refuses_what_it_cannot_express_naming_the_degree() -> None:
    three_stages = Layout(pp=2, pp_schedule="Interleaved1F1B", stages_per_rank=3, accumulation_steps=2)
    with pytest.raises(LayoutError, match=r"stages_per_rank=3 differs from torchtitan's default of 2.*pass layers="):
        to_torchtitan(three_stages)
    with pytest.raises(LayoutError, match=r"layers=10 are not divisible into 6 pipeline stages"):
        to_torchtitan(three_stages, layers=10)
    with pytest.raises(LayoutError, match=r"stages_per_rank=1: torchtitan's Interleaved1F1B needs at least 2"):
        to_torchtitan(Layout(pp=2, pp_schedule="Interleaved1F1B", accumulation_steps=2))


# -- Python --------------------------------------------------------------------------------------
def test_mesh_keeps_torchtitans_order_and_hsdps_shard_dim() -> None:
    assert mesh_dims(Layout(dp_shard=4, tp=2)) == (("dp_shard", 4), ("tp", 2))
    assert mesh_dims(Layout(dp_replicate=2, pp=2, accumulation_steps=2)) == (
        ("pp", 2), ("dp_replicate", 2), ("dp_shard", 1),
    )  # fmt: skip
    assert mesh_dims(Layout()) == (("dp_shard", 1),)


def test_tp_plan_splits_into_per_block_and_root_keys() -> None:
    assert split_tp_plan(LLAMA_PLAN, "model.layers") == (
        {"self_attn.q_proj": "colwise", "self_attn.o_proj": "rowwise", "mlp.down_proj": "rowwise_rep"},
        {"lm_head": "colwise_rep"},
    )


def test_generated_fsdp_tp_source_compiles_with_the_plan_as_parallel_styles() -> None:
    source = to_python(Layout(dp_shard=2, tp=2, activation_checkpointing="block"), tp_plan=LLAMA_PLAN)
    generated = _namespace(source)
    assert (generated["MESH_SHAPE"], generated["MESH_DIM_NAMES"]) == ((2, 2), ("dp_shard", "tp"))
    styles = {key: type(style).__name__ for key, style in generated["BLOCK_TP_PLAN"].items()}
    assert styles == {"self_attn.q_proj": "ColwiseParallel", "self_attn.o_proj": "RowwiseParallel",
                      "mlp.down_proj": "RowwiseParallel"}  # fmt: skip
    assert "parallelize_module(model, tp_mesh, ROOT_TP_PLAN)" in source
    assert "blocks.register_module(name, checkpoint_wrapper(block))" in source
    assert 'dp_mesh = world_mesh["dp_shard"]' in source


def test_bf16_source_shards_with_fsdp2s_mixed_precision_policy() -> None:
    source = to_python(Layout(dp_shard=2, dp_replicate=2, mixed_precision="bfloat16"))
    generated = _namespace(source)
    assert generated["MixedPrecisionPolicy"].__module__.startswith("torch.distributed.fsdp")
    assert "    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)\n" in source
    assert "        fully_shard(block, mesh=dp_mesh, mp_policy=policy)\n" in source
    assert "    fully_shard(model, mesh=dp_mesh, mp_policy=policy)\n" in source
    assert "MixedPrecisionPolicy" not in to_python(Layout(dp_shard=2))


def test_hsdp_source_shards_over_the_two_dimensional_data_mesh() -> None:
    source = to_python(Layout(dp_shard=2, dp_replicate=2))
    assert 'dp_mesh = world_mesh["dp_replicate", "dp_shard"]' in source
    assert "parallelize_module" not in source and "checkpoint_wrapper" not in source


def test_selective_source_wraps_every_other_block_as_torchtitan_does() -> None:
    source = to_python(Layout(activation_checkpointing="selective"))
    assert "        if index % 2 == 0:" in source  # blocks 1, 3, ... are wrapped (torchtitan counts from 1)
    assert "fully_shard(" not in source.split("def apply_layout")[1]  # one rank: nothing to shard


def test_pipelined_source_outlines_stages_and_names_the_schedule() -> None:
    layout = Layout(pp=2, pp_schedule="Interleaved1F1B", stages_per_rank=2, accumulation_steps=4)
    generated = _namespace(to_python(layout))
    assert (generated["NUM_STAGES"], generated["STAGES_PER_RANK"], generated["MICROBATCHES"]) == (4, 2, 4)
    assert list(generated["stage_blocks"](3, 8)) == [6, 7]
    assert generated["ScheduleInterleaved1F1B"].__name__ == "ScheduleInterleaved1F1B"


def test_to_python_errors_name_the_argument_at_fault() -> None:
    with pytest.raises(LayoutError, match=r"Layout.tp=2 needs tp_plan="):
        to_python(Layout(tp=2))
    with pytest.raises(LayoutError, match=r"tp_plan\['lm_head'\] = 'sequence' is not a known style"):
        to_python(Layout(tp=2), tp_plan={"lm_head": "sequence"})
    with pytest.raises(LayoutError, match=r"blocks='layers' must name the blocks on the root, as 'model.<path>'"):
        to_python(Layout(), blocks="layers")
