"""Which draws of the CPU generator give which elements of one random fill.

A CPU random fill of a contiguous tensor takes its draws in element order, so any run of elements
can be filled alone, from the generator jumped to that run's first draw (`mt19937.jump_state`), and
comes out bit for bit as in the whole fill. That lets one large fill be split over threads
(`fills.py`) and a few rows of a huge tensor be drawn without the rest (`rows.py`, `slices.py`).

- element-by-element kernels (`uniform_`, `random_`, `exponential_`, `cauchy_`, `geometric_`,
  `bernoulli_(p)` without MKL): element i takes draws [k*i, k*i + k), k = 1 or 2 by dtype and range;
- `normal_` on >= 16 contiguous elements: elements come in blocks of 16, each made from its own 16
  uniforms (Box-Muller on pairs i, i+8), so a 16-aligned run of blocks is a `normal_` of its own
  from the jumped state. When the size is not a multiple of 16, the last 16 elements are
  recomputed from 16 more uniforms: drawn after all n uniforms in float32/float64, after the whole
  blocks only in float16/bfloat16 (whose kernel draws block by block). Either way the tail starts
  at draw `draw_count(n) - 16 * per_uniform`.

Note: [normal_fill block layout] mirrors `normal_fill`, `normal_fill_16` and `normal_fill_AVX2` in
aten/src/ATen/native/cpu/DistributionTemplates.h (torch 2.13); re-check on PyTorch upgrades.
tests/explorer/replay/test_parallel_fill.py compares every family x dtype x size around the block
edges with the whole fill. Draw counts themselves are calibrated per machine (note [Draw counts
are calibrated]); a family whose count is not linear in the size (MKL's `bernoulli_(p)` seeds a
stream with one draw) has no layout, and is filled whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .draws import Family, calibrated_formula
from .mt19937 import jump_state

# Runs a fill on a contiguous 1-D tensor, drawing from the generator given.
FillOnto = Callable[[torch.Tensor, torch.Generator], object]


class RecordedFill:
    """A recorded in-place fill (`aten.normal_` with its mean and std...) onto any piece and generator."""

    def __init__(self, func: Any, args: tuple, kwargs: dict) -> None:
        self.func, self.args, self.kwargs = func, args, kwargs

    def __call__(self, piece: torch.Tensor, generator: torch.Generator) -> Any:
        with torch.no_grad():
            return self.func(piece, *self.args, **{**self.kwargs, "generator": generator})


BLOCK = 16  # normal_'s block of elements (normal_fill_16)


@dataclass(frozen=True)
class Piece:
    """Elements [start, stop) of the flat tensor, filled by the op on them alone from the generator
    `draws` draws past the state the whole fill starts from."""

    start: int
    stop: int
    draws: int


@dataclass(frozen=True)
class FillLayout:
    """Where each element's draws are, for one fill of `numel` elements."""

    numel: int
    block: int  # elements filled together: 16 for normal_, 1 element by element
    draws_per_element: int  # 32-bit draws per element (per uniform for normal_)
    tail: Piece | None  # normal_'s recomputed last 16 elements, or None

    @property
    def blocks_end(self) -> int:
        """Where the run of whole blocks ends (elements past it come from the tail alone)."""
        return self.numel - self.numel % self.block

    def pieces(self, first: int, last: int) -> list[Piece]:
        """The pieces to fill, in this order, so elements [first, last) get their values: at most
        one run of whole blocks covering them (it may reach past them, to block edges), then the
        tail if it overlaps them. A later piece overwrites an earlier one where they overlap."""
        out = []
        lo = first - first % self.block
        hi = min(-(-last // self.block) * self.block, self.blocks_end)
        if lo < hi:
            out.append(Piece(lo, hi, lo * self.draws_per_element))
        if self.tail is not None and last > self.tail.start and first < self.tail.stop:
            out.append(self.tail)
        return out

    def split(self, parts: int, min_elements: int) -> list[list[Piece]]:
        """The whole fill as up to `parts` groups of pieces of about equal size (at least
        `min_elements` each, block aligned), to run side by side; each group in its order. Pieces
        of different groups never overlap (the tail goes last in the group whose last block it
        partly recomputes)."""
        body = self.blocks_end
        if body == 0:
            return [[]]
        blocks = body // self.block
        count = max(1, min(parts, blocks, body // max(min_elements, 1)))
        edges = [self.block * (blocks * i // count) for i in range(count)] + [body]
        groups = [[Piece(lo, hi, lo * self.draws_per_element)] for lo, hi in zip(edges, edges[1:])]
        if self.tail is not None:  # it overlaps only the last block, which the last group fills
            groups[-1].append(self.tail)
        return groups


def fill_layout(family: Family, dtype: torch.dtype, numel: int) -> FillLayout | None:
    """The layout of a `family` fill of `numel` contiguous elements of `dtype`, or None when its
    draws are not positional (unknown count, count not linear in the size, normal_ below 16)."""
    formula = calibrated_formula(family, dtype)
    if formula is None:
        return None
    if family.name != "normal":
        per = formula(1, dtype)
        if not per or formula(1000, dtype) != 1000 * per or formula(numel, dtype) != numel * per:
            return None  # not element by element
        return FillLayout(numel, 1, per, None)
    block_draws, total = formula(BLOCK, dtype), formula(numel, dtype)
    if numel < BLOCK or not block_draws or block_draws % BLOCK or total is None:
        return None
    per = block_draws // BLOCK
    if formula(2 * BLOCK, dtype) != 2 * block_draws:
        return None
    tail = Piece(numel - BLOCK, numel, total - block_draws) if numel % BLOCK else None
    return FillLayout(numel, BLOCK, per, tail)


def fill_pieces(
    fill: FillOnto, flat: torch.Tensor, state: torch.Tensor, pieces: Sequence[Piece], offset: int = 0
) -> None:
    """Run `fill` on each piece of `flat` (whose element 0 is element `offset` of the whole fill),
    each from its own generator at `state` jumped by the piece's draws. Thread-safe: nothing
    shared is changed (the user's generators are never touched)."""
    for piece in pieces:
        if piece.stop <= piece.start:
            continue
        generator = torch.Generator()
        generator.set_state(jump_state(state, piece.draws) if piece.draws else state)
        fill(flat[piece.start - offset : piece.stop - offset], generator)


def draw_range(
    fill: FillOnto, layout: FillLayout, state: torch.Tensor, first: int, last: int, dtype: torch.dtype
) -> torch.Tensor:
    """Elements [first, last) of the whole fill from `state`, drawn alone: a new 1-D tensor. Costs
    those elements, plus at most a block on each side and normal_'s 16-element tail."""
    pieces = layout.pieces(first, last)
    lo = min([piece.start for piece in pieces], default=first)
    hi = max([piece.stop for piece in pieces], default=last)
    buffer = torch.empty(hi - lo, dtype=dtype)
    fill_pieces(fill, buffer, state, pieces, offset=lo)
    return buffer if (lo, hi) == (first, last) else buffer[first - lo : last - lo].clone()
