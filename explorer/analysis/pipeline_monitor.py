"""What a pipeline stage does during one step, noted as it runs: phases, microbatches in flight, P2P bytes.

`monitored_stage` makes a `LocallyVotedStage` (a `PipelineStage` that runs on a fake group, note
[The pipeline vote on a fake rank]) whose public per-microbatch methods (`forward_one_chunk`,
`backward_one_chunk`, `get_{fwd,bwd}_{send,recv}_ops`) report to a `StepMonitor` before doing what
PyTorch's do: so the schedule's own order of actions is what is observed, whatever the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .._torch_compat.memory_tracker import MemTracker
from .._torch_compat.pipelining import LocallyVotedStage

__all__ = ["StepMonitor", "monitored_stage"]


@dataclass
class StepMonitor:
    """The running account of one rank's step: the phase running, the phase each rise of the peak
    happened in, each phase's running peak at its last action's end, microbatches in flight per
    stage (now and at most), and the bytes passed to sends and receives.

    `windows`: the step cut into windows, in order, each with its own peak snapshot (the device
    holding most; category → bytes, "Total"): each action ("forward 1.0": the forward of microbatch
    0 on stage 1), what ran between two actions ("between"), the optimizer. Their peaks are the
    candidate peaks a pipelined step is composed from (note [Composing a pipelined step]); they need
    a tracker with windows (`FastMemTracker`'s `start_window`), and stay empty without one."""

    tracker: MemTracker | None = None
    phase: str = "forward"
    peak_phase: str = "forward"
    seen_peak: int = 0
    phase_peaks: dict[str, int] = field(default_factory=dict)
    in_flight: dict[int, int] = field(default_factory=dict)
    most_in_flight: dict[int, int] = field(default_factory=dict)
    p2p_bytes: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("activations_sent", "activations_received", "gradients_sent", "gradients_received"), 0
        )
    )
    windows: list[tuple[str, dict]] = field(default_factory=list)
    started: dict[int, int] = field(default_factory=dict)

    def close_window(self, label: str) -> None:
        """The window since the last one closed (since the tracker started, for the first) is
        `label`'s: its own peak is noted, and the next window starts from the bytes alive now."""
        window_peak = getattr(self.tracker, "window_peak", None)
        if window_peak is None:
            return
        snapshots = window_peak().values()
        self.windows.append((label, dict(max(snapshots, key=lambda snap: snap["Total"])) if snapshots else {}))
        self.tracker.start_window()  # type: ignore[union-attr]  # a tracker with window_peak has start_window

    def peak_snapshot(self) -> dict:
        """The tracker's peak snapshot of the device holding most (category → bytes, "Total")."""
        snapshot = self.tracker.get_tracker_snapshot("peak") if self.tracker is not None else {}
        return max(snapshot.values(), key=lambda snap: snap["Total"]) if snapshot else {}

    def _peak(self) -> int:
        return self.peak_snapshot().get("Total", 0)

    def finish(self, phase: str) -> None:
        """`phase`'s action is done: its running peak, and whether it raised the peak."""
        peak = self._peak()
        if peak > self.seen_peak:
            self.peak_phase, self.seen_peak = phase, peak
        self.phase_peaks[phase] = peak

    def between_actions(self) -> None:
        """What ran since the last action (the schedule's loss after a forward, its receive buffers
        before the first, the merged outputs after the last) belongs to the forward."""
        if self._peak() > self.seen_peak:
            self.finish("forward")

    def forward(self, stage: int) -> None:
        self.between_actions()
        self.close_window("between")
        self.phase = "forward"
        self.in_flight[stage] = self.in_flight.get(stage, 0) + 1
        self.most_in_flight[stage] = max(self.most_in_flight.get(stage, 0), self.in_flight[stage])

    def backward(self, stage: int) -> None:
        self.between_actions()
        self.close_window("between")
        self.phase = "backward"
        self.in_flight[stage] -= 1

    def action_done(self, phase: str, stage: int) -> None:
        """`phase`'s action on `stage` is done: the running peak (`finish`) and its window, named by
        the stage and the microbatch (the stage's `started`-th of that phase, counted from 0)."""
        self.finish(phase)
        key = stage if phase == "forward" else -1 - stage
        microbatch = self.started.get(key, 0)
        self.started[key] = microbatch + 1
        self.close_window(f"{phase} {stage}.{microbatch}")

    def passed(self, kind: str, ops: list) -> list:
        self.p2p_bytes[kind] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
        return ops


class _MonitoredStage(LocallyVotedStage):
    """A `LocallyVotedStage` reporting each action to `monitor` (see module docstring)."""

    monitor: StepMonitor

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        self.monitor.forward(self.stage_index)
        output = super().forward_one_chunk(*args, **kwargs)
        self.monitor.action_done("forward", self.stage_index)
        return output

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        self.monitor.backward(self.stage_index)
        result = super().backward_one_chunk(*args, **kwargs)
        self.monitor.action_done("backward", self.stage_index)
        return result

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list:
        return self.monitor.passed("activations_sent", super().get_fwd_send_ops(fwd_chunk_id))

    def get_fwd_recv_ops(self, fwd_chunk_id: int) -> list:
        return self.monitor.passed("activations_received", super().get_fwd_recv_ops(fwd_chunk_id))

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list:
        return self.monitor.passed("gradients_sent", super().get_bwd_send_ops(bwd_chunk_id))

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> list:
        return self.monitor.passed("gradients_received", super().get_bwd_recv_ops(bwd_chunk_id))


def monitored_stage(
    module: nn.Module,
    index: int,
    stages: int,
    input_example: torch.Tensor,
    output_example: torch.Tensor,
    monitor: StepMonitor,
    group: dist.ProcessGroup | None = None,
) -> LocallyVotedStage:
    """Stage `index` of `stages` running `module` on `group` (a fake one; default: the default
    group), its boundary shapes given up front (static metadata), reporting to `monitor`."""
    stage = _MonitoredStage(
        module, index, stages, torch.device("cpu"),
        input_args=(input_example,), output_args=(output_example,), group=group,
    )  # fmt: skip
    stage.monitor = monitor
    return stage
