"""The parts of a model a step's memory is split into "by module" (note [Bytes by part]).

A part is one of the model's top-level modules, found by descending from the root into every
module that holds a container of repeated blocks (a Llama: `model.embed_tokens`, `model.layers`,
`model.norm`, `model.rotary_emb`, `lm_head`). The container is one part: its blocks are alike, and
a composed step (note [Composing a step from two block counts]) knows their sum, not each one. A
module descended into keeps its own code as a part of its own ("model (own code)": the masks and
position ids a decoder makes), the root's as `ROOT_PART`; ops outside every module (a loss
function) are `OUTSIDE_MODULES`. Parts are named by path in the model, checkpoint wrappers folded,
whatever the twin the step runs on (FSDP and TP keep paths; a pipeline stage maps its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .._torch_compat.memory_tracker import FastTracker
from .fake_fsdp import repeated_blocks
from .train_modules import OUTSIDE_MODULES, unwrapped

__all__ = ["OUTSIDE_MODULES", "ROOT_PART", "ModuleParts", "module_parts", "split_by_part"]

ROOT_PART = "(root)"  # the root module's own forward code and its own parameters


@dataclass(frozen=True)
class ModuleParts:
    """The parts of one model: `leaves`, the part modules' paths (a block container among them);
    `descended`, the modules descended into ("" the root), whose own code is a part of its own."""

    leaves: frozenset[str]
    descended: frozenset[str]

    def of_path(self, path: str) -> str:
        """The part the module at `path` (a path in the model) belongs to."""
        names = path.split(".") if path else []
        for end in range(len(names), -1, -1):
            prefix = ".".join(names[:end])
            if prefix in self.leaves:
                return prefix
            if prefix in self.descended:
                return own_code(prefix)
        return ROOT_PART

    def labels(self) -> list[str]:
        """Every part's name, in the model's order of paths, then `OUTSIDE_MODULES`."""
        named = {path: path for path in self.leaves} | {path: own_code(path) for path in self.descended}
        return [named[path] for path in sorted(named, key=lambda path: (path.split("."), path))] + [OUTSIDE_MODULES]


def own_code(path: str) -> str:
    """The part name of a descended module's own code."""
    return ROOT_PART if not path else f"{path} (own code)"


def module_parts(model: nn.Module) -> ModuleParts:
    """The parts of `model` (see the module docstring)."""
    containers = {unwrapped(path).rpartition(".")[0] for path, _ in repeated_blocks(model)}
    ancestors = (
        {".".join(c.split(".")[:end]) for c in containers for end in range(len(c.split(".")))} if containers else set()
    )
    descended = ancestors | {""}
    leaves: set[str] = set()
    for path in descended:
        holder = model.get_submodule(path) if path else model
        for name, _ in holder.named_children():
            child = f"{path}.{name}" if path else name
            if child not in descended:
                leaves.add(child)
    if "" in containers:  # the root is the container: its blocks are one part, the root's
        return ModuleParts(frozenset(), frozenset({""}))
    return ModuleParts(frozenset(leaves), frozenset(descended))


def split_by_part(
    tracker: FastTracker,
    parts: ModuleParts,
    roots: Iterable[nn.Module],
    optimizer: torch.optim.Optimizer | None,
    model_path: Callable[[str], str] = unwrapped,
) -> None:
    """Make `tracker` count its bytes by `parts` (note [Bytes by part]). `roots`: the modules the step
    runs (ModTracker names theirs "<root class>.<path>"); `model_path`: a path in a root → the path
    in the model (default: checkpoint wrappers folded; a pipeline stage maps its own)."""
    roots = list(roots)
    by_module: dict[int, str] = {}
    for root in roots:
        for path, module in root.named_modules(remove_duplicate=False):
            by_module.setdefault(id(module), parts.of_path(model_path(path)))

    def part_of_name(name: str | None) -> str:
        if name is None:
            return OUTSIDE_MODULES
        return parts.of_path(model_path(name.partition(".")[2]))

    def part_of_module(module: nn.Module) -> str:
        return by_module.get(id(module), ROOT_PART)

    tracker.split_by_part(part_of_name, part_of_module, roots, optimizer)


def nested(flat: Mapping[tuple[str, str], int], order: Sequence[str] = ()) -> dict[str, dict[str, int]]:
    """(part, category) → bytes as part → category → bytes, nonzero entries only; parts in `order`
    first (`ModuleParts.labels()`), any other after them."""
    rank = {part: index for index, part in enumerate(order)}
    out: dict[str, dict[str, int]] = {}
    for (part, category), value in sorted(flat.items(), key=lambda item: rank.get(item[0][0], len(rank))):
        if value:
            out.setdefault(part, {})[category] = value
    return out
