"""One random fill split over threads (`fill_layout`, `fills`): bit for bit the whole fill.

Every family with a draw-count rule, every floating dtype, sizes around normal_'s 16-element blocks
and around the split points; the pieces run in the order a worker would, from generators jumped to
their first draw.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explorer import deferred_init, materialize_module
from explorer.replay import fills
from explorer.replay.draws import FAMILIES, calibrated_formula
from explorer.replay.fill_layout import Piece, draw_range, fill_layout, fill_pieces
from explorer.replay.mt19937 import jump_state

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# Kernels that exist for the dtype (random_ with a range past 2^32 has none in float16).
CASES = [(family, dtype) for family in FAMILIES for dtype in DTYPES if calibrated_formula(family, dtype) is not None]
# Block edges (15, 16, 17, 31, 32, 33...) and, with pieces of at least 16, the split points ± 1.
pytestmark = pytest.mark.filterwarnings("ignore:to - 1 is out of bounds")  # random_(0, 2**33) on float

SIZES = (1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 1000, 4099)


def _start_state(seed: int) -> torch.Tensor:
    generator = torch.Generator()
    generator.manual_seed(seed)
    torch.empty(5).uniform_(generator=generator)  # mid-way through the generator's block of 624
    return generator.get_state()


def _whole(family, dtype: torch.dtype, size: int, state: torch.Tensor) -> torch.Tensor:
    generator = torch.Generator()
    generator.set_state(state)
    whole = torch.zeros(size, dtype=dtype)
    family.fill(whole, generator)
    return whole


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8)


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("family, dtype", CASES, ids=[f"{f.name}-{str(d)[6:]}" for f, d in CASES])
def test_split_fill_equals_the_whole_fill(family, dtype, size, parts) -> None:
    layout = fill_layout(family, dtype, size)
    if family.name == "normal" and size < 16:
        assert layout is None  # the scalar path reads the cached normal sample: never split
        return
    assert layout is not None
    state = _start_state(size * 7 + parts)
    groups = layout.split(parts, min_elements=16)
    assert len(groups) == max(1, min(parts, layout.blocks_end // 16))
    split = torch.zeros(size, dtype=dtype)
    for group in reversed(groups):  # the groups are independent: any order gives the same bytes
        fill_pieces(family.fill, split, state, group)
    assert _bits(split).equal(_bits(_whole(family, dtype, size, state)))


@pytest.mark.parametrize("family, dtype", [(f, d) for f, d in CASES if f.name in ("normal", "uniform")],
                         ids=lambda value: getattr(value, "name", str(value)[6:]))
def test_any_range_drawn_alone_equals_that_range_of_the_whole_fill(family, dtype) -> None:
    for size in (17, 33, 50):
        state = _start_state(size)
        whole = _whole(family, dtype, size, state)
        layout = fill_layout(family, dtype, size)
        for first in range(0, size, 3):
            for last in range(first, size + 1, 4):
                part = draw_range(family.fill, layout, state, first, last, dtype)
                assert _bits(part).equal(_bits(whole[first:last])), (size, first, last)


def _draws_taken(fill, dtype: torch.dtype, size: int) -> int:
    """How far the real kernel moves a generator, found by jumping one draw at a time."""
    state = _start_state(7)
    generator = torch.Generator()
    generator.set_state(state)
    fill(torch.empty(size, dtype=dtype), generator)
    after = generator.get_state()
    return next(k for k in range(4 * size + 64) if jump_state(state, k).equal(after))


def test_normal_layout_by_dtype() -> None:
    normal = next(f for f in FAMILIES if f.name == "normal")
    # float32 / float64: the tail's 16 uniforms come after all n.
    assert fill_layout(normal, torch.float32, 33).tail == Piece(17, 33, 33)
    assert fill_layout(normal, torch.float64, 33).tail == Piece(17, 33, 66)
    assert fill_layout(normal, torch.float32, 48).tail is None
    assert fill_layout(normal, torch.float32, 100).split(3, 16) == [
        [Piece(0, 32, 0)], [Piece(32, 64, 32)], [Piece(64, 96, 64), Piece(84, 100, 100)]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_normal_layout_is_the_one_this_torch_draws(dtype: torch.dtype) -> None:
    # torch 2.13+ draws the tail right after the whole blocks (48 draws for 33 elements); 2.11 and
    # 2.12 fill half precision as float32 does (49). The layout must be this kernel's, whichever.
    normal = next(f for f in FAMILIES if f.name == "normal")
    taken = _draws_taken(normal.fill, dtype, 33)
    assert taken in (48, 49)
    assert fill_layout(normal, dtype, 33).tail == Piece(17, 33, taken - 16)


class Wide(nn.Module):
    """Big enough to split with pieces of 64 elements; initialised as Hugging Face and timm do."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.first = nn.Parameter(torch.empty(3, dtype=dtype).uniform_())  # the generator is mid-stream
        self.normal = nn.Parameter(torch.empty(37, 29, dtype=dtype).normal_(0.0, 0.02))
        self.uniform = nn.Parameter(torch.empty(40, 20, dtype=dtype).uniform_(-0.1, 0.1))
        self.exponential = nn.Parameter(torch.empty(300, dtype=dtype).exponential_(3.0))
        self.bernoulli = nn.Parameter(torch.empty(301, dtype=dtype).bernoulli_(0.25))


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("rng", ["eager", "fast"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_materialize_splits_the_fills_left_unbalanced_over_threads_with_eager_values(dtype, rng, threads, monkeypatch) -> None:
    monkeypatch.setattr(fills, "MIN_PIECE_ELEMENTS", 64)
    monkeypatch.setattr(fills, "MIN_POOLED_ELEMENTS", 1)  # these small fills go to the pool too
    split = []
    original = fills.split_fill

    def counting(*args, **kwargs):
        groups = original(*args, **kwargs)
        split.append(0 if groups is None else len(groups))
        return groups

    monkeypatch.setattr(fills, "split_fill", counting)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(5)
        module = deferred_init(Wide, dtype)
        reference = {}
        if rng == "fast":  # with rng="fast" the reference is the same replay, unsplit
            monkeypatch.setattr(fills, "MIN_PIECE_ELEMENTS", 1 << 40)
            torch.manual_seed(5)
            reference = dict(materialize_module(deferred_init(Wide, dtype), rng="fast").named_parameters())
            monkeypatch.setattr(fills, "MIN_PIECE_ELEMENTS", 64)
        else:
            torch.manual_seed(5)
            reference = dict(Wide(dtype).named_parameters())
        split.clear()
        materialize_module(module, rng=rng)
    finally:
        torch.set_num_threads(threads_before)
    # Split: only fills that the fills still to come cannot balance over the threads (a piece costs a
    # jump). 2 threads: `uniform` (800 elements, 601 after it) and the last, `bernoulli`; 3 threads:
    # every large one. `first` never (3 elements).
    assert split == ([threads] * 2 if threads == 2 else [threads] * 4)
    for name, parameter in module.named_parameters():
        assert _bits(parameter.detach()).equal(_bits(reference[name].detach())), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["normal", "uniform", "exponential"])
def test_split_fill_of_a_million_elements_equals_the_whole_fill(name, dtype) -> None:
    # Large enough for any size-dependent kernel path (AVX2 blocks, grain sizes) to show.
    family = next(f for f in FAMILIES if f.name == name)
    size = (1 << 20) + 17
    layout = fill_layout(family, dtype, size)
    state = _start_state(size)
    split = torch.zeros(size, dtype=dtype)
    groups = layout.split(3, min_elements=1 << 18)
    assert len(groups) == 3
    for group in groups:
        fill_pieces(family.fill, split, state, group)
    assert _bits(split).equal(_bits(_whole(family, dtype, size, state)))


class ManySmall(nn.Module):
    """Fills on both sides of the pool's size limit, with dead ones (overwritten) between them."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 48) for _ in range(6))  # 3,072 elements: in line
        self.big = nn.Parameter(nn.init.normal_(nn.init.kaiming_uniform_(torch.empty(130, 129))))  # pooled
        self.last = nn.Linear(16, 8)


@pytest.mark.parametrize("rng", ["eager", "fast"])
def test_small_fills_run_in_line_and_large_ones_on_the_pool_with_the_same_values(rng, monkeypatch) -> None:
    pooled = []
    original = fills.ParallelFills.submit

    def counting(self, op, args, kwargs):
        taken = original(self, op, args, kwargs)
        if taken:
            pooled.append(tuple(args[0].shape))
        return taken

    monkeypatch.setattr(fills.ParallelFills, "submit", counting)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(9)
        module = deferred_init(ManySmall)
        if rng == "eager":
            torch.manual_seed(9)
            reference = dict(ManySmall().named_parameters())
        else:  # the same replay with every fill on the pool
            torch.manual_seed(9)
            other = deferred_init(ManySmall)
            monkeypatch.setattr(fills, "MIN_POOLED_ELEMENTS", 1)
            reference = dict(materialize_module(other, rng="fast").named_parameters())
            monkeypatch.setattr(fills, "MIN_POOLED_ELEMENTS", 1 << 14)
            pooled.clear()
        materialize_module(module, rng=rng)
    finally:
        torch.set_num_threads(threads_before)
    assert pooled == [(130, 129)]  # 16,770 elements; the live fill only (the dead one is skipped)
    for name, parameter in module.named_parameters():
        assert _bits(parameter.detach()).equal(_bits(reference[name].detach())), name
