"""A pipelined step of N blocks per stage composed from pipelined steps of 3 and 4 blocks per stage
equals the whole pipelined step, per stage rank: peaks by category, collectives and P2P bytes
(note [Composing a pipelined step])."""

from __future__ import annotations

import pytest
import torch

from explorer.analysis.block_composition import block_stack, truncated
from explorer.analysis.parallel_layout import Layout
from explorer.analysis.module_parts import nested
from explorer.analysis.parallel_measure import Measurements, Refused
from explorer.analysis.pipeline_composition import compose_ranks
from explorer.analysis.pipeline_step import pipeline_step
from tests.support.small_llama import deferred_llama

IDS = torch.zeros(1, 32, dtype=torch.long)


def _llama(layers: int) -> torch.nn.Module:
    return deferred_llama(layers, hidden_size=128, intermediate_size=512, vocab_size=300)


@pytest.fixture(scope="module")
def llama12() -> torch.nn.Module:
    return _llama(12)


@pytest.fixture(scope="module")
def llama24() -> torch.nn.Module:
    return _llama(24)


CASES = {
    "1F1B": (12, Layout(pp=2, accumulation_steps=3)),
    "FSDP 2 in stages": (12, Layout(pp=2, dp_shard=2, accumulation_steps=2)),
    "FSDP 2 in stages, bf16 mixed precision": (
        12,
        Layout(pp=2, dp_shard=2, accumulation_steps=2, mixed_precision="bfloat16"),
    ),
    "TP 2 in stages": (12, Layout(pp=2, tp=2, accumulation_steps=2)),
    "block checkpointing": (12, Layout(pp=2, activation_checkpointing="block", accumulation_steps=3)),
    "FSDP 2, TP 2 and block checkpointing": (
        12,
        Layout(pp=2, dp_shard=2, tp=2, activation_checkpointing="block", accumulation_steps=2),
    ),
    "GPipe": (12, Layout(pp=2, pp_schedule="GPipe", accumulation_steps=3)),
    "interleaved 1F1B": (24, Layout(pp=2, pp_schedule="Interleaved1F1B", stages_per_rank=2, accumulation_steps=4)),
    "four stages": (24, Layout(pp=4, accumulation_steps=4)),
}


def _steps(module: torch.nn.Module, layout: Layout) -> list:
    return pipeline_step(module, IDS, labels=IDS, layout=layout)


@pytest.mark.parametrize("case", list(CASES))
def test_a_pipelined_step_composed_from_3_and_4_blocks_per_stage_equals_the_whole_step(
    request: pytest.FixtureRequest, case: str
) -> None:
    layers, layout = CASES[case]
    model = request.getfixturevalue(f"llama{layers}")
    stack = block_stack(model)
    assert stack is not None and stack.alike
    stages = layout.pp * layout.stages_per_rank
    short, longer = (_steps(truncated(model, stack, stages * k), layout) for k in (3, 4))
    whole = _steps(model, layout)
    composed = compose_ranks(short, longer, layers // stages, stack)
    for rank, step in zip(composed, whole, strict=True):
        assert max(total for _, (total, _, _) in step.window_peaks) == step.peak_bytes  # the windows cover the step
        assert (rank.peak_bytes, rank.peak, rank.phase) == (step.peak_bytes, step.peak, step.phase)
        assert nested(rank.by_part) == step.peak_by_module  # by part of the model, to the byte
        assert sum(sum(by_category.values()) for by_category in step.peak_by_module.values()) == step.peak_bytes
        assert rank.communication == {kind: step.communication.bytes.get(kind, 0) for kind in rank.communication}
        assert set(step.communication.bytes) <= set(rank.communication)
        assert rank.p2p_total == step.p2p_total


def _measurements(model: torch.nn.Module) -> Measurements:
    return Measurements(model, (IDS,), {"labels": IDS}, batch=1, tp_plan=None, optimizer=None, loss=None)


def test_plan_parallel_composes_pipelined_layouts_of_alike_blocks_as_the_whole_model_measures_them(
    llama12: torch.nn.Module,
) -> None:
    measurements = _measurements(llama12)
    layout = Layout(pp=2, dp_shard=2, accumulation_steps=2)
    composed = measurements.measure(layout)
    whole = measurements._whole_pipeline(layout)
    assert not isinstance(composed, Refused)
    (ranks, communication), (whole_ranks, whole_communication) = composed, whole
    assert [(r.rank, r.peak_bytes, r.peak, r.by_module) for r in ranks] == [
        (r.rank, r.peak_bytes, r.peak, r.by_module) for r in whole_ranks
    ]
    assert communication == {kind: whole_communication.get(kind, 0) for kind in communication}
    assert communication["send_recv"] == whole_communication["send_recv"] > 0
    assert all(rank.measured_blocks == (6, 8) for rank in ranks)
    assert all(
        "microbatch" in rank.at and "microbatches in flight (composed from 3 and 4 blocks per stage)" in rank.at
        for rank in ranks
    )


def test_too_few_blocks_per_stage_to_gain_from_composing_run_the_whole_model(llama12: torch.nn.Module) -> None:
    measured = _measurements(llama12).measure(Layout(pp=4, accumulation_steps=4))
    assert not isinstance(measured, Refused)
    assert [rank.measured_blocks for rank in measured[0]] == [()] * 4
