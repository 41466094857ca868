"""The byte layouts of PyTorch's CPU and CUDA generator states, checked against the running torch.

Note: [CPU generator state layout] `torch.get_rng_state()` is the byte image of PyTorch's
`THGeneratorStateNew` (aten/src/ATen/CPUGeneratorImpl.cpp): seed u64 @0, left i32 @8, seeded i32 @12,
next u64 @16, state u64[624] @24 (each holding one 32-bit word), then the cached normal samples
(@5016 on), which a jump carries over unchanged. The same on 2.11 to 2.15. `cpu_state_layout()`
checks it once against a freshly seeded generator (the words `manual_seed` writes, `left` and `next`
after one draw), so a release that changes it fails with its name instead of jumping wrongly.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

WORDS = 624  # mt19937's words of state


class CpuStateLayout(NamedTuple):
    """Where each field of a CPU generator state lies (byte slices of the uint8 state tensor)."""

    total_bytes: int
    left: slice  # int32: words left in the current block, plus one
    next: slice  # uint64: index of the next word to return
    words: slice  # uint64[624], each holding one 32-bit word
    normal_cache: slice  # the cached normal samples


_LAYOUT = CpuStateLayout(5056, slice(8, 12), slice(16, 24), slice(24, 24 + 8 * WORDS), slice(24 + 8 * WORDS, 5056))


def _seeded_words(seed: int) -> list[int]:
    """The 624 words `manual_seed(seed)` leaves (MT19937RNGEngine::init_with_uint32)."""
    words = [seed & 0xFFFFFFFF]
    for index in range(1, WORDS):
        previous = words[-1]
        words.append((1812433253 * (previous ^ (previous >> 30)) + index) & 0xFFFFFFFF)
    return words


@functools.cache
def cpu_state_layout() -> CpuStateLayout:
    """The layout, after checking it holds for this torch; RuntimeError naming the release if not."""
    generator = torch.Generator()
    generator.manual_seed(1234)
    raw = generator.get_state()
    layout = _LAYOUT
    problems = []
    if raw.dtype != torch.uint8 or raw.numel() != layout.total_bytes:
        problems.append(f"{raw.numel()} {raw.dtype} values, expected {layout.total_bytes} uint8")
    else:
        words = raw[layout.words].view(torch.int64).tolist()
        if words != _seeded_words(1234):
            problems.append("the 624 words are not where manual_seed wrote them")
        torch.empty(1, dtype=torch.float32).uniform_(generator=generator)  # one 32-bit draw, whatever the default dtype
        after = generator.get_state()
        left, position = after[layout.left].view(torch.int32).item(), after[layout.next].view(torch.int64).item()
        if (left, position) != (WORDS, 1):
            problems.append(f"after one draw left={left}, next={position}, expected {WORDS} and 1")
    if problems:
        raise RuntimeError(
            f"torch {torch.__version__} lays out the CPU generator state differently from 2.11-2.15 "
            f"({'; '.join(problems)}): jumping the generator (rng='eager' replay) needs note [CPU generator "
            "state layout] in explorer/_torch_compat/generators.py updated for this release"
        )
    return layout


# Note: [CUDA generator state layout] `torch.cuda.get_rng_state()` is the 16 bytes
# `CUDAGeneratorImpl::get_state` writes (aten/src/ATen/cuda/CUDAGeneratorImpl.cpp): the seed as a
# uint64 @0, then `philox_offset_per_thread` as an int64 @8, little-endian; `set_state` reads the
# same and refuses an offset that is not a multiple of 4. Seen on an H100 with torch 2.11:
# manual_seed(1234) gives bytes [210, 4, 0, ...] then offset 0, and a 5-element normal_ moves the
# offset to 4. The jump of a CUDA stream (replay/philox.py) rewrites the offset alone, so a release
# that changes this layout must change `cuda_state` and `cuda_state_fields` here.
CUDA_STATE_BYTES = 16


def cuda_state_fields(state: torch.Tensor) -> tuple[int, int]:
    """(seed, offset) of a CUDA generator state; ValueError naming the size when it is not 16 bytes."""
    if state.dtype != torch.uint8 or state.numel() != CUDA_STATE_BYTES:
        raise ValueError(
            f"a CUDA generator state of {state.numel()} {state.dtype} values, expected {CUDA_STATE_BYTES} uint8 "
            f"(note [CUDA generator state layout] in explorer/_torch_compat/generators.py, torch {torch.__version__})"
        )
    raw = bytes(state.tolist())
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little", signed=True)


def cuda_state(seed: int, offset: int) -> torch.Tensor:
    """The CUDA generator state with `seed` and Philox `offset` (what `set_state` takes)."""
    raw = seed.to_bytes(8, "little") + offset.to_bytes(8, "little", signed=True)
    return torch.tensor(list(raw), dtype=torch.uint8)


# Note: [Telling generators apart] An op given `generator=g` reaches `__torch_dispatch__` with a new
# Python wrapper around g's C++ generator on every call (torch/csrc/Generator.cpp wraps the
# `at::Generator` again), so `is` never matches the user's object, nor `torch.default_generator`.
# `_cdata` is the address of the C++ generator (`THPGenerator.cdata`), the same for every wrapper of
# one generator: checked by tests/explorer/test_torch_compat.py on every tested release.
def same_generator(first: torch.Generator, second: torch.Generator) -> bool:
    """Whether two generator objects wrap one C++ generator (see note [Telling generators apart])."""
    return first._cdata == second._cdata  # type: ignore[attr-defined]  # a C attribute the stubs omit
