"""A step of N blocks composed from steps of 3 and 4 equals the whole step, by category
(note [Composing a step from two block counts])."""

from __future__ import annotations

import pytest
import torch

import explorer
from explorer.analysis.block_composition import block_stack, candidates_of, compose_peak, truncated
from explorer.analysis.module_parts import nested
from tests.support.small_llama import deferred_llama

IDS = torch.zeros(2, 64, dtype=torch.long)


@pytest.fixture(scope="module")
def llama8() -> torch.nn.Module:
    return deferred_llama(8, hidden_size=256, intermediate_size=2048, vocab_size=300)


def _step(module: torch.nn.Module, world_size: int, checkpointing: bool) -> explorer.TrainStep:
    return explorer.train_step(module, IDS, labels=IDS, world_size=world_size, activation_checkpointing=checkpointing)


@pytest.mark.parametrize(("world_size", "checkpointing"), [(1, False), (4, True), (8, False)])
def test_a_step_composed_from_3_and_4_blocks_equals_the_whole_step_by_category_and_by_part(
    llama8: torch.nn.Module, world_size: int, checkpointing: bool
) -> None:
    stack = block_stack(llama8)
    assert stack is not None and stack.count == 8 and stack.alike
    short, longer = (
        candidates_of(k, stack, s.phase_own_peaks, s.block_peaks)
        for k, s in ((k, _step(truncated(llama8, stack, k), world_size, checkpointing)) for k in (3, 4))
    )
    for blocks in (5, 8):
        whole = _step(llama8 if blocks == 8 else truncated(llama8, stack, blocks), world_size, checkpointing)
        composed = compose_peak(short, longer, blocks)
        assert (composed.peak_bytes, composed.peak, composed.phase) == (whole.peak_bytes, whole.peak, whole.phase)
        assert nested(composed.by_part) == whole.peak_by_module  # by part of the model, to the byte
        assert set(whole.peak_by_module) >= {"model.embed_tokens", "model.layers", "lm_head"}


def test_cutting_the_blocks_leaves_the_model_as_it_was(llama8: torch.nn.Module) -> None:
    stack = block_stack(llama8)
    assert stack is not None
    cut = truncated(llama8, stack, 3)
    assert [name for name, _ in cut.model.layers.named_children()] == ["0", "1", "2"]
    assert len(llama8.model.layers) == 8
    assert cut.model.layers[2] is llama8.model.layers[2] and cut.lm_head is llama8.lm_head
    assert cut is not llama8 and cut.model is not llama8.model


def test_blocks_of_different_shapes_are_not_alike() -> None:
    blocks = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 4)) for width in (8, 8, 8, 8, 16)
    )
    stack = block_stack(torch.nn.Sequential(blocks))
    assert stack is not None and stack.container == "0" and not stack.alike


def test_steps_not_one_block_apart_are_refused() -> None:
    from explorer.analysis.block_composition import PeakCandidates

    with pytest.raises(ValueError, match="cannot compose steps of 3 and 5 blocks"):
        compose_peak(PeakCandidates(3, {}), PeakCandidates(5, {}), 8)
