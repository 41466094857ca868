"""torch.distributed.pipelining on one process: a stage whose P2P warm-up vote is answered locally.

Note: [The pipeline vote on a fake rank]
Before its first step a schedule runs a vote over P2P (`_PipelineSchedule._warmup_p2p`): each
stage sends a 1 (its metadata is static: `input_args` and `output_args` given) or a 0 along the
pipeline and back, and every stage reads the product with `.item()`. On the fake backend nothing
arrives (a received tensor keeps its zeros, and under FakeTensorMode `.item()` has no value to
read), so the vote would say "dynamic" and the stage would then exchange its shapes with
`send_object_list`, which fails the same way. `LocallyVotedStage` answers both halves of the vote
itself with a 1, so a stage given static metadata on every rank behaves as it would on a real
group where every rank voted static; everything after the vote (receive buffers, sends, receives,
forward and backward per microbatch) is PyTorch's own code, run on fakes. The vote tensor is made
by `torch.tensor`, which FakeTensorMode keeps as a constant, so `.item()` reads it.
Mirrors `PipelineStage._warmup_forward_vote` / `_warmup_backward_result` (2.13): re-check on
upgrades.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

__all__ = ["SCHEDULES", "LocallyVotedStage", "ScheduleName"]

ScheduleName = Literal["1F1B", "Interleaved1F1B", "GPipe"]
SCHEDULES: dict[str, type] = {
    "1F1B": Schedule1F1B,
    "GPipe": ScheduleGPipe,
    "Interleaved1F1B": ScheduleInterleaved1F1B,
}


class LocallyVotedStage(PipelineStage):
    """A `PipelineStage` that votes "static metadata" without P2P (note [The pipeline vote on a fake
    rank]); construct it with `input_args` and `output_args`, as a static stage is."""

    def _warmup_forward_vote(self, has_backward: bool, received_acc: torch.Tensor | None = None) -> torch.Tensor:
        return torch.tensor([1], dtype=torch.int32)

    def _warmup_backward_result(self, received_result: torch.Tensor | None = None) -> torch.Tensor:
        return torch.tensor([1], dtype=torch.int32)
