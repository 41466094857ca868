"""A pipelined step of N blocks per stage, composed from the pipelined steps of 3 and 4 blocks per stage.

Note: [Composing a pipelined step]
Under pipeline parallelism a stage rank's memory over the step is a sequence of windows, the same
for any number of blocks per stage (the schedule orders microbatches and stages, not blocks): each
action (the forward or the backward of one microbatch on one of the rank's stages), what runs
between two actions (the schedule's receive buffers, the loss, the merged outputs) and the
optimizer. Every block of a stage holds the same state per microbatch (its parameters, gradients,
optimizer states, and one block's activations per microbatch in flight), so each window's own peak
is affine in the blocks per stage, and so is each block's peak while one call of its forward or
backward runs, at a position counted from either end of its stage (first, second, second-to-last,
last: the crossing of "the last block's backward holds every activation" and "the first block's
backward holds every gradient", as in note [Composing a step from two block counts]). So two
pipelined steps of the model cut to `b` and `b + 1` blocks per stage (`pp × stages_per_rank × b`
blocks in all, the stages split evenly, the first holding the embedding, the last the norm, head and
loss) give every candidate's value and slope per rank; each is extrapolated to the real blocks per
stage, by category and by part, and the largest is the rank's peak. A rank's collectives and its point-to-point
bytes are extrapolated the same way (the P2P bytes do not change with the blocks: a slope of 0).

FSDP's tracker keeps one forward peak per block for the whole step (a second forward call raises
the first call's peak rather than starting one of its own), so under FSDP a block's forward is one
candidate, the most over microbatches; its backward calls are one candidate each.
`tests/explorer/analysis/test_pipeline_composition.py` checks the composed peaks, by category, and
the collectives against whole pipelined steps: 1F1B, FSDP and TP inside stages, block
checkpointing, interleaved 1F1B, and four stages.

Not composed (`Measurements._pipelined` runs the whole model): blocks that are not alike, a block
container other than the Llama layout's `model.layers`, and blocks not divisible evenly into the
stages (`plan_stages` refuses those anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .block_composition import BlockStack, PeakCandidates, compose_peak
from .pipeline_step import PipelineStageStep
from .train_step import Breakdown

__all__ = ["ComposedRank", "compose_ranks", "rank_candidates"]

_POSITIONS = (0, 1, -2, -1)


@dataclass(frozen=True)
class ComposedRank:
    """One stage rank's composed step: its peak (total, by category, phase), where it falls (`at`),
    its collectives by kind, its point-to-point bytes, and its peak by (part, category) (note
    [Bytes by part])."""

    peak_bytes: int
    peak: dict[str, int]
    phase: str
    at: str
    communication: dict[str, int]
    p2p_total: int
    by_part: dict[tuple[str, str], int] = field(default_factory=dict)


def _window_phase(label: str) -> str:
    """The phase a window belongs to: an action's own, the optimizer, and "forward" between actions
    (the monitor counts the loss and the receive buffers in the forward)."""
    first = label.partition(" ")[0]
    return first if first in ("forward", "backward", "optimizer") else "forward"


def rank_candidates(step: PipelineStageStep, per_stage: int, stack: BlockStack) -> PeakCandidates:
    """The candidate peaks of one stage rank's pipelined step of `per_stage` blocks per stage
    (note [Composing a pipelined step]): kinds "window:<phase> <label>" at the window's index, and
    "block:<phase> <local stage>.<call>" at a block position within the stage."""
    values: dict[tuple[str, int | None], Breakdown] = {}
    for index, (label, value) in enumerate(step.window_peaks):
        values[(f"window:{_window_phase(label)} {label}", index)] = value
    for local, stage in enumerate(step.stages):
        first = stage * per_stage
        for position in _POSITIONS:
            path = stack.path(first + range(per_stage)[position])
            for phase in ("forward", "backward"):
                for call, measured in enumerate(step.block_peaks.get((path, phase), ())):
                    values[(f"block:{phase} {local}.{call}", position)] = measured
    return PeakCandidates(per_stage, values)


def _extrapolated(short: int, longer: int, steps: int) -> int:
    return short + steps * (longer - short)


def _where(candidate: str, step: PipelineStageStep, per_stage: int, stack: BlockStack) -> str:
    """Where a composed rank's peak falls, in words, with the blocks of the real model."""
    kind, _, position = candidate.rpartition("@")
    what, _, detail = kind.partition(":")
    phase, _, label = detail.partition(" ")
    if what == "block":
        local, _, call = label.partition(".")
        index = step.stages[int(local)]
        block = stack.path(index * per_stage + range(per_stage)[int(position)])
        calls = len(step.block_peaks.get((step.blocks[0], phase), ()))
        which = f"microbatch {call}" if calls == step.microbatches else "its most over the microbatches"
        return f"{phase} of {block} (stage {index}, {which})"
    action, _, place = label.partition(" ")
    if action in ("forward", "backward"):
        stage, _, microbatch = place.partition(".")
        return f"{action} of microbatch {microbatch} on stage {stage}"
    return "the optimizer" if action == "optimizer" else "between two actions of the schedule"


def compose_ranks(
    short: Sequence[PipelineStageStep], longer: Sequence[PipelineStageStep], per_stage: int, stack: BlockStack
) -> list[ComposedRank]:
    """Each stage rank's step at `per_stage` blocks per stage, from its steps at `b` and `b + 1` blocks
    per stage (`short`, `longer`: `pipeline_step`'s ranks, in the same order; b is `short`'s blocks
    per stage). Raises ValueError when the two do not have the same ranks and candidates."""
    if len(short) != len(longer):
        raise ValueError(f"cannot compose {len(short)} stage ranks with {len(longer)}")
    measured = len(short[0].blocks) // len(short[0].stages)
    steps = per_stage - measured
    ranks = []
    for first, second in zip(short, longer, strict=True):
        composed = compose_peak(
            rank_candidates(first, measured, stack), rank_candidates(second, measured + 1, stack), per_stage
        )
        kinds = set(first.communication.bytes) | set(second.communication.bytes)
        communication = {
            kind: _extrapolated(first.communication.bytes.get(kind, 0), second.communication.bytes.get(kind, 0), steps)
            for kind in kinds
        }
        ranks.append(
            ComposedRank(
                composed.peak_bytes,
                composed.peak,
                composed.phase,
                _where(composed.candidate, first, per_stage, stack),
                communication,
                _extrapolated(first.p2p_total, second.p2p_total, steps),
                composed.by_part,
            )
        )
    return ranks
