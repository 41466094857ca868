"""plan_parallel: layouts, why a layout cannot run, and each rank's peak equal to the whole step's."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import explorer
from explorer.analysis.layout_step import layout_step
from explorer.analysis.parallel_cost import ModelCost, step_cost
from explorer.analysis.parallel_layout import Layout, LayoutError, ModelFacts, layout_problems
from explorer.analysis.parallel_plan import candidate_layouts, plan_parallel
from explorer.analysis.pipeline_step import pipeline_step
from tests.support.small_llama import deferred_llama

IDS = torch.zeros(2, 32, dtype=torch.long)


@pytest.fixture(scope="module")
def llama5() -> torch.nn.Module:
    return deferred_llama(5, hidden_size=128, intermediate_size=256, vocab_size=500)


def test_a_layout_names_why_it_cannot_run() -> None:
    facts = ModelFacts(blocks=80, heads=64, kv_heads=8, has_tp_plan=False, root_class="LlamaForCausalLM")
    layout = Layout(dp_shard=2, tp=16, pp=3, accumulation_steps=2)
    assert layout_problems(layout, facts, gpus=64) == [
        "uses 96 GPUs, not 64",
        "LlamaForCausalLM has no tensor-parallel plan (pass tp_plan=)",
        "8 key-value heads are not divisible by TP 16",
        "80 blocks are not divisible into 3 pipeline stages",
        "2 microbatches cannot keep 3 pipeline stages busy (1F1B needs at least 3)",
    ]
    assert layout_problems(Layout(dp_shard=8, tp=8), ModelFacts(80, 64, 8, True), gpus=64) == []


def test_a_layout_refuses_a_degree_that_is_not_a_positive_int() -> None:
    with pytest.raises(LayoutError, match=r"Layout.tp must be a positive int, got 0"):
        Layout(tp=0)
    with pytest.raises(LayoutError, match=r"stages_per_rank=2 needs pp_schedule='Interleaved1F1B'"):
        Layout(pp=2, stages_per_rank=2)


def test_the_search_space_of_the_70b_benchmark_has_19_degree_combinations() -> None:
    layouts = candidate_layouts(64, fsdp=(8, 16, 32, 64), tp=(1, 2, 4, 8), pp=(1, 2, 4))
    assert len(layouts) == 38  # 19 combinations of degrees dividing 64, each with and without checkpointing
    assert all(layout.gpus == 64 for layout in layouts)
    assert Layout(dp_shard=8, dp_replicate=2, tp=2, pp=2, accumulation_steps=2, activation_checkpointing="block") in (
        layouts
    )


def test_each_rank_peak_equals_the_whole_models_step(llama5: torch.nn.Module) -> None:
    plan = plan_parallel(llama5, IDS, labels=IDS, gpus=4, gpu_memory="8MB", fsdp=(1, 2), tp=(1, 2), pp=(1,))
    assert len(plan.results) == 8
    for result in plan.results:
        whole = layout_step(llama5, IDS, labels=IDS, layout=result.layout)
        (rank,) = result.ranks
        assert (rank.peak_bytes, rank.peak, rank.phase) == (whole.peak_bytes, whole.peak, whole.phase)
        assert rank.by_module == whole.peak_by_module  # by part of the model too
        assert rank.measured_blocks == (3, 4)
        assert result.communication == {kind: count for kind, count in whole.communication.bytes.items() if count}
    table = plan.table()
    fits = [plan.fits(result) for result in plan.ordered()]
    assert fits == sorted(fits, reverse=True)
    assert table["fits"].tolist() == fits
    assert table["peak_bytes"].tolist() == [result.peak_bytes for result in plan.ordered()]
    assert len(llama5.model.layers) == 5


def test_selective_checkpointing_is_measured_whole_and_equals_the_whole_models_step(llama5: torch.nn.Module) -> None:
    """Every other block is checkpointed: 3 blocks end unwrapped and 4 wrapped, so composing from
    them gave a temporaries peak that the whole model does not reach."""
    plan = plan_parallel(
        llama5, IDS, labels=IDS, gpus=2, gpu_memory="8MB", fsdp=(1, 2), tp=(1,), pp=(1,),
        activation_checkpointing=("selective",),
    )  # fmt: skip
    assert len(plan.results) == 2
    for result in plan.results:
        whole = layout_step(llama5, IDS, labels=IDS, layout=result.layout)
        (rank,) = result.ranks
        assert (rank.peak_bytes, rank.peak, rank.phase) == (whole.peak_bytes, whole.peak, whole.phase)
        assert rank.measured_blocks == ()


def test_pipeline_stages_are_each_a_rank_of_the_plan() -> None:
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2
    )
    config.vocab_size = 256
    llama6 = explorer.deferred_init(LlamaForCausalLM, config)
    layout = Layout(pp=2, accumulation_steps=2, micro_batch_size=2)
    plan = plan_parallel(llama6, IDS, labels=IDS, gpus=2, layouts=[layout, Layout(pp=4, accumulation_steps=4)])
    stages = pipeline_step(llama6, IDS, labels=IDS, layout=layout)
    assert [(rank.rank, rank.peak_bytes, rank.peak) for rank in plan.results[0].ranks] == [
        (f"stage {step.rank}", step.peak_bytes, step.peak) for step in stages
    ]
    assert plan.results[0].peak_bytes == max(step.peak_bytes for step in stages)
    assert plan.results[1].problems == ("uses 4 GPUs, not 2", "6 blocks are not divisible into 4 pipeline stages")


def test_a_layout_the_model_does_not_allow_is_listed_last_with_its_reason(llama5: torch.nn.Module) -> None:
    plan = plan_parallel(
        llama5,
        IDS,
        labels=IDS,
        gpus=8,
        layouts=[Layout(dp_shard=8), Layout(dp_shard=1, tp=8)],
    )
    table = plan.table()
    assert table["layout"].tolist()[-1] == "FSDP 1 · TP 8 · PP 1 · AC none · mb 1 × 1"
    assert table["problems"].tolist()[-1] == (
        "4 attention heads are not divisible by TP 8; 2 key-value heads are not divisible by TP 8"
    )
    assert not table["fits"].tolist()[-1]


def test_communication_follows_the_ring_formulas() -> None:
    model = ModelCost(
        forward_flops=10**12,
        block_forward_flops=10**11,
        blocks=8,
        block_parameter_bytes=1000,
        other_parameter_bytes=2000,
        boundary_activation_bytes=64,
    )
    cost = step_cost(Layout(dp_shard=4, dp_replicate=2, tp=2, accumulation_steps=3), model)
    rank_blocks, rank_root = 8 * 1000 / 2, 2000 / 2
    assert cost.communication == {
        "all_gather": round(3 * (2 * rank_blocks + rank_root) * 3 / 4),
        "reduce_scatter": round(3 * (rank_blocks + rank_root) * 3 / 4),
        "all_reduce": round(2 * (rank_blocks + rank_root) / 4 * 1 / 2 + 3 * 8 * 4 * 2 * 64 * 1 / 2),
    }
    assert cost.compute_flops == 3 * 10**12 * 3 // 2


def test_forked_workers_measure_what_one_process_measures(llama5: torch.nn.Module) -> None:
    arguments = dict(gpus=2, gpu_memory="8MB", fsdp=(1, 2), tp=(1, 2), pp=(1,), activation_checkpointing=("none",))
    alone = plan_parallel(llama5, IDS, labels=IDS, **arguments)
    forked = plan_parallel(llama5, IDS, labels=IDS, workers=2, **arguments)
    assert forked.results == alone.results
    assert any(result.valid for result in alone.results)


def test_dropping_the_outputs_early_is_the_loop_measured(llama5: torch.nn.Module) -> None:
    layout = Layout(dp_shard=2, micro_batch_size=2)
    (result,) = plan_parallel(llama5, IDS, labels=IDS, gpus=2, layouts=[layout], keep_outputs=False).results
    whole = layout_step(llama5, IDS, labels=IDS, layout=layout, keep_outputs=False)
    kept = layout_step(llama5, IDS, labels=IDS, layout=layout)
    assert result.peak_bytes == whole.peak_bytes < kept.peak_bytes


def test_mixed_precision_is_a_layout_of_its_own_and_needs_data_parallelism() -> None:
    layout = Layout(dp_shard=8, tp=2, mixed_precision="bfloat16")
    assert layout.label() == "FSDP 8 · TP 2 · PP 1 · AC none · mb 1 × 1 · bf16"
    assert layout != Layout(dp_shard=8, tp=2)
    with pytest.raises(LayoutError, match=r"Layout.mixed_precision must be one of \('none', 'bfloat16'\), got 'fp8'"):
        Layout(mixed_precision="fp8")  # type: ignore[arg-type]
    assert layout_problems(Layout(tp=2, mixed_precision="bfloat16"), ModelFacts(4, 4, 2, True)) == [
        "mixed precision bfloat16 is FSDP2's MixedPrecisionPolicy, and the layout has no data parallelism to carry it"
    ]


def test_bf16_mixed_precision_measures_fsdp2s_policy_composed_as_the_whole_step(llama5: torch.nn.Module) -> None:
    """Unsharded parameters and activations in bf16, sharded parameters, gradients and optimizer
    state in the model's fp32: each category, composed over blocks, equals the whole model's step."""
    plan = plan_parallel(
        llama5, IDS, labels=IDS, gpus=4, fsdp=(2, 4), tp=(1,), pp=(1,), mixed_precision="bfloat16"
    )
    assert {result.layout.mixed_precision for result in plan.results} == {"bfloat16"}
    for result in plan.results:
        whole = layout_step(llama5, IDS, labels=IDS, layout=result.layout)
        full = layout_step(llama5, IDS, labels=IDS, layout=dataclasses.replace(result.layout, mixed_precision="none"))
        (rank,) = result.ranks
        assert (rank.peak_bytes, rank.peak) == (whole.peak_bytes, whole.peak)
        assert whole.peak_bytes < full.peak_bytes
        assert whole.end_of_forward["sharded_parameters"] == full.end_of_forward["sharded_parameters"]  # fp32
        assert whole.end_of_forward["activations"] < full.end_of_forward["activations"]  # bf16
        assert result.communication["reduce_scatter"] == full.communication.bytes["reduce_scatter"]  # fp32 reduce
        assert result.communication["all_gather"] * 2 == full.communication.bytes["all_gather"]  # bf16 gather
