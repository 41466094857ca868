"""What a layout costs in time: communication per step by collective, and a throughput proxy.

Memory is measured (a fake step, `plan_parallel`); time is not, and cannot be on fakes. So the
proxy is a stated model, not a measurement, with every constant a parameter (`Hardware`):

    step_proxy_s = compute_s + exposed_communication_s + bubble_s
    compute_s    = (3 × forward FLOPs + recompute FLOPs) per rank / gpu_flops
    exposed      = TP all-reduces (on the critical path, all of them)
                 + FSDP's all-gathers and reduce-scatters beyond what compute hides (one block's
                   worth is never hidden: the first all-gather and the last reduce-scatter)
                 + pipeline sends and receives
    bubble_s     = compute_s × (stages − 1) / microbatches   (1F1B and GPipe; interleaved: / v)

Communication is counted as the bytes each rank receives in a step, by collective, with ring
algorithms: an all-gather or reduce-scatter of B bytes over n ranks moves B × (n − 1) / n; an
all-reduce twice that. FSDP2 all-gathers each block's parameters in forward and again in backward
(`reshard_after_forward=True`, the root's once), and reduce-scatters its gradients, per micro-batch;
HSDP all-reduces the gradient shards across replicas once per step. Megatron-style TP all-reduces
two activations per block in forward and two in backward. A link is NVLink-class
(`intra_node_bandwidth`) while the ranks of a collective fit on one node, otherwise the network's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .parallel_layout import Layout

__all__ = ["Hardware", "ModelCost", "StepCost", "step_cost"]


@dataclass(frozen=True)
class Hardware:
    """The constants the proxy assumes. Defaults: an H100 SXM node (989 TFLOP/s dense bf16 at 40%
    model FLOPs utilisation, NVLink 450 GB/s per direction, 8 GPUs per node, 50 GB/s of network per
    GPU)."""

    gpu_flops: float = 989e12 * 0.4
    intra_node_bandwidth: float = 450e9
    inter_node_bandwidth: float = 50e9
    gpus_per_node: int = 8


@dataclass(frozen=True)
class ModelCost:
    """The model quantities the proxy needs, for one micro-batch on one data-parallel rank.

    `forward_flops`: the whole forward's FLOPs; `block_forward_flops`: one repeated block's;
    `blocks`: how many; `block_parameter_bytes` / `other_parameter_bytes`: one block's parameters
    and everything else's; `gradient_bytes_per_parameter_byte`: gradients' size relative to the
    parameters' (1 for the same dtype); `boundary_activation_bytes`: the tensor passed between
    blocks (what a pipeline stage sends, what TP all-reduces)."""

    forward_flops: int
    block_forward_flops: int
    blocks: int
    block_parameter_bytes: int
    other_parameter_bytes: int
    boundary_activation_bytes: int
    gradient_bytes_per_parameter_byte: float = 1.0


@dataclass(frozen=True)
class StepCost:
    communication: dict[str, int]
    compute_flops: int
    recompute_flops: int
    exposed_communication_s: float
    step_proxy_s: float


def _ring(size: int, ranks: int) -> float:
    return size * (ranks - 1) / ranks if ranks > 1 else 0.0


def _bandwidth(span: int, hardware: Hardware) -> float:
    """A collective over ranks `span` apart in the mesh (its ranks × the inner dimensions)."""
    return hardware.intra_node_bandwidth if span <= hardware.gpus_per_node else hardware.inter_node_bandwidth


def _recompute_flops(layout: Layout, model: ModelCost, blocks_per_rank: int) -> int:
    if layout.activation_checkpointing == "block":
        return model.block_forward_flops * blocks_per_rank
    if layout.activation_checkpointing == "selective":
        return model.block_forward_flops * (blocks_per_rank // 2)
    return 0


def step_cost(layout: Layout, model: ModelCost, hardware: Hardware | None = None) -> StepCost:
    """Communication by collective and the throughput proxy of one optimizer step under `layout`
    (module docstring); `hardware` defaults to `Hardware()`."""
    hardware = hardware or Hardware()
    micro = layout.accumulation_steps
    stages = layout.pp * layout.stages_per_rank
    blocks_per_rank = model.blocks // layout.pp
    rank_parameters = (model.block_parameter_bytes * blocks_per_rank + model.other_parameter_bytes / layout.pp) / (
        layout.tp
    )
    rank_block_parameters = model.block_parameter_bytes * blocks_per_rank / layout.tp
    root_parameters = rank_parameters - rank_block_parameters
    gradients = rank_parameters * model.gradient_bytes_per_parameter_byte
    communication = {
        "all_gather": round(micro * _ring(round(2 * rank_block_parameters + root_parameters), layout.dp_shard)),
        "reduce_scatter": round(micro * _ring(round(gradients), layout.dp_shard)),
        "all_reduce": round(
            2 * _ring(round(gradients / layout.dp_shard), layout.dp_replicate)
            + micro * blocks_per_rank * 4 * 2 * _ring(model.boundary_activation_bytes, layout.tp)
        ),
        "send_recv": round(micro * 2 * model.boundary_activation_bytes * (stages - 1) / layout.pp)
        if layout.pp > 1
        else 0,
    }
    forward = model.forward_flops * micro / (layout.tp * layout.pp)
    recompute = _recompute_flops(layout, model, blocks_per_rank) * micro // layout.tp
    compute_s = (3 * forward + recompute) / hardware.gpu_flops
    tp_s = (micro * blocks_per_rank * 8 * _ring(model.boundary_activation_bytes, layout.tp)) / _bandwidth(
        layout.tp, hardware
    )
    fsdp_bytes = communication["all_gather"] + communication["reduce_scatter"]
    fsdp_s = fsdp_bytes / _bandwidth(layout.tp * layout.dp_shard, hardware)
    one_block_s = fsdp_s / max(1, 2 * micro * blocks_per_rank)
    hsdp_s = 2 * _ring(round(gradients / layout.dp_shard), layout.dp_replicate) / _bandwidth(layout.gpus, hardware)
    p2p_s = communication["send_recv"] / _bandwidth(layout.gpus, hardware)
    exposed = tp_s + max(0.0, fsdp_s - compute_s) + (one_block_s if layout.dp_shard > 1 else 0.0) + hsdp_s + p2p_s
    bubble_s = compute_s * (layout.pp - 1) / (micro * layout.stages_per_rank) if layout.pp > 1 else 0.0
    return StepCost(
        communication={key: value for key, value in communication.items() if value},
        compute_flops=round(3 * forward + recompute),
        recompute_flops=round(recompute),
        exposed_communication_s=exposed,
        step_proxy_s=compute_s + exposed + bubble_s,
    )
