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

from .block_composition import BlockStack, block_stack, truncated
from .fake_fsdp import repeated_blocks
from .fake_groups import fake_groups_held
from .parallel_cost import Hardware, ModelCost, step_cost
from .parallel_layout import ActivationCheckpointing, Layout, LayoutError, MixedPrecision, ModelFacts, layout_problems
from .parallel_measure import Measurements, RankPeak, Refused, measure_in_workers
from .tp_plans import tp_plan_of
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
    mixed_precision: MixedPrecision = "none",
) -> list[Layout]:
    """Every layout of `gpus` ranks with FSDP degree in `fsdp` (default: the powers of two up to
    `gpus`), TP in `tp` and PP in `pp` whose product divides `gpus` (the rest are HSDP replicas),
    each with every checkpointing mode in `activation_checkpointing`. Pipelined layouts run at
    least `pp` microbatches (`accumulation_steps` raised to it). Every layout trains with
    `mixed_precision`."""
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
                            mixed_precision=mixed_precision,
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
    mixed_precision: MixedPrecision = "none",
    tp_plan: Mapping[str, str] | None = None,
    hardware: Hardware = DEFAULT_HARDWARE,
    keep_outputs: bool = True,
    workers: int = 1,
    **forward_kwargs: Any,
) -> ParallelPlan:
    """Which layouts of a training step of `module` fit on `gpus` GPUs of `gpu_memory` each.

    `inputs` (and `forward_kwargs`) are one micro-batch on one data-parallel rank, read as
    `train_step` reads them; a layout with another `micro_batch_size` runs them resized along their
    first dimension (tensors and shapes whose first size is the inputs' batch; one tensor passed twice
    stays one). `layouts`: the layouts to evaluate (default: `candidate_layouts` over `fsdp`, `tp`,
    `pp` and `activation_checkpointing`, with `accumulation_steps` micro-batches, each with
    `mixed_precision`: "none", or "bfloat16" for FSDP2's bf16 policy, see `Layout`).
    Each valid layout's rank peak comes from fake steps of the loop users write (note [The loop as
    users write it]) under that layout; repeated blocks that are alike are measured at 3 and 4
    blocks and composed (note [Composing a step from two block counts]). Communication and the
    throughput proxy follow `parallel_cost`'s stated model (`hardware`). A layout the model does not
    allow is kept, with its `problems`. `keep_outputs=False` measures the loop that drops the output
    and the loss right after backward. `workers > 1` measures distinct configurations in that many
    forked processes (fakes only; the module is inherited). `module` is left unchanged.
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
            mixed_precision=mixed_precision,
        )
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    facts = model_facts(module, tp_plan)
    measurements = Measurements(module, inputs, forward_kwargs, batch, tp_plan, optimizer, loss, keep_outputs)
    if workers > 1:
        measure_in_workers(
            measurements, [layout for layout in layouts if not layout_problems(layout, facts, gpus)], workers
        )
    cost_model = _model_cost(module, inputs, forward_kwargs, measurements.stack)
    with fake_groups_held():  # the steps measured here share fake groups (note [Fake groups held across steps])
        results = [_evaluate(layout, facts, gpus, batch, measurements, cost_model, hardware) for layout in layouts]
    return ParallelPlan(type(module).__name__, gpus, memory, tuple(results), proxy_note=_PROXY_NOTE)


_PROXY_NOTE = "step proxy: compute at the stated FLOP/s + exposed communication + pipeline bubble (parallel_cost)"


def _evaluate(
    layout: Layout,
    facts: ModelFacts,
    gpus: int,
    batch: int,
    measurements: Measurements,
    cost_model: ModelCost,
    hardware: Hardware,
) -> LayoutResult:
    problems = layout_problems(layout, facts, gpus)
    if problems:
        return LayoutResult(layout, tuple(problems))
    measured = measurements.ranks(layout)
    if isinstance(measured, Refused):
        return LayoutResult(layout, (measured.reason,))
    ranks, communication = measured
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
