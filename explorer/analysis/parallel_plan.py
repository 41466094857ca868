"""`plan_parallel`: which layout fits? Every FSDP × TP × PP × checkpointing layout of a step, on fakes.

A `ParallelPlan` holds one `LayoutResult` per layout asked about: the peak of each kind of rank (a
pipeline stage is a kind; without pipelining every rank is alike), by category, the communication
per step by collective, and a throughput proxy; or, for a layout the model does not allow, why.
`table()` lists them, the layouts that fit first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
import torch
from torch import nn

from .block_composition import SHORT_BLOCKS, BlockStack, block_stack, candidates_of, compose_peak, truncated
from .fake_fsdp import repeated_blocks
from .layout_step import LayoutStep, layout_step
from .parallel_cost import Hardware, ModelCost, step_cost
from .parallel_layout import ActivationCheckpointing, Layout, LayoutError, ModelFacts, layout_problems
from .pipeline_split import PipelineSplitError
from .pipeline_step import pipeline_step
from .tp_plans import TensorParallelPlanError, tp_plan_of
from .train_budget import parse_budget
from .train_step import LossFunction, OptimizerFactory

__all__ = ["LayoutResult", "ParallelPlan", "RankPeak", "TABLE_COLUMNS", "plan_parallel"]

TABLE_COLUMNS = (
    "layout",
    "fits",
    "peak_bytes",
    "headroom_bytes",
    "slowest_rank",
    "communication_bytes",
    "exposed_communication_s",
    "recompute_flops",
    "step_proxy_s",
    "global_batch",
    "problems",
)


@dataclass(frozen=True)
class RankPeak:
    """One kind of rank's step: `rank` names it ("every rank", "stage 0"...), `peak_bytes` the
    most bytes alive at once, `peak` those bytes by category (train_step's categories), `phase`
    the phase of the peak, `at` where in the step it falls ("backward of model.layers.79", "the
    optimizer step"), `measured_blocks` the block counts the fake steps ran (composed from them,
    note [Composing a step from two block counts]; empty: the whole model ran)."""

    rank: str
    peak_bytes: int
    peak: dict[str, int]
    phase: str = "forward"
    at: str = ""
    measured_blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class LayoutResult:
    """A layout and what one step needs under it.

    `problems`: why the layout cannot run on this model (empty when it can; then `ranks` is empty
    and the numbers are 0). `ranks`: one `RankPeak` per kind of rank. `communication`: bytes per
    step each rank moves, by collective ("all_gather", "reduce_scatter", "all_reduce", "send_recv"...).
    `recompute_flops`: floating-point operations activation checkpointing repeats per step;
    `exposed_communication_s`, `step_proxy_s`: the throughput proxy (see `plan_parallel`).
    """

    layout: Layout
    problems: tuple[str, ...] = ()
    ranks: tuple[RankPeak, ...] = ()
    communication: dict[str, int] = field(default_factory=dict)
    compute_flops: int = 0
    recompute_flops: int = 0
    exposed_communication_s: float = 0.0
    step_proxy_s: float = 0.0

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def peak_bytes(self) -> int:
        """The most any rank needs (the slowest rank's, with uneven stages)."""
        return max((rank.peak_bytes for rank in self.ranks), default=0)

    @property
    def slowest_rank(self) -> RankPeak | None:
        return max(self.ranks, key=lambda rank: rank.peak_bytes, default=None)


@dataclass(frozen=True)
class ParallelPlan:
    """The layouts of one model's training step over `gpus` GPUs of `gpu_memory` bytes each."""

    root_class: str
    gpus: int
    gpu_memory: int
    results: tuple[LayoutResult, ...]
    proxy_note: str = ""

    def fits(self, result: LayoutResult) -> bool:
        return result.valid and result.peak_bytes <= self.gpu_memory

    def ordered(self) -> list[LayoutResult]:
        """Layouts that fit first (fastest proxy first), then those that do not (smallest peak
        first), then the invalid ones."""
        return sorted(
            self.results,
            key=lambda r: (not r.valid, not self.fits(r), r.step_proxy_s if self.fits(r) else r.peak_bytes),
        )

    def best(self) -> LayoutResult | None:
        """The fitting layout with the smallest step proxy; None when nothing fits."""
        fitting = [r for r in self.ordered() if self.fits(r)]
        return fitting[0] if fitting else None

    def table(self) -> pd.DataFrame:
        """One row per layout (`TABLE_COLUMNS`), ordered as `ordered()`."""
        rows = []
        for result in self.ordered():
            slowest = result.slowest_rank
            rows.append(
                {
                    "layout": result.layout.label(),
                    "fits": self.fits(result),
                    "peak_bytes": result.peak_bytes,
                    "headroom_bytes": self.gpu_memory - result.peak_bytes if result.valid else 0,
                    "slowest_rank": slowest.rank if slowest else "",
                    "communication_bytes": sum(result.communication.values()),
                    "exposed_communication_s": result.exposed_communication_s,
                    "recompute_flops": result.recompute_flops,
                    "step_proxy_s": result.step_proxy_s,
                    "global_batch": result.layout.global_batch,
                    "problems": "; ".join(result.problems),
                }
            )
        return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))

    @staticmethod
    def budget(gpu_memory: float | str) -> int:
        return parse_budget(gpu_memory)


# -- the search ------------------------------------------------------------------------------------
DEFAULT_HARDWARE = Hardware()
SEARCH_TP = (1, 2, 4, 8)
SEARCH_PP = (1, 2, 4)
SEARCH_AC: tuple[ActivationCheckpointing, ...] = ("none", "block")


def _powers_of_two(limit: int) -> tuple[int, ...]:
    return tuple(2**k for k in range(limit.bit_length()) if 2**k <= limit)


def candidate_layouts(
    gpus: int,
    *,
    fsdp: Iterable[int] | None = None,
    tp: Iterable[int] = SEARCH_TP,
    pp: Iterable[int] = SEARCH_PP,
    activation_checkpointing: Iterable[ActivationCheckpointing] = SEARCH_AC,
    micro_batch_size: int = 1,
    accumulation_steps: int = 1,
) -> list[Layout]:
    """Every layout of `gpus` ranks with FSDP degree in `fsdp` (default: the powers of two up to
    `gpus`), TP in `tp` and PP in `pp` whose product divides `gpus` (the rest are HSDP replicas),
    each with every checkpointing mode in `activation_checkpointing`. Pipelined layouts run at
    least `pp` microbatches (`accumulation_steps` raised to it)."""
    layouts = []
    for shard in fsdp if fsdp is not None else _powers_of_two(gpus):
        for tensor in tp:
            for stages in pp:
                inner = shard * tensor * stages
                if gpus % inner:
                    continue
                for mode in activation_checkpointing:
                    layouts.append(
                        Layout(
                            dp_shard=shard,
                            dp_replicate=gpus // inner,
                            tp=tensor,
                            pp=stages,
                            activation_checkpointing=mode,
                            micro_batch_size=micro_batch_size,
                            accumulation_steps=max(accumulation_steps, stages) if stages > 1 else accumulation_steps,
                        )
                    )
    return layouts


def model_facts(module: nn.Module, tp_plan: Mapping[str, str] | None) -> ModelFacts:
    """Blocks, heads and key-value heads (from a transformers config, when there is one) and whether a
    tensor-parallel plan is known (`tp_plan`, or the config's `base_model_tp_plan`)."""
    config = getattr(module, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    stack = block_stack(module)
    blocks = stack.count if stack is not None else len(repeated_blocks(module))
    has_plan = bool(tp_plan) or tp_plan_of(module) is not None
    return ModelFacts(blocks, heads, kv_heads, has_plan, type(module).__name__)


def _batch_of(inputs: tuple, kwargs: dict) -> int:
    for value in (*inputs, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
        if isinstance(value, (tuple, torch.Size)) and value and all(isinstance(v, int) for v in value):
            return int(value[0])
    raise LayoutError("plan_parallel needs one micro-batch of inputs (a tensor or a shape) to read its size from")


class _Measurements:
    """Fake steps, each measured once per distinct configuration (replicas do not change a rank's
    memory) and, without pipelining, composed over the blocks when they are alike."""

    def __init__(
        self,
        module: nn.Module,
        inputs: tuple,
        kwargs: dict,
        batch: int,
        tp_plan: Mapping[str, str] | None,
        optimizer: OptimizerFactory | None,
        loss: LossFunction | None,
    ) -> None:
        self.module, self.inputs, self.kwargs, self.batch = module, inputs, kwargs, batch
        self.tp_plan, self.optimizer, self.loss = tp_plan, optimizer, loss
        self.stack: BlockStack | None = block_stack(module)
        self.cache: dict[tuple, tuple[tuple[RankPeak, ...], dict[str, int]]] = {}

    def ranks(self, layout: Layout) -> tuple[tuple[RankPeak, ...], dict[str, int]]:
        """Each kind of rank's peak under `layout`, and one rank's collectives by kind (bytes)."""
        key = (
            layout.dp_shard,
            layout.data_parallel > 1,
            layout.tp,
            layout.pp,
            layout.pp_schedule,
            layout.stages_per_rank,
            layout.activation_checkpointing,
            layout.micro_batch_size,
            layout.accumulation_steps,
        )
        if key not in self.cache:
            self.cache[key] = self._pipelined(layout) if layout.pp > 1 else self._measured(layout)
        return self.cache[key]

    def _arguments(self, layout: Layout) -> tuple[tuple, dict]:
        size = layout.micro_batch_size
        made: dict[int, torch.Tensor] = {}
        inputs = tuple(_resized(value, self.batch, size, made) for value in self.inputs)
        return inputs, {key: _resized(value, self.batch, size, made) for key, value in self.kwargs.items()}

    def _step(self, module: nn.Module, layout: Layout) -> LayoutStep:
        inputs, kwargs = self._arguments(layout)
        return layout_step(
            module, *inputs, layout=layout, tp_plan=self.tp_plan, optimizer=self.optimizer, loss=self.loss, **kwargs
        )

    def _measured(self, layout: Layout) -> tuple[tuple[RankPeak, ...], dict[str, int]]:
        stack = self.stack
        if stack is None or not stack.alike:
            step = self._step(self.module, layout)
            rank = RankPeak("every rank", step.peak_bytes, step.peak, step.phase, at=f"the {step.phase}")
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
        )
        return (rank,), communication

    def _pipelined(self, layout: Layout) -> tuple[tuple[RankPeak, ...], dict[str, int]]:
        if layout.dp_shard > 1 or layout.tp > 1:
            raise LayoutError("FSDP or TP inside pipeline stages is not measured yet")
        inputs, kwargs = self._arguments(layout)
        steps = pipeline_step(self.module, *inputs, layout=layout, optimizer=self.optimizer, **kwargs)
        ranks = tuple(
            RankPeak(
                f"stage {', '.join(map(str, step.stages))}",
                step.peak_bytes,
                step.peak,
                step.phase,
                at=f"the {step.phase}, {max(step.in_flight.values(), default=0)} microbatches in flight",
            )
            for step in steps
        )
        return ranks, {"send_recv": max((step.p2p_total for step in steps), default=0)}


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


def _model_cost(module: nn.Module, inputs: tuple, kwargs: dict, stack: BlockStack | None) -> ModelCost:
    """FLOPs of one micro-batch's forward (a fake forward of the first 3 blocks, composed), parameter
    bytes per block and elsewhere, and the bytes of the tensor passed between blocks."""
    from .dry_run import dry_run

    probe = truncated(module, stack, 3) if stack is not None and stack.alike else module
    run = dry_run(probe, *inputs, **kwargs)
    rows = run.modules.set_index("name")
    if stack is not None and stack.alike:
        first = stack.path(0)
        block_flops = int(rows.loc[first, "flops"])
        forward = run.flops + (stack.count - 3) * block_flops
        block = module.get_submodule(first)
        block_bytes = sum(p.numel() * p.element_size() for p in block.parameters())
        shapes = rows.loc[first, "output_shapes"]
        boundary = (
            int(torch.Size(shapes[0]).numel()) * _dtype_size(rows.loc[first, "output_dtypes"][0]) if shapes else 0
        )
        blocks = stack.count
    else:
        block_flops, forward, block_bytes, boundary, blocks = 0, run.flops, 0, 0, 0
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    return ModelCost(forward, block_flops, blocks, block_bytes, total - block_bytes * blocks, boundary)


def _dtype_size(dtype: Any) -> int:
    name = str(dtype).removeprefix("torch.")
    return getattr(torch, name).itemsize if hasattr(torch, name) else 4


def plan_parallel(
    module: nn.Module,
    *inputs: Any,
    gpus: int,
    gpu_memory: float | str = "80GB",
    optimizer: OptimizerFactory | None = None,
    loss: LossFunction | None = None,
    layouts: Sequence[Layout] | None = None,
    fsdp: Iterable[int] | None = None,
    tp: Iterable[int] = SEARCH_TP,
    pp: Iterable[int] = SEARCH_PP,
    activation_checkpointing: Iterable[ActivationCheckpointing] = SEARCH_AC,
    accumulation_steps: int = 1,
    tp_plan: Mapping[str, str] | None = None,
    hardware: Hardware = DEFAULT_HARDWARE,
    **forward_kwargs: Any,
) -> ParallelPlan:
    """Which layouts of a training step of `module` fit on `gpus` GPUs of `gpu_memory` each.

    `inputs` (and `forward_kwargs`) are one micro-batch on one data-parallel rank, read as
    `train_step` reads them; a layout with another `micro_batch_size` runs them resized along their
    first dimension (tensors and shapes whose first size is the inputs' batch; one tensor passed twice
    stays one). `layouts`: the layouts to evaluate (default: `candidate_layouts` over `fsdp`, `tp`,
    `pp` and `activation_checkpointing`, with `accumulation_steps` micro-batches).
    Each valid layout's rank peak comes from fake steps of the loop users write (note [The loop as
    users write it]) under that layout; repeated blocks that are alike are measured at 3 and 4
    blocks and composed (note [Composing a step from two block counts]). Communication and the
    throughput proxy follow `parallel_cost`'s stated model (`hardware`). A layout the model does not
    allow is kept, with its `problems`. `module` is left unchanged.
    Raises TypeError for a non-module, ValueError for `gpus` < 1 or an unreadable `gpu_memory`.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"plan_parallel expects an nn.Module, got {type(module).__name__}")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ValueError(f"gpus must be a positive int, got {gpus!r}")
    memory = parse_budget(gpu_memory)
    batch = _batch_of(inputs, forward_kwargs)
    if layouts is None:
        layouts = candidate_layouts(
            gpus,
            fsdp=fsdp,
            tp=tp,
            pp=pp,
            activation_checkpointing=activation_checkpointing,
            micro_batch_size=batch,
            accumulation_steps=accumulation_steps,
        )
    facts = model_facts(module, tp_plan)
    measurements = _Measurements(module, inputs, forward_kwargs, batch, tp_plan, optimizer, loss)
    cost_model = _model_cost(module, inputs, forward_kwargs, measurements.stack)
    results = [_evaluate(layout, facts, gpus, batch, measurements, cost_model, hardware) for layout in layouts]
    return ParallelPlan(type(module).__name__, gpus, memory, tuple(results), proxy_note=_PROXY_NOTE)


_PROXY_NOTE = "step proxy: compute at the stated FLOP/s + exposed communication + pipeline bubble (parallel_cost)"


def _evaluate(
    layout: Layout,
    facts: ModelFacts,
    gpus: int,
    batch: int,
    measurements: _Measurements,
    cost_model: ModelCost,
    hardware: Hardware,
) -> LayoutResult:
    problems = layout_problems(layout, facts, gpus)
    if problems:
        return LayoutResult(layout, tuple(problems))
    try:
        ranks, communication = measurements.ranks(layout)
    except (LayoutError, TensorParallelPlanError, PipelineSplitError) as error:
        return LayoutResult(layout, (str(error),))
    scale = layout.micro_batch_size / batch
    cost = step_cost(
        layout,
        replace(
            cost_model,
            forward_flops=round(cost_model.forward_flops * scale),
            block_forward_flops=round(cost_model.block_forward_flops * scale),
            boundary_activation_bytes=round(cost_model.boundary_activation_bytes * scale),
        ),
        hardware,
    )
    return LayoutResult(
        layout,
        ranks=ranks,
        communication={kind: count for kind, count in communication.items() if count},
        compute_flops=cost.compute_flops,
        recompute_flops=cost.recompute_flops,
        exposed_communication_s=cost.exposed_communication_s,
        step_proxy_s=cost.step_proxy_s,
    )
