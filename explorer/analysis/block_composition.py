"""A step of N identical blocks, composed from the steps of 3 and 4 of them.

Note: [Composing a step from two block counts]
A training step's memory over time, for a model of N identical repeated blocks (a Llama's decoder
layers), is made of candidate peaks, each an affine function of N:
- each phase's own peak (forward, backward, optimizer): in forward, activations grow by one block's
  worth per block; the optimizer holds N blocks' states;
- each block's peak while its forward or its backward runs, at a position counted from either end
  (first, second, second-to-last, last): the backward of the last block holds every block's
  activations (slope: one block's activations), the backward of the first holds every other
  block's gradients (slope: one block's gradient shard), and which of the two wins depends on N.
The step's peak is the largest candidate. So two short steps, of `b` and `b + 1` blocks (the first
ones of the model; b = 3, the least for which the four positions are each one block's role: with
b = 2 the last block is also the second, and under FSDP over 4 or 8 ranks the composed peak was off
by up to 16 MB on a small Llama), give every candidate's value and slope; each is extrapolated to N,
by category and by part, and the largest is the peak of N blocks. Taking the maximum of the phase
peaks alone would not do: the maximum of affine functions is not affine.
`tests/explorer/analysis/test_block_composition.py` checks the composed peak against whole runs
of 5 to 8 blocks, by category and by part of the model (note [Bytes by part]), with and without
FSDP and checkpointing.

This holds when the blocks are alike (class, parameter shapes and dtypes, plain settings);
`blocks_alike` says whether they are, and callers measure the whole model when they are not.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .fake_fsdp import repeated_blocks
from .train_step import Breakdown

__all__ = [
    "BlockStack",
    "ComposedPeak",
    "PeakCandidates",
    "block_stack",
    "candidates_of",
    "compose_peak",
    "truncated",
]

SHORT_BLOCKS = 3  # the shorter of the two measured steps; the other has one block more
_POSITIONS = (0, 1, -2, -1)


@dataclass(frozen=True)
class BlockStack:
    """The repeated blocks a model composes over: the container's path and its block names, in order,
    and whether they are alike (note [Composing a step from two block counts])."""

    container: str
    names: tuple[str, ...]
    alike: bool

    @property
    def count(self) -> int:
        return len(self.names)

    def path(self, index: int) -> str:
        return f"{self.container}.{self.names[index]}" if self.container else self.names[index]


@dataclass(frozen=True)
class PeakCandidates:
    """One measured step's candidate peaks: (kind, position) → `Breakdown` (total bytes, by category,
    by (part, category)).
    Kinds: "phase:<phase>", "block:<phase>"; positions index the blocks (None for phases). A detail
    may follow the phase after a space (a pipelined step's, note [Composing a pipelined step])."""

    blocks: int
    values: dict[tuple[str, int | None], Breakdown]


@dataclass(frozen=True)
class ComposedPeak:
    """The composed step's peak: total, by category, the phase it falls in, the candidate it is, and
    by (part, category) (note [Bytes by part])."""

    peak_bytes: int
    peak: dict[str, int]
    phase: str
    candidate: str
    by_part: dict[tuple[str, str], int] = field(default_factory=dict)


def _signature(block: nn.Module) -> tuple:
    """What makes two blocks run alike: classes, parameter and buffer shapes and dtypes, and the plain
    settings of every submodule (a layer index excepted)."""
    shapes = tuple((name, tuple(t.shape), t.dtype) for name, t in block.state_dict(keep_vars=True).items())
    settings = []
    for path, sub in block.named_modules():
        plain = sorted(
            (key, value)
            for key, value in vars(sub).items()
            if not key.startswith("_")
            and isinstance(value, (bool, int, float, str))
            and "idx" not in key
            and "index" not in key
            and key not in ("layer_id", "layer_number")
        )
        settings.append((path, type(sub).__name__, tuple(plain)))
    return shapes, tuple(settings)


def block_stack(module: nn.Module) -> BlockStack | None:
    """The container of repeated blocks with the most blocks (None without one of at least
    `SHORT_BLOCKS + 2` blocks: too few to gain from composing)."""
    by_container: dict[str, list[str]] = {}
    for path, _ in repeated_blocks(module):
        container, _, name = path.rpartition(".")
        by_container.setdefault(container, []).append(name)
    if not by_container:
        return None
    container, names = max(by_container.items(), key=lambda item: len(item[1]))
    if len(names) < SHORT_BLOCKS + 2:
        return None
    holder = module.get_submodule(container) if container else module
    signatures = {_signature(holder.get_submodule(name)) for name in names}
    return BlockStack(container, tuple(names), alike=len(signatures) == 1)


def truncated(module: nn.Module, stack: BlockStack, keep: int) -> nn.Module:
    """`module` with its block container cut to the first `keep` blocks, sharing every tensor and
    submodule with it: the modules on the path to the container are shallow copies, so `module`
    is left as it was."""
    parts = stack.container.split(".") if stack.container else []
    root = _shallow(module)
    parent = root
    for part in parts[:-1]:
        child = _shallow(parent._modules[part])  # type: ignore[arg-type]  # _modules values are Module | None; a path to the container has no None
        parent._modules[part] = child
        parent = child
    holder = parent._modules[parts[-1]] if parts else parent
    if not isinstance(holder, (nn.ModuleList, nn.Sequential)):
        raise TypeError(f"cannot cut {stack.container!r}: a {type(holder).__name__}, not a ModuleList or Sequential")
    kept = type(holder)()
    for name in stack.names[:keep]:
        kept.add_module(name, holder._modules[name])
    if parts:
        parent._modules[parts[-1]] = kept
        return root
    return kept


def _shallow(module: nn.Module) -> nn.Module:
    copied = copy.copy(module)
    copied._modules = dict(module._modules)
    return copied


def candidates_of(
    blocks: int,
    stack: BlockStack,
    phase_own_peaks: dict[str, Breakdown],
    block_peaks: dict[tuple[str, str], Breakdown],
) -> PeakCandidates:
    """The candidate peaks of a measured step of the first `blocks` blocks (`TrainStep`'s
    `phase_own_peaks` and `block_peaks`)."""
    values: dict[tuple[str, int | None], Breakdown] = {}
    for phase, value in phase_own_peaks.items():
        values[(f"phase:{phase}", None)] = value
    for position in _POSITIONS:
        index = range(blocks)[position]
        for phase in ("forward", "backward"):
            measured = block_peaks.get((stack.path(index), phase))
            if measured is not None:
                values[(f"block:{phase}", position)] = measured
    return PeakCandidates(blocks, values)


def _extrapolated(short: Mapping[Any, int], longer: Mapping[Any, int], steps: int) -> dict[Any, int]:
    """Each key's value at `steps` blocks past `short`'s (a key one of the two lacks is 0 there)."""
    keys = [*short, *(key for key in longer if key not in short)]
    return {key: short.get(key, 0) + steps * (longer.get(key, 0) - short.get(key, 0)) for key in keys}


def compose_peak(short: PeakCandidates, longer: PeakCandidates, blocks: int) -> ComposedPeak:
    """The peak of a step of `blocks` blocks from the steps of `short.blocks` and one more
    (note [Composing a step from two block counts]). Raises ValueError when the two steps do not
    have the same candidates (they are not two block counts of one model and layout)."""
    if longer.blocks != short.blocks + 1 or set(short.values) != set(longer.values):
        raise ValueError(
            f"cannot compose steps of {short.blocks} and {longer.blocks} blocks: "
            "they must be one block apart, with the same candidate peaks"
        )
    steps = blocks - short.blocks
    best: tuple[int, tuple[str, int | None]] | None = None
    for key, (total, _, _) in short.values.items():
        value = total + steps * (longer.values[key][0] - total)
        if best is None or value > best[0]:
            best = (value, key)
    if best is None:
        raise ValueError("no candidate peaks to compose: the measured steps recorded no memory")
    value, key = best
    (_, categories, parts), (_, longer_categories, longer_parts) = short.values[key], longer.values[key]
    kind, position = key
    phase = kind.partition(":")[2].partition(" ")[0]  # "block:backward 1.2": a detail may follow the phase
    return ComposedPeak(
        value,
        _extrapolated(categories, longer_categories, steps),
        phase,
        kind if position is None else f"{kind}@{position}",
        _extrapolated(parts, longer_parts, steps),
    )
