"""One rank of the ground-truth runs of tests/explorer/analysis/test_layout_step.py (not collected).

Each rank of a gloo group on 127.0.0.1 parallelizes the eager tiny Llama for a scenario's layout by
hand, as torchtitan would (DTensor TP plan written out here, `checkpoint_wrapper`, `fully_shard` per
decoder layer then the root), and runs the loop users write under PyTorch's own tracker
(`MemTracker`, or `FSDPMemTracker` with FSDP):

    out = model(**inputs); out.loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

with `out` alive until after `zero_grad`. Rank 0 then measures the same step on fakes twice: the
deferred model's twin parallelized by `layout_step.parallelize_twin` on a fake process group, under
the same tracker and the same code as eager (boundary snapshots to compare), and `layout_step`
itself. Every rank writes `<scenario>-rank<r>.json`.
"""

from __future__ import annotations

import datetime
import json
import os
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from explorer import deferred_init
from explorer.analysis.fake_fsdp import fake_process_group
from explorer.analysis.layout_step import MESH_DIMS, layout_step, parallelize_twin
from explorer.analysis.parallel_layout import Layout
from explorer.analysis.train_twin import fake_twin
from tests.support.gloo_threads import GlooThreadsCatchUp
from tests.support.hf_configs import HF_BY_NAME, build_eager

LLAMA = HF_BY_NAME["llama"]

# torchtitan's Llama plan, without sequence parallelism: what HF's plan means (tp_plans' docstring)
EAGER_TP_PLAN = {
    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
    "lm_head": ColwiseParallel(output_layouts=Replicate()),
    **{f"model.layers.*.self_attn.{name}": ColwiseParallel() for name in ("q_proj", "k_proj", "v_proj")},
    "model.layers.*.self_attn.o_proj": RowwiseParallel(),
    **{f"model.layers.*.mlp.{name}": ColwiseParallel() for name in ("gate_proj", "up_proj")},
    "model.layers.*.mlp.down_proj": RowwiseParallel(),
}

# Hugging Face's Llama plan as transformers 5.24 composes it on the model (5.20 leaves the embedding
# out): given to layout_step explicitly, so what is compared does not depend on the transformers
# installed (tests/explorer/analysis/test_layout_step.py checks tp_plan_of against transformers').
HF_TP_PLAN = {
    "model.embed_tokens": "embedding_rowwise",
    "lm_head": "colwise_gather_output",
    **{f"model.layers.*.self_attn.{name}": "colwise" for name in ("q_proj", "k_proj", "v_proj")},
    "model.layers.*.self_attn.o_proj": "rowwise",
    **{f"model.layers.*.mlp.{name}": "colwise" for name in ("gate_proj", "up_proj")},
    "model.layers.*.mlp.down_proj": "rowwise",
}

SCENARIOS: dict[int, dict[str, Layout]] = {
    2: {
        "tp2": Layout(tp=2),
        "fsdp2-ac-block": Layout(dp_shard=2, activation_checkpointing="block"),
        "fsdp2-bf16": Layout(dp_shard=2, mixed_precision="bfloat16"),
    },
    4: {"fsdp2-tp2": Layout(dp_shard=2, tp=2), "hsdp2x2": Layout(dp_replicate=2, dp_shard=2)},
}


def inputs() -> dict[str, torch.Tensor]:
    ids = LLAMA.inputs()["input_ids"]
    return {"input_ids": ids, "labels": ids}


def named(snapshot: dict) -> dict[str, int]:
    """A tracker snapshot of one device as PyTorch's category names → bytes."""
    (device_snap,) = snapshot.values() or [{}]
    return {getattr(key, "value", key): value for key, value in device_snap.items()}


def parallelize_by_hand(model: torch.nn.Module, mesh: DeviceMesh, layout: Layout) -> None:
    """TP, then activation checkpointing of every decoder layer, then FSDP2 (HSDP with replicas) per
    layer and root, with the layout's mixed precision policy."""
    if layout.tp > 1:
        parallelize_module(model, mesh["tp"], EAGER_TP_PLAN)
    layers = model.model.layers
    if layout.activation_checkpointing == "block":
        for index, layer in enumerate(layers):
            layers[index] = checkpoint_wrapper(layer)
    if layout.dp_shard > 1:
        dp_mesh = mesh["dp_shard"] if layout.dp_replicate == 1 else mesh["dp_replicate", "dp_shard"]
        policy = MixedPrecisionPolicy()  # FSDP2's default: no casting
        if layout.mixed_precision == "bfloat16":  # torchtitan's mixed_precision_param = "bfloat16"
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in layers:
            fully_shard(layer, mesh=dp_mesh, mp_policy=policy)
        fully_shard(model, mesh=dp_mesh, mp_policy=policy)


def measured_step(model: torch.nn.Module, batch: dict) -> dict[str, Any]:
    """The loop under PyTorch's tracker: peaks at the end of each phase, the snapshot at the end of
    forward, every boundary snapshot per module, the reduce-scatter input of each sharded module."""
    optimizer = torch.optim.AdamW(model.parameters())
    tracker: MemTracker
    if isinstance(model, FSDPModule):
        tracker = FSDPMemTracker(model, optimizer)
        tracker.track_inputs(((), batch))
    else:
        tracker = MemTracker()
        tracker.track_external(model, optimizer, *batch.values())
    with tracker, GlooThreadsCatchUp():
        out = model(**batch)
        loss = out.loss
        forward_peak = named(tracker.get_tracker_snapshot("peak"))
        end_of_forward = named(tracker.get_tracker_snapshot("current"))
        loss.backward()
        backward_peak = named(tracker.get_tracker_snapshot("peak"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del out, loss
    return {
        "forward_peak": forward_peak,
        "end_of_forward": end_of_forward,
        "backward_peak": backward_peak,
        "step_peak": named(tracker.get_tracker_snapshot("peak")),
        "boundaries": boundaries(model, tracker),
        "reduce_scatter_bytes": reduce_scatter_bytes(model),
    }


def boundaries(model: torch.nn.Module, tracker: MemTracker) -> dict[str, dict[str, list[dict[str, int]]]]:
    return {
        path: {
            state.value: [named(s) for s in snaps]
            for state, snaps in tracker.memory_tracking[module].snapshots.items()
            if "Peak" not in state.value
        }
        for path, module in model.named_modules()
        if module in tracker.memory_tracking
    }


def reduce_scatter_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Per sharded module, the bytes of its reduce-scatter input: its parameters padded and unsharded."""
    sizes = {}
    for path, module in model.named_modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            ranks = group.mesh_info.shard_mesh_size if group is not None else 0
            sizes[path] = sum(
                param.padded_sharded_param_size.numel() * ranks * param.sharded_param.element_size()
                for param in (group.fsdp_params if group is not None else [])
            )
    return sizes


def fake_measured_step(layout: Layout) -> dict[str, Any]:
    """`measured_step` of the deferred model's twin, parallelized by layout_step's own code."""
    from explorer._torch_compat.fake import FakeTensorMode

    torch.manual_seed(0)
    module = deferred_init(LLAMA.cls, LLAMA.config())
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    twin = fake_twin(module, mode).train()
    batch = {name: mode.from_tensor(value) for name, value in inputs().items()}
    plan = HF_TP_PLAN if layout.tp > 1 else {}
    shape = (layout.dp_replicate, layout.dp_shard, layout.tp)
    with fake_process_group(layout.gpus, "cpu", shape, MESH_DIMS) as mesh:
        parallelize_twin(twin, mesh, layout, plan or {})
        with mode:
            return measured_step(twin, {"input_ids": batch["input_ids"], "labels": batch["labels"]})


def layout_step_numbers(layout: Layout) -> dict[str, Any]:
    torch.manual_seed(0)
    plan = HF_TP_PLAN if layout.tp > 1 else None
    step = layout_step(deferred_init(LLAMA.cls, LLAMA.config()), **inputs(), layout=layout, tp_plan=plan)
    return {
        "peak_bytes": step.peak_bytes,
        "peak": step.peak,
        "phase_peaks": step.phase_peaks,
        "end_of_forward": step.end_of_forward,
        "end_of_forward_bytes": step.end_of_forward_bytes,
        "communication": step.communication.bytes,
        "calls": step.communication.calls,
    }


def tracker_counts_dtensor_meta_fakes(world: int) -> int:
    """The bytes PyTorch's MemTracker counts, in eager, beyond the real allocations of one DTensor op
    (`sqrt` of a 64 × 32 float tensor sharded by rows): DTensor runs each op on global-shape fakes
    for its output metadata, and some releases' trackers count those (8,192 bytes here), others not
    (0). A collective: every rank calls it."""
    sharded = distribute_tensor(torch.ones(64, 32), init_device_mesh("cpu", (world,)), [Shard(0)])
    local_bytes = sharded.to_local().numel() * 4
    tracker = MemTracker()
    tracker.track_external(sharded)
    with tracker:
        root = sharded.sqrt()
    peak = named(tracker.get_tracker_snapshot("peak"))["Total"]
    del root
    return peak - 2 * local_bytes


def run_rank(rank: int, world: int, port: int, out: Path) -> None:
    """Rank `rank` of `world`: every scenario of SCENARIOS[world], one JSON file each."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        probe = tracker_counts_dtensor_meta_fakes(world)
        for name, layout in SCENARIOS[world].items():
            result: dict[str, Any] = {"tracker_counts_dtensor_meta_fakes": probe}
            try:
                mesh = init_device_mesh(
                    "cpu", (layout.dp_replicate, layout.dp_shard, layout.tp), mesh_dim_names=MESH_DIMS
                )
                model = build_eager(LLAMA).train()
                parallelize_by_hand(model, mesh, layout)
                result["eager"] = measured_step(model, inputs())
                if rank == 0:
                    result["fake"] = fake_measured_step(layout)
                    result["layout_step"] = layout_step_numbers(layout)
            except BaseException:
                result["error"] = traceback.format_exc()
            (out / f"{name}-rank{rank}.json").write_text(json.dumps(result))
            dist.barrier()
    finally:
        dist.destroy_process_group()
