"""A parallel layout: how one training step is split over GPUs, and whether a model allows it.

A `Layout` names the degrees of each dimension (data-parallel replicas and shards, tensor
parallelism, pipeline stages), the activation checkpointing mode and the batch shape per rank. It
says nothing of a model; `layout_problems` checks one against a model's facts (`ModelFacts`) and
says, in words, why a layout cannot run: heads not divisible by the TP degree, layers not divisible
by the stages, a model without a tensor-parallel plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ActivationCheckpointing",
    "Layout",
    "LayoutError",
    "MixedPrecision",
    "ModelFacts",
    "PipelineSchedule",
    "layout_problems",
]

ActivationCheckpointing = Literal["none", "block", "selective"]
PipelineSchedule = Literal["1F1B", "Interleaved1F1B", "GPipe"]
MixedPrecision = Literal["none", "bfloat16"]
ACTIVATION_CHECKPOINTING: tuple[ActivationCheckpointing, ...] = ("none", "block", "selective")
PIPELINE_SCHEDULES: tuple[PipelineSchedule, ...] = ("1F1B", "Interleaved1F1B", "GPipe")
MIXED_PRECISION: tuple[MixedPrecision, ...] = ("none", "bfloat16")


class LayoutError(ValueError):
    """A layout that cannot run on a model, or that is not a layout (names the degree at fault)."""


@dataclass(frozen=True)
class Layout:
    """One way to split a training step over `gpus` ranks.

    `dp_shard`: FSDP2's shard degree (parameters, gradients and optimizer state split over it);
    `dp_replicate`: replicas of that sharded group (HSDP when both exceed 1, plain DDP-style
    replication when `dp_shard == 1`); `tp`: tensor-parallel degree (DTensor `parallelize_module`
    with the model's plan); `pp`: pipeline stages, run with `pp_schedule`, `stages_per_rank` of them
    per rank for the interleaved schedule; `activation_checkpointing`: "none", "block" (each repeated
    block recomputed in backward) or "selective" (every other block, as torchtitan's
    `selective_ac_option="2"`); `micro_batch_size`: sequences per forward on each data-parallel rank;
    `accumulation_steps`: micro-batches per optimizer step (with pipelining, the schedule's
    microbatches); `mixed_precision`: "none" (parameters, activations and gradients in the
    model's dtype) or "bfloat16" (FSDP2's `MixedPrecisionPolicy(param_dtype=torch.bfloat16,
    reduce_dtype=torch.float32)`, torchtitan's `mixed_precision_param = "bfloat16"`: sharded
    parameters and optimizer state stay in the model's dtype, the unsharded parameters, the compute
    and the activations are bf16, gradients are reduced in fp32; it needs data parallelism, which
    carries the policy). Mesh order, outermost first: pp, dp_replicate, dp_shard, tp (torchtitan's).
    """

    dp_shard: int = 1
    dp_replicate: int = 1
    tp: int = 1
    pp: int = 1
    pp_schedule: PipelineSchedule = "1F1B"
    stages_per_rank: int = 1
    activation_checkpointing: ActivationCheckpointing = "none"
    micro_batch_size: int = 1
    accumulation_steps: int = 1
    mixed_precision: MixedPrecision = "none"

    def __post_init__(self) -> None:
        degrees = ("dp_shard", "dp_replicate", "tp", "pp", "stages_per_rank", "micro_batch_size", "accumulation_steps")
        for name in degrees:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LayoutError(f"Layout.{name} must be a positive int, got {value!r}")
        if self.activation_checkpointing not in ACTIVATION_CHECKPOINTING:
            raise LayoutError(
                f"Layout.activation_checkpointing must be one of {ACTIVATION_CHECKPOINTING}, "
                f"got {self.activation_checkpointing!r}"
            )
        if self.mixed_precision not in MIXED_PRECISION:
            raise LayoutError(f"Layout.mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}")
        if self.pp_schedule not in PIPELINE_SCHEDULES:
            raise LayoutError(f"Layout.pp_schedule must be one of {PIPELINE_SCHEDULES}, got {self.pp_schedule!r}")
        if self.stages_per_rank > 1 and self.pp_schedule != "Interleaved1F1B":
            raise LayoutError(
                f"Layout.stages_per_rank={self.stages_per_rank} needs pp_schedule='Interleaved1F1B', "
                f"got {self.pp_schedule!r}"
            )

    @property
    def gpus(self) -> int:
        """Ranks the layout occupies: pp × dp_replicate × dp_shard × tp."""
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def data_parallel(self) -> int:
        """Ranks that see different data: dp_replicate × dp_shard."""
        return self.dp_replicate * self.dp_shard

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step over the whole job."""
        return self.micro_batch_size * self.accumulation_steps * self.data_parallel

    def label(self) -> str:
        """A short name: 'FSDP 16 · TP 4 · PP 2 (1F1B) · AC block · mb 1 × 8'."""
        parts = []
        if self.dp_replicate > 1:
            parts.append(f"DP {self.dp_replicate}")
        parts.append(f"FSDP {self.dp_shard}")
        parts.append(f"TP {self.tp}")
        schedule = f" ({self.pp_schedule}{f' × {self.stages_per_rank}' if self.stages_per_rank > 1 else ''})"
        parts.append(f"PP {self.pp}{schedule if self.pp > 1 else ''}")
        parts.append(f"AC {self.activation_checkpointing}")
        parts.append(f"mb {self.micro_batch_size} × {self.accumulation_steps}")
        if self.mixed_precision != "none":
            parts.append("bf16")
        return " · ".join(parts)


@dataclass(frozen=True)
class ModelFacts:
    """What validity depends on: `blocks` (repeated blocks, the unit of pipelining and
    checkpointing), attention heads and key-value heads (None when unknown), and whether a
    tensor-parallel plan is known for the model."""

    blocks: int
    heads: int | None = None
    kv_heads: int | None = None
    has_tp_plan: bool = False
    root_class: str = "model"


def layout_problems(layout: Layout, facts: ModelFacts, gpus: int | None = None) -> list[str]:
    """Why `layout` cannot run on a model with `facts` (on `gpus` ranks, when given), one reason per
    line in words; empty when it can."""
    problems = []
    if gpus is not None and layout.gpus != gpus:
        problems.append(f"uses {layout.gpus} GPUs, not {gpus}")
    if layout.tp > 1:
        if not facts.has_tp_plan:
            problems.append(f"{facts.root_class} has no tensor-parallel plan (pass tp_plan=)")
        for what, count in (("attention heads", facts.heads), ("key-value heads", facts.kv_heads)):
            if count is not None and count % layout.tp:
                problems.append(f"{count} {what} are not divisible by TP {layout.tp}")
    if layout.pp > 1:
        stages = layout.pp * layout.stages_per_rank
        if facts.blocks % stages:
            problems.append(f"{facts.blocks} blocks are not divisible into {stages} pipeline stages")
        if layout.accumulation_steps < layout.pp:
            problems.append(
                f"{layout.accumulation_steps} microbatches cannot keep {layout.pp} pipeline stages busy "
                f"({layout.pp_schedule} needs at least {layout.pp})"
            )
    if layout.activation_checkpointing != "none" and not facts.blocks:
        problems.append(f"{facts.root_class} has no repeated blocks to checkpoint")
    if layout.mixed_precision != "none" and layout.data_parallel == 1:
        problems.append(
            f"mixed precision {layout.mixed_precision} is FSDP2's MixedPrecisionPolicy, and the layout has no data "
            "parallelism to carry it"
        )
    return problems
