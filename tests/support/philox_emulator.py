"""A CPU emulation of CUDA's grid-stride random kernels, for tests without a GPU.

Written from PyTorch's `distribution_nullary_kernel` (aten/src/ATen/native/cuda/
DistributionTemplates.h) and cuRAND's Philox4x32-10 (`curand_init`, `curand4`,
`curand_uniform4`, `curand_normal4`), independently of explorer/replay: it runs the kernel's loop
over (thread, round, value slot) as the GPU does, and the generator hands out offsets as
`philox_cuda_state` does. It reproduces the uniform_ values an H100 drew with torch 2.11 bit for
bit, and its normal_ values to within 1e-6 (the GPU uses fast `__logf`/`__sincosf`):
tests/explorer/replay/test_philox_rows.py checks both against the measured values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
_MASK = np.uint64(0xFFFFFFFF)
_BLOCK = 256


def philox4x32_10(counter: int | np.ndarray, subsequence: np.ndarray, seed: int) -> list[np.ndarray]:
    """The 4 32-bit outputs of Philox4x32-10 for 64-bit counter `counter` (the offset / 4 plus
    calls made) of each thread's `subsequence`, keyed by `seed` (cuRAND's layout: counter in the
    low 64 bits of the 128-bit block, subsequence in the high 64)."""
    counter = np.asarray(counter, dtype=np.uint64)
    subsequence = np.asarray(subsequence, dtype=np.uint64)
    c0, c1 = counter & _MASK, counter >> np.uint64(32)
    c2, c3 = subsequence & _MASK, subsequence >> np.uint64(32)
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for round_ in range(10):
        p0, p1 = np.uint64(_M0) * c0, np.uint64(_M1) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _MASK, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _MASK
        if round_ < 9:
            k0, k1 = (k0 + np.uint64(_W0)) & _MASK, (k1 + np.uint64(_W1)) & _MASK
    return [c0, c1, c2, c3]


def _uniform(bits: np.ndarray) -> np.ndarray:
    """cuRAND's `_curand_uniform`: x * 2^-32 + 2^-33, one fused multiply-add rounded to float32."""
    as_float = bits.astype(np.float32).astype(np.float64)
    return (as_float * 2.0**-32 + 2.0**-33).astype(np.float32)


def _uniform_double(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """cuRAND's `_curand_uniform_double_hq`: 53 bits from two values, times 2^-53, plus 2^-54."""
    bits = x ^ (y << np.uint64(53 - 32))
    return bits.astype(np.float64) * 2.0**-53 + 2.0**-54


def _normal(first: np.ndarray, second: np.ndarray, cosine: np.ndarray) -> np.ndarray:
    """cuRAND's Box-Muller on two 32-bit values (sine for the pair's first value, cosine for the
    second), in float64: the GPU's fast intrinsics agree to about 1e-6."""
    u = _uniform(first).astype(np.float64)
    v = second.astype(np.float64) * (2.0**-32 * 2 * np.pi) + 2.0**-32 * np.pi
    radius = np.sqrt(-2.0 * np.log(u))
    return np.where(cosine, radius * np.cos(v), radius * np.sin(v)).astype(np.float32)


@dataclass
class EmulatedGenerator:
    """A CUDA generator's seed and Philox offset, handed out as `philox_cuda_state` does."""

    seed: int
    offset: int

    def philox_cuda_state(self, increment: int) -> tuple[int, int]:
        reserved = (self.seed, self.offset)
        self.offset += (increment + 3) // 4 * 4
        return reserved


def uniform_(numel: int, generator: EmulatedGenerator, *, max_grid: int, limit: int = 2**31 - 1) -> np.ndarray:
    """A float32 `uniform_()` over `numel` contiguous elements on a device of `max_grid` blocks."""
    return _fill("uniform", np.float32, numel, generator, max_grid, limit)


def uniform64_(numel: int, generator: EmulatedGenerator, *, max_grid: int, limit: int = 2**31 - 1) -> np.ndarray:
    """A float64 `uniform_()`: `curand_uniform2_double`, two values per curand call (unroll 2)."""
    return _fill("uniform64", np.float64, numel, generator, max_grid, limit)


def normal_(numel: int, generator: EmulatedGenerator, *, max_grid: int, limit: int = 2**31 - 1) -> np.ndarray:
    """A float32 `normal_()` over `numel` contiguous elements on a device of `max_grid` blocks."""
    return _fill("normal", np.float32, numel, generator, max_grid, limit)


def _fill(kind: str, dtype: type, numel: int, generator: EmulatedGenerator, max_grid: int, limit: int) -> np.ndarray:
    out = np.empty(numel, dtype=dtype)
    _nullary(out, 0, numel, out.itemsize, generator, max_grid, limit, kind)
    return out


def _nullary(
    out: np.ndarray,
    start: int,
    numel: int,
    itemsize: int,
    generator: EmulatedGenerator,
    max_grid: int,
    limit: int,
    kind: str,
) -> None:
    """`distribution_nullary_kernel` (unroll 4; 2 for float64) over out[start:start + numel]: reserve the
    launch's offsets; then, if the tensor cannot be indexed in 32 bits, run the kernel again on
    each piece of `with_32bit_indexing` (`SplitUntil32Bit`: halves, first half numel // 2, split
    until each fits) instead of launching."""
    unroll = 2 if kind == "uniform64" else 4
    grid = min(max_grid, (numel + _BLOCK - 1) // _BLOCK)
    increment = ((numel - 1) // (_BLOCK * grid * unroll) + 1) * 4
    seed, offset = generator.philox_cuda_state(increment)
    if not _fits(numel, itemsize, limit):
        for piece_start, piece in _split_until_32_bit(start, numel, itemsize, limit):
            _nullary(out, piece_start, piece, itemsize, generator, max_grid, limit, kind)
        return
    threads = _BLOCK * grid
    element = np.arange(numel, dtype=np.int64)
    thread = element % threads
    round_ = element // (unroll * threads)
    slot = (element // threads) % unroll
    values = philox4x32_10(offset // 4 + round_, thread, seed)
    if kind == "uniform":
        out[start : start + numel] = _uniform(np.choose(slot, values))
    elif kind == "uniform64":
        out[start : start + numel] = _uniform_double(np.choose(2 * slot, values), np.choose(2 * slot + 1, values))
    else:
        pair = slot - slot % 2
        out[start : start + numel] = _normal(np.choose(pair, values), np.choose(pair + 1, values), slot % 2 == 1)


def _fits(numel: int, itemsize: int, limit: int) -> bool:
    return numel <= limit and 1 + (numel - 1) * itemsize <= limit


def _split_until_32_bit(start: int, numel: int, itemsize: int, limit: int) -> list[tuple[int, int]]:
    """(start, numel) of each piece, in the order `SplitUntil32Bit` yields them."""
    if _fits(numel, itemsize, limit):
        return [(start, numel)]
    half = numel // 2
    return _split_until_32_bit(start, half, itemsize, limit) + _split_until_32_bit(
        start + half, numel - half, itemsize, limit
    )
