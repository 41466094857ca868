"""Tensor-parallel plans: module-path globs → style names, and the DTensor styles they stand for.

A plan is what Hugging Face models carry (`config.base_model_tp_plan`, relative to the base model,
and the model's own `_tp_plan`): `{"layers.*.self_attn.q_proj": "colwise", "lm_head": ...}`. The
style names are transformers' (`transformers/distributed/tensor_parallel.py`, `ALL_PARALLEL_STYLES`);
each one read here maps to the `torch.distributed.tensor.parallel` style that shards the same
parameters and leaves the same layouts at the module's boundaries:

- "colwise": `ColwiseParallel()`: weight (and bias) sharded by output features, input replicated,
  output sharded on the last dim (attention infers its local heads from it, `view(..., -1, head_dim)`);
- "rowwise": `RowwiseParallel()`: weight sharded by input features, input sharded on the last dim,
  output all-reduced to replicated;
- "colwise_rep", "colwise_gather_output": `ColwiseParallel(output_layouts=Replicate())` (the output
  all-gathered: a language model head's full logits);
- "rowwise_rep", "rowwise_split_input": `RowwiseParallel(input_layouts=Replicate())` (a replicated
  input split locally);
- "embedding_rowwise": `RowwiseParallel(input_layouts=Replicate())` on an `nn.Embedding` (the
  vocabulary sharded, partial lookups all-reduced); "embedding_colwise":
  `ColwiseParallel(output_layouts=Replicate())` on an `nn.Embedding` (the hidden dim sharded, slices
  all-gathered);
- "replicate": nothing (every rank keeps the whole module).

Any other style (packed, sequence-parallel, expert-parallel, local kernels) raises
TensorParallelPlanError naming it and the module path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fnmatch import fnmatchcase

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

__all__ = [
    "STYLES",
    "TensorParallelPlanError",
    "apply_tp_plan",
    "check_tp_plan",
    "parallel_style",
    "plan_for_part",
    "tp_plan_of",
]

STYLES: dict[str, Callable[[], ParallelStyle] | None] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
    "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
    "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
    "embedding_colwise": lambda: ColwiseParallel(output_layouts=Replicate()),
    "replicate": None,
}


class TensorParallelPlanError(ValueError):
    """A tensor-parallel plan that cannot be applied (names the style, the plan key and the module)."""


def tp_plan_of(module: nn.Module) -> dict[str, str] | None:
    """The tensor-parallel plan a transformers model carries, keyed from `module`: its config's
    `base_model_tp_plan` and its base model's `_tp_plan` under the base model's prefix ("model."),
    then the model's own `_tp_plan` (its head: {"lm_head": "colwise_gather_output"}). Keys that name
    nothing in `module` are left out, as transformers leaves them when it applies its plan
    (transformers 4 copies the base model's unprefixed keys into the head's `_tp_plan`). None when
    the module carries none (not a transformers model, or an architecture without a plan)."""
    plan: dict[str, str] = {}
    prefix = getattr(module, "base_model_prefix", "")
    base = getattr(module, prefix, None) if prefix else None
    base_path = f"{prefix}." if isinstance(base, nn.Module) else ""
    config_plan = getattr(getattr(module, "config", None), "base_model_tp_plan", None) or {}
    for key, style in {**config_plan, **(_own_plan(base) if base_path else {})}.items():
        plan[base_path + key] = style
    plan.update(_own_plan(module))
    names = [path for path, _ in module.named_modules() if path] + [path for path, _ in module.named_parameters()]
    plan = {key: style for key, style in plan.items() if any(_matches(key, path) for path in names)}
    return plan or None


def _own_plan(module: nn.Module | None) -> dict[str, str]:
    own = getattr(module, "_tp_plan", None)
    return dict(own) if isinstance(own, Mapping) else {}


def parallel_style(style: str, path: str) -> ParallelStyle | None:
    """The DTensor style for transformers' `style` name at `path` (None for "replicate"); raises
    TensorParallelPlanError naming both for a style without one (see the module docstring)."""
    if style not in STYLES:
        raise TensorParallelPlanError(
            f"tensor-parallel style {style!r} of {path!r} is not supported (supported: {', '.join(STYLES)}); "
            "pass tp_plan= with one of those for this module"
        )
    make = STYLES[style]
    return make() if make is not None else None


def apply_tp_plan(module: nn.Module, tp_mesh: DeviceMesh, plan: Mapping[str, str]) -> None:
    """`parallelize_module` of `module` over `tp_mesh` with `plan` (module-path globs, `*` one path
    part, → style names). Raises TensorParallelPlanError for an unsupported style or a key that
    names no module (a parameter path, or a typo), naming the key. Tied parameters stay tied
    (`_tie_again`)."""
    styles = check_tp_plan(module, plan)
    tied = _tied_names(module)
    parallelize_module(module, tp_mesh, styles)
    _tie_again(module, tied)


def plan_for_part(plan: Mapping[str, str], model_paths: Mapping[str, str]) -> dict[str, str]:
    """`plan`, written for a whole model, for a part of it whose modules are `model_paths` (the part's
    path → the model's path): one entry per module of the part whose model path a key matches, keyed
    by its path in the part (a later key overriding an earlier one, as `parallelize_module` applies
    them in order). Keys matching none of the part's modules are left out: check the plan against
    the whole model (`check_tp_plan`) first."""
    part: dict[str, str] = {}
    for key, name in plan.items():
        for path, model_path in model_paths.items():
            if _matches(key, model_path):
                part[path] = name
    return part


def check_tp_plan(module: nn.Module, plan: Mapping[str, str]) -> dict[str, ParallelStyle]:
    """The DTensor style of each key of `plan` that has one ("replicate" has none). Raises
    TensorParallelPlanError for an unsupported style, or a key naming no module of `module` (a
    parameter path, or a typo), naming the key."""
    paths = [path for path, _ in module.named_modules() if path]
    parameters = [path for path, _ in module.named_parameters()]
    styles: dict[str, ParallelStyle] = {}
    for key, name in plan.items():
        matched = [path for path in paths if _matches(key, path)]
        if not matched and any(_matches(key, path) for path in parameters):
            raise TensorParallelPlanError(
                f"tensor-parallel plan key {key!r} ({name!r}) names a parameter of {type(module).__name__}, not a "
                "module: parameter styles (packed or expert weights) are not supported; pass tp_plan= without it"
            )
        if not matched:
            raise TensorParallelPlanError(
                f"tensor-parallel plan key {key!r} ({name!r}) names no module of {type(module).__name__}"
            )
        style = parallel_style(name, matched[0])
        if style is not None:
            styles[key] = style
    return styles


def _tied_names(module: nn.Module) -> list[list[str]]:
    """The names of each parameter held under several names (an embedding tied to its head)."""
    names: dict[int, list[str]] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _tie_again(module: nn.Module, tied: list[list[str]]) -> None:
    """`parallelize_module` replaces each module's parameters by DTensors one module at a time, which
    unties them; tie each group again to its first name's, as transformers' `tie_weights` does after
    sharding. Raises TensorParallelPlanError when the plan sharded two tied names differently."""
    for first, *others in tied:
        kept = module.get_parameter(first)
        for name in others:
            replaced = module.get_parameter(name)
            if replaced is kept:
                continue
            layouts = [(tuple(p.shape), getattr(p, "placements", None)) for p in (kept, replaced)]
            if layouts[0] != layouts[1]:
                raise TensorParallelPlanError(
                    f"tied parameters {first!r} and {name!r} are sharded differently by the tensor-parallel plan "
                    f"({layouts[0][1]} and {layouts[1][1]}): give their modules styles that shard the same dim"
                )
            owner, _, attribute = name.rpartition(".")
            setattr(module.get_submodule(owner), attribute, kept)


def _matches(key: str, path: str) -> bool:
    """Whether `path` is matched by `key` part by part (fnmatch per part, as parallelize_module reads it)."""
    keys, parts = key.split("."), path.split(".")
    return len(keys) == len(parts) and all(fnmatchcase(p, k) for k, p in zip(keys, parts))
