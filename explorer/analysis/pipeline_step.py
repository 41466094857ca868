"""`pipeline_step`: the memory of one stage rank's training step under pipeline parallelism, on fakes.

The model is split into stages (`pipeline_split`: its blocks evenly, embedding on the first stage,
norm and head on the last) and rank r's stages (r, r + pp, ... with the interleaved schedule) are
run by torch.distributed.pipelining's own schedule (`Schedule1F1B`, `ScheduleGPipe`,
`ScheduleInterleaved1F1B`), as rank r of a fake process group of `pp` ranks, on fake tensors, under
`FastPipelineMemTracker`: the same code a real pipeline runs, the same receive buffers (one per
microbatch, made up front), the same forward cache holding each microbatch's boundary tensors until
its backward, the same sends and receives (which on the fake backend move nothing). Nothing is
replayed by hand: the one change is the schedule's P2P warm-up vote, answered locally
(note [The pipeline vote on a fake rank]), so every stage is given its boundary shapes up front
(static metadata), found by one forward of the chained stages on fakes.

The loop measured, per rank (the loop of torchtitan's pipelined train step):

    output = schedule.step(batch, target=labels)     # first stage gets the batch, last the target
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del output                                       # the last stage's merged outputs, kept so far

with `keep_outputs=False` as `schedule.step(..., return_outputs=False)`: the last stage neither keeps
each microbatch's output nor merges them. The numbers are those PyTorch's `MemTracker` reports for
the same step of the eager model (tests/explorer/analysis/test_pipeline_step.py runs the real thing
on two gloo ranks): tensor storages only.

Covered: pp with 1F1B, GPipe and interleaved 1F1B; activation checkpointing ("block", "selective");
FSDP2, HSDP and TP inside a stage (note [Parallel stages]).

Note: [Parallel stages]
With data parallelism (`dp_replicate × dp_shard > 1`) or TP, the process group is `layout.gpus` fake
ranks on the mesh ("pp", "dp_replicate", "dp_shard", "tp") (torchtitan's order, dims of degree 1
included) and stage rank r is the rank whose "pp" coordinate is r and whose others are 0; its
stages run on the "pp" group. They are cut from a fake twin of their own (parallelizing changes
modules in place) and each is parallelized as torchtitan's pipelined Llama is, by
`layout_step.parallelize_twin` on the stage: TP with the model's own plan (`tp_plan_of`) on the
stage's blocks and pieces (`tp_plans.plan_for_part`), activation checkpointing on its blocks, then
`fully_shard` over ("dp_replicate", "dp_shard") per block and on the stage, with
`reshard_after_forward=False` (torchtitan's default under pipelining: no all-gather per microbatch).
PyTorch's stage then defers gradient reduction to the last microbatch's backward, as on a real
pipeline. Data-parallel steps are measured by `FastFSDPPipelineMemTracker` in FSDP's categories
(`train_step.FSDP_CATEGORIES`), with the collectives counted (`comm_count`); `dp_replicate` alone
is FSDP2 with unsharded groups, as in `layout_step`. A boundary tensor under TP is whole on every
rank (the plan's rowwise and gathered outputs are replicated), so the boundaries are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from .._torch_compat.fake import FakeTensorMode
from .._torch_compat.memory_tracker import FastFSDPPipelineMemTracker, FastPipelineMemTracker, MemTracker
from .._torch_compat.pipelining import SCHEDULES
from ..record.scope import recording_graph
from .comm_count import CollectiveCounter, Communication
from .cpu_fake_mode import CpuFakeTensorMode
from .dry_run import fake_forward_arguments
from .fake_fsdp import checkpoint_blocks, fake_process_group
from .layout_step import MESH_DIMS, parallelize_twin
from .module_parts import ModuleParts, module_parts, nested, split_by_part
from .parallel_layout import Layout, LayoutError
from .pipeline_monitor import StepMonitor, monitored_stage
from .pipeline_split import DecoderStage, StagePlan, plan_stages
from .tp_plans import check_tp_plan, plan_for_part, tp_plan_of
from .train_modules import block_call_snapshots, unwrapped
from .train_step import FSDP_CATEGORIES, SINGLE_CATEGORIES, Breakdown, OptimizerFactory, TrainStepError, breakdown
from .train_twin import fake_twin

__all__ = ["PIPELINE_MESH_DIMS", "PipelineLoss", "PipelineStageStep", "pipeline_step", "pipeline_steps"]

PIPELINE_MESH_DIMS = ("pp", *MESH_DIMS)

PipelineLoss = Callable[[Any, torch.Tensor], torch.Tensor]
P2PKind = Literal["activations_sent", "activations_received", "gradients_sent", "gradients_received"]


@dataclass(frozen=True)
class PipelineStageStep:
    """One stage rank's training step under pipeline parallelism (what one GPU of the pipeline holds).

    `rank` of `pp`; `stages`: the stage indices it runs (one, or `stages_per_rank` with the
    interleaved schedule); `blocks`: their repeated blocks; `embedding` / `head`: whether it holds
    the first stage's embedding / the last stage's norm and head. `peak_bytes`: the most bytes alive
    at once; `peak`: those bytes by category (`train_step.SINGLE_CATEGORIES`; "inputs" is the batch
    and the target); `phase`: the phase the peak was reached in ("forward": a forward microbatch,
    the loss, the merged outputs; "backward"; "optimizer"); `phase_peaks`: the running peak at the
    end of each phase's last action. `in_flight`: per stage, the most microbatches whose forward had
    run and whose backward had not (what the stage holds activations for). `p2p_bytes`: the bytes
    this rank sends and receives in one step (activations forward, gradients backward), summed
    over the tensors the schedule actually passes to send and receive. With data parallelism the
    categories are FSDP's (`train_step.FSDP_CATEGORIES`, note [Parallel stages]);
    `communication`: this rank's collectives in the step (FSDP's and TP's, not the P2P; note
    [Collective bytes]).

    `peak_by_module`: the peak's bytes by part of the model and category (`module_parts`, note
    [Bytes by part]).
    `window_peaks`: the step's windows in order (each action, "forward 1.0" being the forward of
    microbatch 0 on stage 1; "between" two actions; "optimizer") with each one's own peak, as (label,
    `Breakdown`); `block_peaks`: per (block path in the model, "forward" or "backward"), the
    `Breakdown` of each call's peak, by microbatch. The candidate peaks of the step (note [Composing a pipelined
    step] in pipeline_composition): the step's peak is the largest window peak.
    """

    rank: int
    pp: int
    schedule: str
    microbatches: int
    stages: tuple[int, ...]
    blocks: tuple[str, ...]
    embedding: bool
    head: bool
    peak_bytes: int
    peak: dict[str, int]
    phase: str
    phase_peaks: dict[str, int]
    in_flight: dict[int, int]
    p2p_bytes: dict[str, int] = field(default_factory=dict)
    communication: Communication = field(default_factory=Communication)
    window_peaks: tuple[tuple[str, Breakdown], ...] = ()
    block_peaks: dict[tuple[str, str], tuple[Breakdown, ...]] = field(default_factory=dict)
    peak_by_module: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def p2p_total(self) -> int:
        """Bytes sent and received by this rank in one step."""
        return sum(self.p2p_bytes.values())


def _tp_plan(module: nn.Module, layout: Layout) -> dict[str, str]:
    """The model's own tensor-parallel plan ({} without TP)."""
    if layout.tp == 1:
        return {}
    plan = tp_plan_of(module)
    if not plan:
        raise LayoutError(
            f"{type(module).__name__} has no tensor-parallel plan for TP {layout.tp}: pipeline_step reads the "
            "model's own (tp_plan_of); use tp=1"
        )
    return plan


def _parallel(layout: Layout) -> bool:
    """Whether the stages are parallelized inside (note [Parallel stages])."""
    return layout.data_parallel > 1 or layout.tp > 1


def _checkpointed(twin: nn.Module, plans: list[StagePlan], mode: str) -> None:
    """Activation checkpointing on the twin's blocks: every block ("block"), or the second, fourth...
    of each stage ("selective", as torchtitan's `selective_ac_option="2"` counts a stage's layers)."""
    if mode == "none":
        return
    chosen = [path for plan in plans for k, path in enumerate(plan.blocks) if mode == "block" or k % 2 == 1]
    checkpoint_blocks(twin, [(path, twin.get_submodule(path)) for path in chosen])


def _check_on_cpu(twin: nn.Module, root_class: str) -> None:
    """The stages run on CPU fakes (a schedule on a CUDA stage forks the CUDA RNG, which needs a GPU)."""
    devices = sorted({str(p.device) for p in twin.parameters()} - {"cpu"})
    if devices:
        raise TrainStepError(
            f"pipeline_step runs the stages on CPU fakes; {root_class}'s parameters are on {', '.join(devices)}: "
            "defer it on the CPU (on CUDA, PyTorch's trackers would round each storage up to 512 bytes)"
        )


def _stage_batch(args: tuple, kwargs: dict, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """One microbatch's token ids and target (`labels=`, else the ids themselves), checked against
    the layout's micro-batch size."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if not isinstance(ids, torch.Tensor) or len(args) > 1 or set(kwargs) - {"input_ids", "labels"}:
        raise TypeError(
            "pipeline_step takes one microbatch's token ids (a tensor or shape, or input_ids=) and optionally "
            f"labels=; got {len(args)} positional and keyword {sorted(kwargs)}"
        )
    target = kwargs.get("labels", ids)
    if ids.shape[0] != layout.micro_batch_size:
        raise LayoutError(
            f"the inputs hold a microbatch of {ids.shape[0]} sequences, Layout.micro_batch_size is "
            f"{layout.micro_batch_size}: pass one microbatch's inputs"
        )
    return ids, target


def _boundaries(stages: list[DecoderStage], ids: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """What crosses each stage boundary, found by running the chained stages once (fakes): entry i is
    stage i's input, the last entry the last stage's output. Under bf16 mixed precision the stages
    compute in bf16 (FSDP2 casts their inputs and parameters), so what crosses is bf16: the schedule's
    receive buffers are allocated from these, and torch 2.11 checks each stage's outputs against them."""
    found = [ids]
    for stage in stages:
        out = stage(found[-1]).detach()
        if layout.mixed_precision == "bfloat16" and out.is_floating_point():
            out = out.to(torch.bfloat16)
        found.append(out.requires_grad_(True))
    return found


def _causal_lm_loss(twin: nn.Module) -> PipelineLoss:
    loss_function = getattr(twin, "loss_function", None)
    if loss_function is None:
        raise TrainStepError(f"{type(twin).__name__} has no loss_function: pass loss=(output, target) -> loss")
    vocab = getattr(twin, "config").vocab_size  # noqa: B009 - a transformers config, untyped here
    return lambda logits, target: loss_function(logits=logits, labels=target, vocab_size=vocab)


def pipeline_step(
    module: nn.Module,
    *inputs: Any,
    layout: Layout,
    optimizer: OptimizerFactory | None = None,
    loss: PipelineLoss | None = None,
    rank: int | None = None,
    keep_outputs: bool = True,
    **forward_kwargs: Any,
) -> list[PipelineStageStep]:
    """The memory of one training step of each pipeline stage rank (of `rank` only, when given), on fakes.

    `module`: a decoder-only causal LM with the Llama layout (deferred, partly materialized or eager;
    left unchanged, nothing recorded, the global RNG restored). `inputs`: one microbatch's token
    ids (a tensor or a shape, or `input_ids=`), optionally `labels=` (default: the ids); the batch
    the schedule splits is `layout.accumulation_steps` of them. `layout`: pp, pp_schedule,
    stages_per_rank, activation_checkpointing, micro_batch_size, accumulation_steps (the schedule's
    microbatches), and dp_replicate, dp_shard, tp inside each stage (note [Parallel stages]; TP
    with the model's own plan). `optimizer`: parameters → optimizer (default AdamW);
    `loss(output, target)`: the schedule's loss function (default: the model's own
    `loss_function`). `keep_outputs`: the schedule's `return_outputs`.

    Returns one `PipelineStageStep` per stage rank, by rank. Raises TypeError for a non-module or
    unreadable inputs, LayoutError for a layout it does not cover (TP on a model without a plan),
    TensorParallelPlanError for a plan it cannot apply, PipelineSplitError for a model it cannot
    split, TrainStepError when a step cannot run on fakes.
    """
    (steps,) = pipeline_steps(
        [module], *inputs, layout=layout, optimizer=optimizer, loss=loss, ranks=None if rank is None else [rank],
        keep_outputs=keep_outputs, **forward_kwargs,
    )  # fmt: skip
    return steps


def pipeline_steps(
    modules: Sequence[nn.Module],
    *inputs: Any,
    layout: Layout,
    optimizer: OptimizerFactory | None = None,
    loss: PipelineLoss | None = None,
    ranks: Sequence[int] | None = None,
    keep_outputs: bool = True,
    **forward_kwargs: Any,
) -> list[list[PipelineStageStep]]:
    """`pipeline_step` of each of `modules` under one layout (each entry: that module's ranks), run
    rank by rank: rank r of every module before rank r + 1. Consecutive steps of one rank then ask for
    the same fake process group, which `fake_groups_held()` keeps up between them, DTensor's caches
    with it (note [Fake groups held across steps]). Raises as `pipeline_step` does."""
    for module in modules:
        if not isinstance(module, nn.Module):
            raise TypeError(f"explorer.pipeline_step expects an nn.Module, got {type(module).__name__}")
    if recording_graph() is not None:
        raise TrainStepError(
            "pipeline_step cannot run inside deferred_init: call it on the module deferred_init returned"
        )
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be an explorer Layout, got {type(layout).__name__}")
    for rank in ranks or ():
        if not 0 <= rank < layout.pp:
            raise ValueError(f"rank must be in 0..{layout.pp - 1} for Layout.pp={layout.pp}, got {rank!r}")
    rng_state = torch.get_rng_state()
    try:
        runs = [_prepared(module, inputs, forward_kwargs, layout, optimizer, loss, keep_outputs) for module in modules]
        measured: list[list[PipelineStageStep]] = [[] for _ in runs]
        for rank in range(layout.pp) if ranks is None else ranks:
            for run, steps in zip(runs, measured, strict=True):
                steps.append(run.measure(rank))
        return measured
    finally:
        torch.set_rng_state(rng_state)


def _prepared(
    module: nn.Module,
    inputs: tuple,
    forward_kwargs: dict,
    layout: Layout,
    optimizer: OptimizerFactory | None,
    loss: PipelineLoss | None,
    keep_outputs: bool,
) -> _RankRun:
    """What every rank's step of `module` shares: its fake twin cut into stages, the stage boundaries
    (one forward of the chained stages), the batch and the loop's choices."""
    tp_plan = _tp_plan(module, layout)
    plans = plan_stages(module, layout.pp * layout.stages_per_rank)
    mode = CpuFakeTensorMode(allow_non_fake_inputs=True)
    twin = fake_twin(module, mode).train()
    _check_on_cpu(twin, type(module).__name__)
    if _parallel(layout):
        check_tp_plan(twin, tp_plan)  # keyed by the model's paths: checked once, on the whole twin
    else:
        _checkpointed(twin, plans, layout.activation_checkpointing)
    args, kwargs = fake_forward_arguments(module, mode, torch.device("cpu"), inputs, forward_kwargs)
    ids, target = _stage_batch(args, kwargs, layout)
    stages = [DecoderStage(twin, plan) for plan in plans]
    with mode, torch.enable_grad():
        boundaries = _boundaries(stages, ids, layout)
    return _RankRun(layout, stages, boundaries, ids, target, optimizer or torch.optim.AdamW,
                    loss or _causal_lm_loss(twin), keep_outputs, mode, module, tp_plan,
                    module_parts(module))  # fmt: skip


@dataclass
class _RankRun:
    """What every rank's run shares: the stages, their boundaries, the batch, the loop's choices."""

    layout: Layout
    stages: list[DecoderStage]
    boundaries: list[torch.Tensor]
    ids: torch.Tensor
    target: torch.Tensor
    make_optimizer: OptimizerFactory
    loss: PipelineLoss
    keep_outputs: bool
    mode: FakeTensorMode
    module: nn.Module
    tp_plan: dict[str, str]
    parts: ModuleParts  # the model's, which every rank's bytes are split by (note [Bytes by part])

    def measure(self, rank: int) -> PipelineStageStep:
        """Stage rank `rank`'s step, measured: rank `rank` of a fake group of pp ranks, or of
        `layout.gpus` ranks with its stages parallelized (note [Parallel stages])."""
        layout = self.layout
        indices = [rank + k * layout.pp for k in range(layout.stages_per_rank)]
        monitor, counter = StepMonitor(), CollectiveCounter()
        if not _parallel(layout):
            with fake_process_group(layout.pp, "cpu", rank=rank), self.mode, torch.enable_grad():
                blocks = self._run([self.stages[i] for i in indices], indices, monitor, counter, None)
            return self._result(rank, indices, monitor, counter, blocks)
        shape = (layout.pp, layout.dp_replicate, layout.dp_shard, layout.tp)
        global_rank = rank * (layout.gpus // layout.pp)  # "pp" coordinate `rank`, the others 0
        with fake_process_group(layout.gpus, "cpu", shape, PIPELINE_MESH_DIMS, rank=global_rank) as mesh:
            modules = self._parallel_stages(indices, mesh)
            with self.mode, torch.enable_grad():
                blocks = self._run(modules, indices, monitor, counter, mesh["pp"].get_group())
        return self._result(rank, indices, monitor, counter, blocks)

    def _parallel_stages(self, indices: list[int], mesh: Any) -> list[DecoderStage]:
        """The stages at `indices`, cut from a twin of their own and parallelized (note [Parallel stages])."""
        twin = fake_twin(self.module, self.mode).train()
        stages = [DecoderStage(twin, self.stages[i].plan) for i in indices]
        for stage in stages:
            blocks = [f"layers.{index}" for index in stage.layers]
            plan = plan_for_part(self.tp_plan, stage.model_paths())
            parallelize_twin(stage, mesh, self.layout, plan, blocks, reshard_after_forward=False)
        return stages

    def _run(
        self,
        modules: Sequence[nn.Module],
        indices: list[int],
        monitor: StepMonitor,
        counter: CollectiveCounter,
        group: Any,
    ) -> dict[tuple[str, str], list[dict]]:
        """Run the rank's step under its tracker; each of its blocks' per-call peak snapshots, by
        (path in the model, pass)."""
        layout, count = self.layout, len(self.stages)
        pipeline = [
            monitored_stage(module, i, count, self.boundaries[i], self.boundaries[i + 1], monitor, group)
            for module, i in zip(modules, indices, strict=True)
        ]
        schedule_class = SCHEDULES[layout.pp_schedule]
        stage_argument: Any = pipeline if layout.pp_schedule == "Interleaved1F1B" else pipeline[0]
        try:
            schedule = schedule_class(stage_argument, n_microbatches=layout.accumulation_steps, loss_fn=self.loss)
        except ValueError as error:  # the schedule's own rule on microbatches and stages
            raise LayoutError(
                f"{layout.pp_schedule} cannot run {layout.accumulation_steps} microbatches (Layout.accumulation_steps) "
                f"over {count} stages: {error}"
            ) from error
        optimizer = self.make_optimizer([p for m in modules for p in m.parameters()])
        batch = torch.cat([self.ids] * layout.accumulation_steps)
        # the ids themselves when no labels were given: one tensor, as `schedule.step(ids, target=ids)` passes
        target = batch if self.target is self.ids else torch.cat([self.target] * layout.accumulation_steps)
        tracker = _tracker(modules, optimizer, self.parts, batch, target)
        tracker.op_observer = counter.observe  # the tracker's ops, counted without a mode of its own
        monitor.tracker = tracker
        args = (batch,) if 0 in indices else ()
        kwargs = {"target": target} if count - 1 in indices else {}
        try:
            with tracker:
                output = schedule.step(*args, return_outputs=self.keep_outputs, **kwargs)
                monitor.between_actions()
                monitor.close_window("between")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                monitor.finish("optimizer")
                monitor.close_window("optimizer")
                del output
        except Exception as error:
            raise TrainStepError(
                f"the pipeline step of stages {indices} cannot run on fake tensors, in the {monitor.phase}: "
                f"{type(error).__name__}: {error}"
            ) from error
        return _block_calls(modules, tracker)

    def _result(
        self,
        rank: int,
        indices: list[int],
        monitor: StepMonitor,
        counter: CollectiveCounter,
        blocks: dict[tuple[str, str], list[dict]],
    ) -> PipelineStageStep:
        categories = FSDP_CATEGORIES if self.layout.data_parallel > 1 else SINGLE_CATEGORIES
        peak_bytes, peak, peak_parts = breakdown(monitor.peak_snapshot(), categories)
        plans = [self.stages[i].plan for i in indices]
        return PipelineStageStep(
            rank=rank,
            pp=self.layout.pp,
            schedule=self.layout.pp_schedule,
            microbatches=self.layout.accumulation_steps,
            stages=tuple(indices),
            blocks=tuple(path for plan in plans for path in plan.blocks),
            embedding=any(plan.embedding for plan in plans),
            head=any(plan.head for plan in plans),
            peak_bytes=peak_bytes,
            peak=peak,
            phase=monitor.peak_phase,
            phase_peaks=dict(monitor.phase_peaks),
            in_flight=dict(monitor.most_in_flight),
            p2p_bytes=dict(monitor.p2p_bytes),
            communication=counter.communication,
            window_peaks=tuple((label, breakdown(snap, categories)) for label, snap in monitor.windows),
            block_peaks={key: tuple(breakdown(snap, categories) for snap in calls) for key, calls in blocks.items()},
            peak_by_module=nested(peak_parts, self.parts.labels()),
        )


def _block_calls(modules: Sequence[nn.Module], tracker: MemTracker) -> dict[tuple[str, str], list[dict]]:
    """The per-call peak snapshots of the blocks of the rank's stages, by (path in the model, pass)."""
    found: dict[tuple[str, str], list[dict]] = {}
    for module in modules:
        plan = getattr(module, "plan")  # noqa: B009 - a DecoderStage, possibly FSDP's subclass of it
        in_stage = {f"layers.{path.rpartition('.')[2]}": path for path in plan.blocks}
        for (path, phase), calls in block_call_snapshots(module, tracker, list(in_stage)).items():
            found[(in_stage[path], phase)] = calls
    return found


def _tracker(
    modules: Sequence[nn.Module], optimizer: torch.optim.Optimizer, parts: ModuleParts, *inputs: torch.Tensor
) -> FastPipelineMemTracker | FastFSDPPipelineMemTracker:
    """The tracker for the rank's stages: FSDP's when they are sharded, the batch and target as inputs,
    its bytes split by the model's `parts` (note [Bytes by part])."""
    tracker: FastPipelineMemTracker | FastFSDPPipelineMemTracker
    if isinstance(modules[0], FSDPModule):
        tracker = FastFSDPPipelineMemTracker(modules, optimizer)
    else:
        tracker = FastPipelineMemTracker()
    paths: dict[str, str] = {"": "model"}  # a stage's own forward is the decoder's (masks, positions)
    for module in modules:
        paths.update(getattr(module, "model_paths")())  # noqa: B009 - a DecoderStage, possibly FSDP's subclass of it
    split_by_part(tracker, parts, modules, optimizer, lambda path: unwrapped(paths.get(path, path)))
    if isinstance(tracker, FastFSDPPipelineMemTracker):
        tracker.track_inputs(inputs)
    else:
        tracker.track_external(*modules, optimizer, *inputs)
    return tracker
