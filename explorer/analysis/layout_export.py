"""A `Layout` written out for the tools that run it: a torchtitan config, or Python that applies it.

`to_torchtitan` gives the `[parallelism]`, `[activation_checkpoint]` and `[training]` sections of a
torchtitan TOML job config. `to_python` gives the source of a module defining `build_mesh` and
`apply_layout(model, world_mesh)`, which apply the layout with PyTorch's own parallelisms:
`parallelize_module` (tensor parallelism), `checkpoint_wrapper` (activation checkpointing) and
`fully_shard` (FSDP2, HSDP when replicated), in torchtitan's order (TP, then AC, then FSDP). The
source is plain text the user can read, edit and keep; nothing here imports torch.distributed.

Limitations: pipeline parallelism is an outline in the generated source (which blocks each stage
holds, the `PipelineStage`s and the schedule); cutting a model into stages is model-specific (its
forward must skip the blocks, embedding and head a stage lacks), so that part is not runnable as
is. Note: the torchtitan names are those of the last TOML-configured torchtitan (commit
238fa9953e4a, 2026-02-15, `torchtitan/config/job_config.py`); torchtitan 9810191 (#2386) replaced
TOML with Python `Trainer.Config` dataclasses, which keep the `[parallelism]` degree names but
count the batch in tokens. Re-check both on upgrades.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .parallel_layout import Layout, LayoutError

__all__ = ["TP_STYLES", "mesh_dims", "to_python", "to_torchtitan"]

# HF `tp_plan` style → the DTensor `ParallelStyle` that implements it, as source text. The one
# home of this mapping for generated code (transformers' `ParallelInterface` keeps its own).
TP_STYLES: dict[str, str] = {
    "colwise": "ColwiseParallel()",
    "rowwise": "RowwiseParallel()",
    "colwise_rep": "ColwiseParallel(output_layouts=Replicate())",
    "rowwise_rep": "RowwiseParallel(input_layouts=Replicate())",
    "colwise_gather_output": "ColwiseParallel(output_layouts=Replicate())",  # HF's name for lm_head's
}

_AC_MODES = {"none": "none", "block": "full", "selective": "selective"}  # Layout's → torchtitan's
_SCHEDULE_CLASSES = {"1F1B": "Schedule1F1B", "Interleaved1F1B": "ScheduleInterleaved1F1B", "GPipe": "ScheduleGPipe"}


def mesh_dims(layout: Layout) -> tuple[tuple[str, int], ...]:
    """The device mesh's (name, size) pairs, outermost first, in torchtitan's order (pp,
    dp_replicate, dp_shard, tp). A dimension of size 1 is left out, except `dp_shard` beside
    `dp_replicate` (HSDP's 2-D mesh) and `dp_shard` alone on a single rank (a mesh needs one)."""
    dims = [("pp", layout.pp), ("dp_replicate", layout.dp_replicate), ("dp_shard", layout.dp_shard), ("tp", layout.tp)]
    kept = [(name, size) for name, size in dims if size > 1 or (name == "dp_shard" and layout.dp_replicate > 1)]
    return tuple(kept) or (("dp_shard", 1),)


# -- torchtitan ----------------------------------------------------------------------------------
def to_torchtitan(layout: Layout, *, layers: int | None = None) -> str:
    """The layout as torchtitan TOML: `[parallelism]`, `[activation_checkpoint]`, `[training]`.

    "block" checkpointing is torchtitan's `mode = "full"`, "selective" its `mode = "selective"`
    with `selective_ac_option = "2"` (every other block). `local_batch_size` is the batch each
    data-parallel rank takes per optimizer step through the model: `micro_batch_size`, or with
    pipelining all the schedule's microbatches (`pipeline_parallel_microbatch_size` each);
    `global_batch_size` is `layout.global_batch`, from which torchtitan derives the accumulation.
    With pipelining, stages are split evenly (first/last stage get no fewer blocks); `layers`, the
    model's block count, sets `pipeline_parallel_layers_per_stage`, and is needed when
    `stages_per_rank` is not torchtitan's default (1, or 2 for Interleaved1F1B).
    Raises `LayoutError` naming the degree torchtitan cannot take.
    """
    parallelism: dict[str, int | str] = {
        "data_parallel_replicate_degree": layout.dp_replicate,
        "data_parallel_shard_degree": layout.dp_shard,
        "tensor_parallel_degree": layout.tp,
        "pipeline_parallel_degree": layout.pp,
    }
    if layout.pp > 1:
        parallelism.update(_torchtitan_pipeline(layout, layers))
    local_batch = layout.micro_batch_size * (layout.accumulation_steps if layout.pp > 1 else 1)
    checkpoint: dict[str, int | str] = {"mode": _AC_MODES[layout.activation_checkpointing]}
    if layout.activation_checkpointing == "selective":
        checkpoint["selective_ac_option"] = "2"
    sections: dict[str, Mapping[str, int | str]] = {
        "parallelism": parallelism,
        "activation_checkpoint": checkpoint,
        "training": {
            "local_batch_size": local_batch,
            "global_batch_size": layout.global_batch,
            # torchtitan's default is bfloat16: "none" is said, as float32 (its other choice)
            "mixed_precision_param": "bfloat16" if layout.mixed_precision == "bfloat16" else "float32",
            "mixed_precision_reduce": "float32",
        },
    }
    return f"# {layout.label()}\n" + "\n".join(_toml_section(name, values) for name, values in sections.items())


def _torchtitan_pipeline(layout: Layout, layers: int | None) -> dict[str, int | str]:
    default_stages = 2 if layout.pp_schedule == "Interleaved1F1B" else 1
    if layout.pp_schedule == "Interleaved1F1B" and layout.stages_per_rank < 2:
        raise LayoutError(
            f"Layout.stages_per_rank={layout.stages_per_rank}: torchtitan's Interleaved1F1B needs at least 2 "
            "stages per rank (use '1F1B' for one)"
        )
    keys: dict[str, int | str] = {
        "pipeline_parallel_schedule": layout.pp_schedule,
        "pipeline_parallel_microbatch_size": layout.micro_batch_size,
        "pipeline_parallel_first_stage_less_layers": 0,  # even stages, as Layout counts them
        "pipeline_parallel_last_stage_less_layers": 0,
    }
    stages = layout.pp * layout.stages_per_rank
    if layers is not None:
        if layers % stages:
            raise LayoutError(f"layers={layers} are not divisible into {stages} pipeline stages")
        keys["pipeline_parallel_layers_per_stage"] = layers // stages
    elif layout.stages_per_rank != default_stages:
        raise LayoutError(
            f"Layout.stages_per_rank={layout.stages_per_rank} differs from torchtitan's default of "
            f"{default_stages} for {layout.pp_schedule}: pass layers= (the model's block count)"
        )
    return keys


def _toml_section(name: str, values: Mapping[str, int | str]) -> str:
    lines = [f"[{name}]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: int | str) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


# -- Python ----------------------------------------------------------------------------------------
def split_tp_plan(tp_plan: Mapping[str, str], blocks_path: str) -> tuple[dict[str, str], dict[str, str]]:
    """(per-block plan, root plan): keys `<blocks_path>.*.<rest>` become `<rest>` in the plan applied
    to every block; any other key (a single block's, `lm_head`...) stays a root key, which
    `parallelize_module` matches with `*` wildcards itself. Raises `LayoutError` on an unknown style."""
    block_plan, root_plan = {}, {}
    prefix = f"{blocks_path}.*." if blocks_path else "*."
    for key, style in tp_plan.items():
        if style not in TP_STYLES:
            raise LayoutError(f"tp_plan[{key!r}] = {style!r} is not a known style; known: {sorted(TP_STYLES)}")
        if key.startswith(prefix):
            block_plan[key[len(prefix) :]] = style
        else:
            root_plan[key] = style
    return block_plan, root_plan


def to_python(layout: Layout, *, blocks: str = "model.model.layers", tp_plan: Mapping[str, str] | None = None) -> str:
    """Source of a module that applies `layout`: `build_mesh(device_type="cuda")` and
    `apply_layout(model, world_mesh)`, plus, when `layout.pp > 1`, an outline of the split.

    `blocks` names the repeated blocks as an expression on `model` (the root passed to
    `apply_layout`). `tp_plan` maps module paths, relative to the root and with `*` for any block
    index, to HF style strings (`TP_STYLES`), as transformers' `base_model_tp_plan` does (e.g.
    `{"model.layers.*.self_attn.q_proj": "colwise"}` for a `LlamaForCausalLM`); it is read only
    when `layout.tp > 1`. `apply_layout` works on a regular or a meta-device model (so it can be
    `fully_shard_deferred`'s `shard=`), and returns it. Raises `LayoutError` when `blocks` does not
    start at `model.`, when `tp > 1` has no plan, or when a style is unknown.
    """
    if not re.fullmatch(r"model(\.\w+)+", blocks):
        raise LayoutError(f"blocks={blocks!r} must name the blocks on the root, as 'model.<path>'")
    if layout.tp > 1 and not tp_plan:
        raise LayoutError(f"Layout.tp={layout.tp} needs tp_plan= (module path → 'colwise'/'rowwise'/...)")
    blocks_path = blocks.removeprefix("model.")
    block_plan, root_plan = split_tp_plan(tp_plan or {}, blocks_path) if layout.tp > 1 else ({}, {})
    parts = [
        _header(layout),
        _constants(layout, block_plan, root_plan),
        _build_mesh_source(),
        _apply_source(layout, blocks_path, bool(block_plan), bool(root_plan)),
    ]
    if layout.pp > 1:
        parts.append(_pipeline_source(layout, blocks_path))
    return "\n\n\n".join(parts) + "\n"


def _header(layout: Layout) -> str:
    imports = [
        '"""Applies ' + layout.label() + ' (written by explorer.analysis.layout_export.to_python)."""',
        "from torch.distributed.device_mesh import init_device_mesh",
        "from torch.distributed.fsdp import fully_shard",
    ]
    if layout.mixed_precision != "none":
        imports[-1] = "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard"
        imports.insert(1, "import torch")
    if layout.tp > 1:
        imports += [
            "from torch.distributed.tensor import Replicate",
            "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module",
        ]
    if layout.activation_checkpointing != "none":
        # torchtitan's wrapper too; private module, re-check on upgrades
        imports.append("from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper")
    if layout.pp > 1:
        schedule = _SCHEDULE_CLASSES[layout.pp_schedule]
        imports.append(f"from torch.distributed.pipelining import PipelineStage, {schedule}")
    return "\n".join(imports)


def _plan_literal(plan: Mapping[str, str]) -> str:
    if not plan:
        return "{}"
    return "{\n" + "".join(f"    {key!r}: {TP_STYLES[style]},\n" for key, style in plan.items()) + "}"


def _constants(layout: Layout, block_plan: Mapping[str, str], root_plan: Mapping[str, str]) -> str:
    dims = mesh_dims(layout)
    lines = [
        f"MESH_SHAPE = {tuple(size for _, size in dims)!r}",
        f"MESH_DIM_NAMES = {tuple(name for name, _ in dims)!r}",
    ]
    if layout.tp > 1:
        lines.append(f"BLOCK_TP_PLAN = {_plan_literal(block_plan)}  # relative to each block")
        lines.append(f"ROOT_TP_PLAN = {_plan_literal(root_plan)}  # relative to the root")
    return "\n".join(lines)


def _build_mesh_source() -> str:
    return (
        'def build_mesh(device_type: str = "cuda"):\n'
        '    """The world mesh (every rank calls it, after init_process_group)."""\n'
        "    return init_device_mesh(device_type, MESH_SHAPE, mesh_dim_names=MESH_DIM_NAMES)"
    )


def _apply_source(layout: Layout, blocks_path: str, has_block_plan: bool, has_root_plan: bool) -> str:
    lines = [
        "def apply_layout(model, world_mesh):",
        '    """TP, then activation checkpointing, then FSDP2 (torchtitan\'s order); returns model."""',
        f"    blocks = model.get_submodule({blocks_path!r})",
    ]
    if layout.tp > 1:
        lines.append('    tp_mesh = world_mesh["tp"]')
        if has_block_plan:
            lines += ["    for block in blocks:", "        parallelize_module(block, tp_mesh, BLOCK_TP_PLAN)"]
        if has_root_plan:
            lines.append("    parallelize_module(model, tp_mesh, ROOT_TP_PLAN)")
    if layout.activation_checkpointing != "none":
        if layout.activation_checkpointing == "block":
            lines.append("    for name, block in list(blocks.named_children()):")
        else:
            lines += [
                "    for index, (name, block) in enumerate(list(blocks.named_children())):",
                '        if index % 2 == 0:  # torchtitan\'s selective_ac_option "2": every other block',
                "            continue",
            ]
        lines.append("        blocks.register_module(name, checkpoint_wrapper(block))")
    if layout.data_parallel > 1:
        dp = '"dp_replicate", "dp_shard"' if layout.dp_replicate > 1 else '"dp_shard"'
        policy = ""
        if layout.mixed_precision != "none":
            dtype = f"torch.{layout.mixed_precision}"
            lines.append(f"    policy = MixedPrecisionPolicy(param_dtype={dtype}, reduce_dtype=torch.float32)")
            policy = ", mp_policy=policy"
        lines += [
            f"    dp_mesh = world_mesh[{dp}]",
            "    for block in blocks:",
            f"        fully_shard(block, mesh=dp_mesh{policy})",
            f"    fully_shard(model, mesh=dp_mesh{policy})",
        ]
    lines.append("    return model")
    return "\n".join(lines)


def _pipeline_source(layout: Layout, blocks_path: str) -> str:
    """The outline: which blocks each of this rank's stages holds, and the schedule over them."""
    stages = layout.pp * layout.stages_per_rank
    schedule = _SCHEDULE_CLASSES[layout.pp_schedule]
    style = "loop" if layout.stages_per_rank > 1 else "single"
    stage_arg = "stages" if layout.stages_per_rank > 1 else "stages[0]"
    return f'''# OUTLINE (pipeline parallelism is model-specific): cut the model into {stages} stages of
# consecutive blocks, the first stage with the embedding and the last with the head, each stage's
# forward skipping what it lacks; call apply_layout on each stage module; then build_schedule.
NUM_STAGES = {stages}
STAGES_PER_RANK = {layout.stages_per_rank}
MICROBATCHES = {layout.accumulation_steps}


def stage_indices(world_mesh):
    """This rank's stage indices ({style} style: rank r holds stages r, r + pp, ...)."""
    pp_rank = world_mesh["pp"].get_local_rank()
    return [pp_rank + k * {layout.pp} for k in range(STAGES_PER_RANK)]


def stage_blocks(stage_index, num_blocks):
    """Indices into model.{blocks_path} that stage `stage_index` holds."""
    per_stage = num_blocks // NUM_STAGES
    return range(stage_index * per_stage, (stage_index + 1) * per_stage)


def build_schedule(stage_modules, world_mesh, device, loss_fn):
    """One PipelineStage per stage module of this rank, run by {schedule}."""
    group = world_mesh["pp"].get_group()
    stages = [
        PipelineStage(module, index, NUM_STAGES, device, group=group)
        for module, index in zip(stage_modules, stage_indices(world_mesh))
    ]
    return {schedule}({stage_arg}, n_microbatches=MICROBATCHES, loss_fn=loss_fn)'''
