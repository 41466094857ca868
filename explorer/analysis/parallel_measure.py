"""The fake steps behind `plan_parallel`: one per distinct configuration, composed over blocks.

`Measurements.ranks(layout)` gives each kind of rank's peak under a layout and one rank's
collectives: without pipelining from `layout_step` on the first 3 and 4 repeated blocks, composed
(note [Composing a step from two block counts]); with pipelining from `pipeline_step`, a rank per
stage, on the model cut to 3 and 4 blocks per stage, composed (note [Composing a pipelined step]).
Replicas do not change a rank's memory, so layouts that differ only in `dp_replicate` share one
measurement. `measure_in_workers` runs the distinct measurements in forked processes.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from .block_composition import SHORT_BLOCKS, BlockStack, block_stack, candidates_of, compose_peak, truncated
from .fake_groups import hold_fake_groups_until_exit
from .layout_step import LayoutStep, layout_step
from .module_parts import module_parts, nested
from .parallel_layout import Layout, LayoutError
from .pipeline_composition import compose_ranks
from .pipeline_split import PipelineSplitError
from .pipeline_step import PipelineStageStep, pipeline_steps
from .tp_plans import TensorParallelPlanError
from .train_step import LossFunction, OptimizerFactory, TrainStepError

__all__ = ["Measured", "Measurements", "RankPeak", "Refused", "measure_in_workers"]

# A layout the engines refuse for this model: the refusal becomes the layout's stated problem.
REFUSALS = (LayoutError, TensorParallelPlanError, PipelineSplitError, TrainStepError)
# Refusals a forked worker may give for the layout itself; a step that could not run there
# (TrainStepError) is measured again in this process, where it may run (note on `_WorkerFailed`).
_LAYOUT_REFUSALS = (LayoutError, TensorParallelPlanError, PipelineSplitError)


def composable(layout: Layout) -> bool:
    """Whether a step of `layout` can be composed from 3 and 4 blocks (note [Composing a step from
    two block counts] in block_composition.py): every block is alike in it. "selective" checkpointing
    wraps every other block, so 3 blocks end unwrapped and 4 wrapped, and a straight line through
    them is not the model's step: such layouts are measured whole."""
    return layout.activation_checkpointing != "selective"


@dataclass(frozen=True)
class RankPeak:
    """One kind of rank's step: `rank` names it ("every rank", "stage 0"...), `peak_bytes` the
    most bytes alive at once, `peak` those bytes by category (train_step's categories), `phase`
    the phase of the peak, `at` where in the step it falls ("backward of model.layers.79", "the
    optimizer"), `measured_blocks` the block counts the fake steps ran (composed from them,
    note [Composing a step from two block counts], and with pipelining note [Composing a pipelined
    step]: the blocks in all, `pp × stages_per_rank` times those per stage; empty: the whole model
    ran), `by_module` the peak's bytes by part of the model and category (`module_parts`: the
    top-level modules, the repeated blocks as one part; note [Bytes by part]), adding up to
    `peak_bytes`)."""

    rank: str
    peak_bytes: int
    peak: dict[str, int]
    phase: str = "forward"
    at: str = ""
    measured_blocks: tuple[int, ...] = ()
    by_module: dict[str, dict[str, int]] = field(default_factory=dict)

    def module_table(self) -> pd.DataFrame:
        """`by_module` as a table: a row per part of the model, the most bytes first; `bytes` (the
        part's total at the peak), then a column per category the peak holds."""
        categories = [category for category, value in self.peak.items() if value]
        rows = [
            {"module": part, "bytes": sum(by_category.values()), **{c: by_category.get(c, 0) for c in categories}}
            for part, by_category in self.by_module.items()
        ]
        table = pd.DataFrame(rows, columns=["module", "bytes", *categories])
        return table.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class Refused:
    """What an engine said when it refused a layout."""

    reason: str


Measured = tuple[tuple[RankPeak, ...], dict[str, int]]


class Measurements:
    """Fake steps, each measured once per distinct configuration (replicas do not change a rank's
    memory) and composed over the blocks when they are alike (per stage, with pipelining)."""

    def __init__(
        self,
        module: nn.Module,
        inputs: tuple,
        kwargs: dict,
        batch: int,
        tp_plan: Mapping[str, str] | None,
        optimizer: OptimizerFactory | None,
        loss: LossFunction | None,
        keep_outputs: bool = True,
    ) -> None:
        self.module, self.inputs, self.kwargs, self.batch = module, inputs, kwargs, batch
        self.tp_plan, self.optimizer, self.loss, self.keep_outputs = tp_plan, optimizer, loss, keep_outputs
        self.stack: BlockStack | None = block_stack(module)
        self.part_order = module_parts(module).labels()
        self.cache: dict[tuple, Measured | Refused] = {}

    def ranks(self, layout: Layout) -> Measured | Refused:
        """Each kind of rank's peak under `layout` and one rank's collectives by kind (bytes), or the
        engines' refusal."""
        key = self.key(layout)
        if key not in self.cache:
            self.cache[key] = self.measure(layout)
        return self.cache[key]

    def measure(self, layout: Layout, refusals: tuple[type[Exception], ...] = REFUSALS) -> Measured | Refused:
        """`layout`'s measurement, uncached; the errors among `refusals` make it `Refused`."""
        try:
            return self._pipelined(layout) if layout.pp > 1 else self._measured(layout)
        except refusals as error:
            return Refused(str(error))

    @staticmethod
    def key(layout: Layout) -> tuple:
        """What a rank's measurement depends on: everything but the replicas' count."""
        return (
            layout.dp_shard,
            layout.data_parallel > 1,
            layout.tp,
            layout.pp,
            layout.pp_schedule,
            layout.stages_per_rank,
            layout.activation_checkpointing,
            layout.mixed_precision,
            layout.micro_batch_size,
            layout.accumulation_steps,
        )

    def _arguments(self, layout: Layout) -> tuple[tuple, dict]:
        size = layout.micro_batch_size
        made: dict[int, torch.Tensor] = {}
        inputs = tuple(_resized(value, self.batch, size, made) for value in self.inputs)
        return inputs, {key: _resized(value, self.batch, size, made) for key, value in self.kwargs.items()}

    def _step(self, module: nn.Module, layout: Layout) -> LayoutStep:
        inputs, kwargs = self._arguments(layout)
        return layout_step(
            module,
            *inputs,
            layout=layout,
            tp_plan=self.tp_plan,
            optimizer=self.optimizer,
            loss=self.loss,
            keep_outputs=self.keep_outputs,
            **kwargs,
        )

    def _measured(self, layout: Layout) -> tuple[tuple[RankPeak, ...], dict[str, int]]:
        stack = self.stack
        if stack is None or not stack.alike or not composable(layout):
            step = self._step(self.module, layout)
            rank = RankPeak(
                "every rank",
                step.peak_bytes,
                step.peak,
                step.phase,
                at=f"the {step.phase}",
                by_module=step.peak_by_module,
            )
            return (rank,), dict(step.communication.bytes)
        counts = (SHORT_BLOCKS, SHORT_BLOCKS + 1)
        steps = [self._step(truncated(self.module, stack, count), layout) for count in counts]
        short, longer = (
            candidates_of(count, stack, step.phase_own_peaks, step.block_peaks) for count, step in zip(counts, steps)
        )
        composed = compose_peak(short, longer, stack.count)
        extra = stack.count - counts[0]
        first, second = (step.communication.bytes for step in steps)
        communication = {kind: first[kind] + extra * (second[kind] - first[kind]) for kind in first}
        rank = RankPeak(
            "every rank",
            composed.peak_bytes,
            composed.peak,
            composed.phase,
            at=_where(composed.candidate, stack),
            measured_blocks=counts,
            by_module=nested(composed.by_part, self.part_order),
        )
        return (rank,), communication

    def _pipelined(self, layout: Layout) -> Measured:
        """A rank per stage; collectives: each kind's most over the stage ranks, and the most any rank
        sends and receives point to point. Composed from 3 and 4 blocks per stage when the blocks
        are alike and split evenly (note [Composing a pipelined step]); otherwise the whole model is
        split and run (blocks not alike, or not divisible into the stages: `plan_stages` refuses those)."""
        stages = layout.pp * layout.stages_per_rank
        stack = self.stack
        if stack is None or not stack.alike or stack.container != "model.layers" or stack.count % stages:
            return self._whole_pipeline(layout)
        if not composable(layout):
            return self._whole_pipeline(layout)
        per_stage = stack.count // stages
        counts = (SHORT_BLOCKS, SHORT_BLOCKS + 1)
        if per_stage <= counts[1]:  # the two short steps would cost more than the whole one
            return self._whole_pipeline(layout)
        short, longer = self._pipeline_steps(
            [truncated(self.module, stack, stages * count) for count in counts], layout
        )
        composed = compose_ranks(short, longer, per_stage, stack)
        ranks = tuple(
            RankPeak(
                _stage_name(step),
                rank.peak_bytes,
                rank.peak,
                rank.phase,
                at=f"{rank.at}, {_in_flight(step)} microbatches in flight "
                f"(composed from {counts[0]} and {counts[1]} blocks per stage)",
                measured_blocks=tuple(stages * count for count in counts),
                by_module=nested(rank.by_part, self.part_order),
            )
            for rank, step in zip(composed, short, strict=True)
        )
        kinds = {kind for rank in composed for kind in rank.communication}
        communication = {kind: max(rank.communication.get(kind, 0) for rank in composed) for kind in kinds}
        communication["send_recv"] = max(rank.p2p_total for rank in composed)
        return ranks, communication

    def _pipeline_steps(self, modules: list[nn.Module], layout: Layout) -> list[list[PipelineStageStep]]:
        inputs, kwargs = self._arguments(layout)
        return pipeline_steps(
            modules, *inputs, layout=layout, optimizer=self.optimizer, keep_outputs=self.keep_outputs, **kwargs
        )

    def _whole_pipeline(self, layout: Layout) -> Measured:
        """The pipelined layout measured on the whole model, split (not composed)."""
        (steps,) = self._pipeline_steps([self.module], layout)
        ranks = tuple(
            RankPeak(
                _stage_name(step),
                step.peak_bytes,
                step.peak,
                step.phase,
                at=f"the {step.phase}, {_in_flight(step)} microbatches in flight",
                by_module=step.peak_by_module,
            )
            for step in steps
        )
        communication = {
            kind: max(step.communication.bytes.get(kind, 0) for step in steps) for kind in steps[0].communication.bytes
        }
        communication["send_recv"] = max(step.p2p_total for step in steps)
        return ranks, communication


def _stage_name(step: PipelineStageStep) -> str:
    return f"stage {', '.join(map(str, step.stages))}"


def _in_flight(step: PipelineStageStep) -> int:
    """The most microbatches any of the rank's stages held activations for (whatever its blocks)."""
    return max(step.in_flight.values(), default=0)


def _where(candidate: str, stack: BlockStack) -> str:
    kind, _, position = candidate.partition("@")
    what, _, phase = kind.partition(":")
    if what == "phase":
        return f"the {phase}"
    return f"{phase} of {stack.path(range(stack.count)[int(position)])}"


def _resized(value: Any, batch: int, size: int, made: dict[int, torch.Tensor]) -> Any:
    """`value` with a leading batch dimension of `batch` resized to `size` (tensors and shapes);
    `made` keeps one resized tensor per tensor, so that inputs passed twice stay one storage."""
    if size == batch:
        return value
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch:
        if id(value) not in made:
            made[id(value)] = value.new_zeros((size, *value.shape[1:]))
        return made[id(value)]
    if isinstance(value, (tuple, torch.Size)) and value and all(isinstance(v, int) for v in value):
        return (size, *value[1:]) if value[0] == batch else value
    return value


_FORKED: Measurements | None = None  # what a forked worker measures with (inherited, not pickled)


@dataclass(frozen=True)
class _WorkerFailed:
    """A worker could not measure (autograd refuses to run in a process forked after a backward on
    CUDA builds of torch): the layout is measured in this process instead."""

    reason: str


def _measure_forked(layout: Layout) -> tuple[tuple, Measured | Refused | _WorkerFailed]:
    assert _FORKED is not None
    torch.set_num_threads(1)
    hold_fake_groups_until_exit()  # this worker's steps share fake groups and DTensor's caches until it exits
    try:
        return Measurements.key(layout), _FORKED.measure(layout, _LAYOUT_REFUSALS)
    except Exception as error:  # any failure here is measured again, and raised or refused, in the parent
        return Measurements.key(layout), _WorkerFailed(f"{type(error).__name__}: {error}")


def measure_in_workers(measurements: Measurements, layouts: Iterable[Layout], workers: int) -> None:
    """Fill `measurements`' cache for `layouts` (one per distinct key) in `workers` forked processes.

    Forked, not spawned: the workers inherit the module (a deferred model cannot be pickled) and
    each measures on fakes only. What a worker fails to measure is left for this process to measure
    (and to raise about): a fork is an optimisation, never a different answer."""
    global _FORKED
    distinct: dict[tuple, Layout] = {}
    for layout in layouts:
        key = Measurements.key(layout)
        if key not in measurements.cache:
            distinct.setdefault(key, layout)
    if not distinct:
        return
    # the longest first (pipelined steps run every stage rank), so that no long one is left for last;
    # the sort is stable: layouts next to each other stay together
    todo = sorted(distinct.values(), key=lambda layout: -layout.pp * layout.stages_per_rank)
    _FORKED = measurements
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, len(distinct))) as pool:
            # two by two: layouts next to each other differ in checkpointing only, so one worker measures
            # both on one held fake group (note [Fake groups held across steps])
            for key, measured in pool.imap_unordered(_measure_forked, todo, chunksize=2):
                if not isinstance(measured, _WorkerFailed):
                    measurements.cache[key] = measured
    finally:
        _FORKED = None
