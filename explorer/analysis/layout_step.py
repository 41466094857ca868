"""`layout_step`: one training step of rank 0 under a parallel layout (FSDP2 × HSDP × TP × AC), on fakes.

The step is `train_step`'s (note [The loop as users write it]) on a fake twin of the module, run as
rank 0 of a fake process group of `layout.gpus` ranks, after the twin is parallelized the way
torchtitan parallelizes a model:

1. tensor parallelism over the mesh's "tp" dim: `parallelize_module` with the plan (`tp_plans`), its
   globs matching every repeated block's modules and the root's own entries (the head, the
   embedding) in one call;
2. activation checkpointing (`checkpoint_blocks`): "block" wraps every repeated block, "selective"
   every other one, the second, fourth... (0-based odd indices), as torchtitan's
   `selective_ac_option="2"` does;
3. FSDP2 over the "dp_shard" dim (HSDP over ("dp_replicate", "dp_shard") when `dp_replicate > 1`):
   `fully_shard` on each repeated block, then on the root, with the layout's mixed precision policy
   (`mixed_precision_policy`).

The mesh always has the three dims ("dp_replicate", "dp_shard", "tp"), outermost first, those of
degree 1 included, so that its dims are found by name whatever the layout. FSDP2 is applied when
the layout has data parallelism (`dp_replicate × dp_shard > 1`; with `dp_shard == 1` that is
HSDP with unsharded groups, DDP's memory by FSDP2's machinery); memory is then measured by
`FastFSDPMemTracker` (FSDP's categories), otherwise by `FastMemTracker`. Collectives are counted by
`comm_count.CollectiveCounter` (note [Collective bytes]). Pipeline stages (`pp > 1`) are not run
here: the planner composes stages from steps of their blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from .._torch_compat.fake import unset_fake_temporarily
from .._torch_compat.memory_tracker import FastFSDPMemTracker, FastMemTracker, FastTracker, MemTracker
from ..record.scope import recording_graph
from .comm_count import CollectiveCounter, Communication
from .cpu_fake_mode import CpuFakeTensorMode
from .dry_run import fake_forward_arguments
from .fake_fsdp import checkpoint_blocks, fake_process_group, lazy_fsdp_chunks, repeated_blocks
from .parallel_layout import Layout, LayoutError
from .tp_plans import apply_tp_plan, tp_plan_of
from .train_step import (
    FSDP_CATEGORIES,
    SINGLE_CATEGORIES,
    LossFunction,
    OptimizerFactory,
    TrainingLoop,
    TrainStep,
    TrainStepError,
    check_loop,
    check_reachable_devices,
    default_loss,
    run_step,
    step_measurements,
)
from .train_twin import fake_twin

__all__ = ["MESH_DIMS", "LayoutStep", "layout_step", "mixed_precision_policy", "parallelize_twin"]

MESH_DIMS = ("dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True, repr=False)
class LayoutStep(TrainStep):
    """`TrainStep`'s measurements of rank 0 under `layout` (`world_size` is `layout.gpus`; the
    categories are FSDP's when data-parallel), with what the layout adds: `tp_plan`, the plan
    applied (empty without TP); `checkpointed`, the blocks activation checkpointing wrapped;
    `communication`, rank 0's collectives in the step by kind (bytes and calls, note
    [Collective bytes])."""

    layout: Layout = field(default_factory=Layout)
    tp_plan: dict[str, str] = field(default_factory=dict)
    checkpointed: list[str] = field(default_factory=list)
    communication: Communication = field(default_factory=Communication)


def layout_step(
    module: nn.Module,
    *inputs_or_shapes: Any,
    layout: Layout,
    tp_plan: Mapping[str, str] | None = None,
    optimizer: OptimizerFactory | None = None,
    loss: LossFunction | None = None,
    keep_outputs: bool = True,
    **forward_kwargs: Any,
) -> LayoutStep:
    """Memory and collectives of one training step of rank 0 of `layout` (with `pp == 1`), on fakes.

    The inputs are *one rank's micro-batch* (read as in `dry_run`: shapes, tensors or keyword
    arguments); every rank of a tensor-parallel group sees the same one. `layout.micro_batch_size`
    is not read: the inputs are the micro-batch. `layout.accumulation_steps` micro-batches run per
    optimizer step, `keep_outputs` as in `train_step`. `tp_plan` (module-path glob → transformers
    style name, see `tp_plans`) is read when `layout.tp > 1`; by default the model's own
    (`tp_plan_of`). `optimizer`, `loss`: as in `train_step`. The module, the global RNG and the
    caller's process groups are left as they were (see `train_step`, `fake_fsdp`).

    Raises LayoutError for `pp > 1` or a tensor-parallel layout without a plan,
    TensorParallelPlanError for a style or key that cannot be applied, TrainStepError when the
    step cannot run on fake tensors (naming the phase and the innermost running module).
    """
    plan = _check(module, layout, tp_plan)
    loop = TrainingLoop(keep_outputs, layout.accumulation_steps)
    check_loop(loop)
    rng_state = torch.get_rng_state()
    mode = CpuFakeTensorMode(allow_non_fake_inputs=True)
    try:
        twin = fake_twin(module, mode).train()
        check_reachable_devices(twin, type(module).__name__)
        first = next(iter(twin.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
        args, kwargs = fake_forward_arguments(module, mode, device, inputs_or_shapes, forward_kwargs)
        shape = (layout.dp_replicate, layout.dp_shard, layout.tp)
        with fake_process_group(layout.gpus, device.type, shape, MESH_DIMS) as mesh:
            blocks, checkpointed = parallelize_twin(twin, mesh, layout, plan)
            with mode, torch.enable_grad():
                tracker, run, counter = _measure(twin, args, kwargs, optimizer, loss, loop)
    finally:
        torch.set_rng_state(rng_state)
    categories = FSDP_CATEGORIES if layout.data_parallel > 1 else SINGLE_CATEGORIES
    return LayoutStep(
        **step_measurements(module, twin, tracker, run, categories),
        world_size=layout.gpus,
        activation_checkpointing=bool(checkpointed),
        device=str(device),
        blocks=blocks,
        keep_outputs=keep_outputs,
        accumulation_steps=layout.accumulation_steps,
        layout=layout,
        tp_plan=dict(plan),
        checkpointed=checkpointed,
        communication=counter.communication,
    )


def _check(module: Any, layout: Layout, tp_plan: Mapping[str, str] | None) -> Mapping[str, str]:
    """The plan to apply ({} without TP), after checking the arguments."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"explorer.layout_step expects an nn.Module, got {type(module).__name__}")
    if not isinstance(layout, Layout):
        raise TypeError(f"layout= must be an explorer Layout, got {type(layout).__name__}")
    if recording_graph() is not None:
        raise TrainStepError(
            "layout_step cannot run inside deferred_init: call it on the module deferred_init returned"
        )
    if layout.pp > 1:
        raise LayoutError(
            f"layout_step measures one pipeline stage's worth of model (pp == 1), got pp={layout.pp}: "
            "the planner composes stages"
        )
    if layout.tp == 1:
        return {}
    plan = tp_plan if tp_plan is not None else tp_plan_of(module)
    if not plan:
        raise LayoutError(f"{type(module).__name__} has no tensor-parallel plan for TP {layout.tp}: pass tp_plan=")
    return plan


def parallelize_twin(
    twin: nn.Module,
    mesh: DeviceMesh,
    layout: Layout,
    plan: Mapping[str, str],
    blocks: list[str] | None = None,
    reshard_after_forward: bool | None = None,
) -> tuple[list[str], list[str]]:
    """TP, then activation checkpointing, then FSDP2 (module docstring) of `twin`, a model or a part
    of one (a pipeline stage); the repeated blocks' paths and those checkpointed. `mesh` has the
    dims of `MESH_DIMS` (and may have more: a "pp" dim), found by name; `plan` is keyed by `twin`'s
    paths; `blocks`: the repeated blocks' paths (default `repeated_blocks(twin)`);
    `reshard_after_forward`: `fully_shard`'s, for the blocks and the root (default: its own, None,
    which reshards all but the root). Outside our fake mode:
    building sub-meshes reads index tensors' values; the parameters are fakes of our mode, so what
    TP and FSDP do to them stays fake."""
    if blocks is None:
        blocks = [path for path, _ in repeated_blocks(twin)]
    with lazy_fsdp_chunks(), unset_fake_temporarily():
        if plan:
            apply_tp_plan(twin, mesh["tp"], plan)
        if layout.activation_checkpointing != "none" and not blocks:
            raise TrainStepError(
                f"activation_checkpointing={layout.activation_checkpointing!r} found no repeated blocks in "
                f"{type(twin).__name__} (entries of an nn.ModuleList/nn.Sequential sharing a class): "
                "nothing to checkpoint"
            )
        checkpointed = _checkpointed(blocks, layout)
        checkpoint_blocks(twin, [(path, twin.get_submodule(path)) for path in checkpointed])
        if layout.data_parallel > 1:
            dp_mesh = mesh["dp_shard"] if layout.dp_replicate == 1 else mesh["dp_replicate", "dp_shard"]
            policy, reshard = mixed_precision_policy(layout), reshard_after_forward
            for path in blocks:
                fully_shard(twin.get_submodule(path), mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
            fully_shard(twin, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
        elif layout.mixed_precision != "none":
            raise LayoutError(
                f"mixed_precision={layout.mixed_precision!r} is FSDP2's MixedPrecisionPolicy: it needs data "
                "parallelism (dp_shard × dp_replicate > 1)"
            )
    return blocks, checkpointed


def mixed_precision_policy(layout: Layout) -> MixedPrecisionPolicy:
    """FSDP2's policy for `layout.mixed_precision` (torchtitan's: bf16 parameters and compute,
    gradients reduced in fp32), or FSDP2's default (no casting) for "none"."""
    if layout.mixed_precision == "bfloat16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def _checkpointed(blocks: list[str], layout: Layout) -> list[str]:
    """The blocks `layout.activation_checkpointing` wraps: none, all, or every other (odd indices)."""
    if layout.activation_checkpointing == "block":
        return list(blocks)
    if layout.activation_checkpointing == "selective":
        return blocks[1::2]
    return []


def _measure(
    twin: nn.Module,
    args: tuple,
    kwargs: dict,
    optimizer: OptimizerFactory | None,
    loss: LossFunction | None,
    loop: TrainingLoop,
) -> tuple[MemTracker, Any, CollectiveCounter]:
    """The loop of the parallelized `twin` under the tracker its sharding asks for, collectives counted."""
    make_optimizer = optimizer or torch.optim.AdamW
    tracker: FastTracker
    if isinstance(twin, FSDPModule):
        tracker = FastFSDPMemTracker(twin, make_optimizer(twin.parameters()))
    else:
        tracker = FastMemTracker()
    counter = CollectiveCounter()
    tracker.op_observer = counter.observe  # the tracker's ops, counted without a mode of its own
    root_class = type(twin).__name__.removeprefix("FSDP")
    run = run_step(twin, args, kwargs, make_optimizer, loss or default_loss, tracker, root_class, loop)
    return tracker, run, counter
