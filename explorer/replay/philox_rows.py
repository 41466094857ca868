"""Some rows of a random CUDA tensor drawn alone, equal to those rows of the whole tensor's fill.

A rank of a sharded materialization keeps a slice of each parameter. On a CUDA generator the
values of a fill are fixed by which thread of the launch draws each element and at which Philox
offset, so a slice can be drawn by smaller launches placed where the whole launch had them.

Note: [Philox element mapping]
`distribution_nullary_kernel` (aten/src/ATen/native/cuda/DistributionTemplates.h) launches
grid = min(max_grid, ceil(m / 256)) blocks of 256 threads over the m elements of a 32-bit piece
(note [Philox offset increments] in philox.py). With S = 256 * grid threads, thread t =
`curand_init(seed, subsequence=t, offset)` draws one curand call (4 32-bit values: float4,
double2 or ulonglong2) per round, and gives element e of the piece, in memory order:
    thread e % S, round e // (unroll * S), value (e // S) % unroll of that round's call,
where round r reads the Philox counter at offset + 4 * r. So a launch over elements [c, m) of the
piece, made with the offset moved by 4 * c // (unroll * S), draws exactly what the whole launch
drew there, provided c is a multiple of unroll * S:
- while at least S elements remain, the smaller launch has the same grid, so every element keeps
  its thread, its value slot and its round (shifted by c // (unroll * S));
- when fewer remain, its grid shrinks, but then every element is value 0 of round 0 of thread
  e - c, which is where the whole launch had it too.
A piece smaller than S (grid below the device's limit) has only round 0: its launch must start at
its first element. Rows [a, b) are therefore drawn from the nearest such start at or before a,
with fewer than unroll * S extra elements per piece (1,081,344 float32 values on an H100) that are
dropped. A tensor split for 32-bit indexing reserves the whole tensor's increment first, then each
piece its own, in order (philox.py); each piece is mapped on its own.
What is covered: the "grid_stride" kernels of philox.py over contiguous tensors. Everything else
(fused dropout, bernoulli_ with a tensor p, non-contiguous layouts) is not mapped here, and its
tensors are materialized whole. This mirrors PyTorch internals: checked against the first and
last values an H100 drew (tests/explorer/replay/test_philox_rows.py, by an emulation of the kernel)
and against the live generator in benchmarks/cuda_parity.py when a GPU is lent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._torch_compat.generators import cuda_state, cuda_state_fields
from .fill_layout import RecordedFill
from .philox import BLOCK, INT32_MAX, DeviceProperties, launch_increment, pieces_32bit


@dataclass(frozen=True)
class Launch:
    """One launch of a fill's kernel: `numel` elements from element `start` of the whole tensor,
    with the Philox offset moved by `offset` from where the whole fill started."""

    start: int
    numel: int
    offset: int


@dataclass(frozen=True)
class _Piece:
    start: int  # first element of the whole tensor
    numel: int
    offset: int  # its launch's offset, relative to the whole fill's


def row_launches(
    numel: int,
    itemsize: int,
    unroll: int,
    device: DeviceProperties,
    first: int,
    stop: int,
    *,
    limit: int = INT32_MAX,
) -> list[Launch]:
    """The launches that draw elements [first, stop) of a contiguous grid-stride fill over `numel`
    elements of `itemsize` bytes, each with the values the whole fill gives there (note [Philox
    element mapping]). `limit` is TensorIterator's 32-bit indexing limit (a parameter for tests)."""
    if not 0 <= first <= stop <= numel:
        raise ValueError(f"elements [{first}, {stop}) are not within a tensor of {numel}")
    launches = []
    for piece in _pieces(numel, itemsize, unroll, device, limit):
        low, high = max(first, piece.start), min(stop, piece.start + piece.numel)
        if low >= high:
            continue
        grid = min(device.max_grid, (piece.numel + BLOCK - 1) // BLOCK)
        per_round = unroll * BLOCK * grid
        rounds = (low - piece.start) // per_round
        begin = piece.start + rounds * per_round
        launches.append(Launch(begin, high - begin, piece.offset + 4 * rounds))
    return launches


def _pieces(numel: int, itemsize: int, unroll: int, device: DeviceProperties, limit: int) -> list[_Piece]:
    """The launches of the whole fill: one, or the whole tensor's reservation and then one per
    32-bit piece (`pieces_32bit`), with their starts."""
    sizes = pieces_32bit(numel, itemsize, limit)
    if len(sizes) == 1:
        return [_Piece(0, numel, 0)]
    pieces, start, offset = [], 0, launch_increment(numel, unroll, device)
    for size in sizes:
        pieces.append(_Piece(start, size, offset))
        start, offset = start + size, offset + launch_increment(size, unroll, device)
    return pieces


# Draws `numel` values of the fill from a CUDA generator state (a fresh contiguous 1-D tensor).
Draw = Callable[[int, torch.Tensor], torch.Tensor]


def draw_elements(draw: Draw, launches: list[Launch], state: torch.Tensor, first: int, stop: int) -> torch.Tensor:
    """Elements [first, stop) of the whole fill as one flat tensor, from `row_launches`'
    `launches` run by `draw` from the generator `state` the whole fill starts from."""
    seed, offset = cuda_state_fields(state)
    parts = []
    for launch in launches:
        values = draw(launch.numel, cuda_state(seed, offset + launch.offset))
        low, high = max(first, launch.start) - launch.start, min(stop, launch.start + launch.numel) - launch.start
        parts.append(values[low:high])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def cuda_draw(fill: RecordedFill, dtype: torch.dtype, device: torch.device) -> Draw:
    """A `Draw` running recorded `fill` on `device` from a private generator (the default
    generators are not touched)."""
    generator = torch.Generator(device=device)

    def draw(numel: int, state: torch.Tensor) -> torch.Tensor:
        generator.set_state(state)
        values = torch.empty(numel, dtype=dtype, device=device)
        fill(values, generator)
        return values

    return draw
