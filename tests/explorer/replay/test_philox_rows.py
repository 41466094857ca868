"""`explorer.replay.philox_rows`: rows of a CUDA fill drawn alone, against an emulated kernel.

Without a GPU, the kernel is `tests/support/philox_emulator.py`, written from PyTorch's and
cuRAND's source. The first test ties the emulator to the hardware: it reproduces the values an H100
drew (data/philox_offsets_h100_torch211.json, "values"), the uniform ones bit for bit. The others
draw rows through `row_launches` on the emulator and compare them with the emulated whole fill.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from explorer import deferred_init
from explorer.record.fake import handle_of
from explorer.replay.philox import DeviceProperties, offset_increment
from explorer.replay.philox_rows import Launch, draw_elements, row_launches
from explorer.replay.positional import PositionalValue, positional_value
from explorer.replay.rows import cuda_rows, draw_rows
from tests.support.philox_emulator import EmulatedGenerator, normal_, uniform64_, uniform_

DATA = Path(__file__).resolve().parent / "data"
OFFSETS = json.loads((DATA / "philox_offsets_h100_torch211.json").read_text())
H100 = DeviceProperties(OFFSETS["multi_processor_count"], OFFSETS["max_threads_per_multi_processor"])
# A device of 4 blocks (1,024 threads): rounds of 4,096 elements, so every case stays small.
SMALL = DeviceProperties(1, 1024)
EMULATED = {"uniform": uniform_, "normal": normal_, "uniform64": uniform64_}


@pytest.mark.parametrize("row", OFFSETS["values"], ids=lambda row: f"{row['op']}-{row['numel']}")
def test_the_emulated_kernel_draws_the_values_an_h100_drew(row: dict) -> None:
    kind = row["op"].removesuffix("_")
    generator = EmulatedGenerator(row["seed"], row["offset_before"])
    values = EMULATED[kind](row["numel"], generator, max_grid=H100.max_grid)
    first, last = np.array(row["first"], np.float32), np.array(row["last"], np.float32)
    if kind == "uniform":  # exact: integer to float, one multiply-add
        assert values[: len(first)].tolist() == first.tolist()
        assert values[-len(last) :].tolist() == last.tolist()
        assert float(values.astype(np.float64).sum()) == row["sum"]
    else:  # the GPU's Box-Muller uses fast log and sincos
        np.testing.assert_allclose(values[: len(first)], first, rtol=0, atol=1e-6)
        np.testing.assert_allclose(values[-len(last) :], last, rtol=0, atol=1e-6)
    increment = offset_increment(torch.ops.aten.uniform_.default, torch.float32, [row["numel"]], H100)
    assert generator.offset == row["offset_before"] + increment


def emulated_draw(kind: str, device: DeviceProperties, limit: int):
    """A `Draw` on the emulator: a fresh launch over `numel` elements from `state`."""

    def draw(numel: int, state: torch.Tensor) -> torch.Tensor:
        raw = bytes(state.tolist())
        generator = EmulatedGenerator(int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little"))
        return torch.from_numpy(EMULATED[kind](numel, generator, max_grid=device.max_grid, limit=limit))

    return draw


def whole_fill(kind: str, numel: int, seed: int, offset: int, device: DeviceProperties, limit: int) -> torch.Tensor:
    generator = EmulatedGenerator(seed, offset)
    return torch.from_numpy(EMULATED[kind](numel, generator, max_grid=device.max_grid, limit=limit))


def start_state(seed: int, offset: int) -> torch.Tensor:
    return torch.tensor(list(seed.to_bytes(8, "little") + offset.to_bytes(8, "little")), dtype=torch.uint8)


# (elements, 32-bit limit in bytes): one piece below a full grid, exactly one full grid, between
# one grid and a round, several rounds with a tail, and tensors split into 2 and into 4 pieces.
CASES = [
    (700, 2**31 - 1),
    (1024, 2**31 - 1),
    (3000, 2**31 - 1),
    (4096 * 3 + 1500, 2**31 - 1),
    (20000, 40000),
    (30001, 30000),
]


@pytest.mark.parametrize("kind", sorted(EMULATED))
@pytest.mark.parametrize(("numel", "limit"), CASES)
def test_rows_drawn_alone_equal_the_whole_fills_rows(kind: str, numel: int, limit: int) -> None:
    itemsize, unroll = (8, 2) if kind == "uniform64" else (4, 4)
    seed, offset = 0x1234_5678_9ABC, 8
    whole = whole_fill(kind, numel, seed, offset, SMALL, limit)
    draw = emulated_draw(kind, SMALL, limit)
    rng = np.random.default_rng(numel)
    ranges = [(0, numel), (0, 1), (numel - 1, numel), (numel // 2, numel // 2)]
    ranges += [tuple(sorted(rng.integers(0, numel + 1, size=2).tolist())) for _ in range(12)]
    ranges += [(4096, 8192), (4095, 4097), (1023, 1025)]  # round and grid edges
    for first, stop in ranges:
        if stop > numel:
            continue
        launches = row_launches(numel, itemsize, unroll, SMALL, first, stop, limit=limit)
        if first == stop:
            assert launches == []
            continue
        drawn = draw_elements(draw, launches, start_state(seed, offset), first, stop)
        assert torch.equal(drawn, whole[first:stop]), (first, stop)


def test_rows_cost_less_than_one_round_extra_per_piece() -> None:
    # 8 ranks of a 30,001-element tensor split into 4 pieces: each rank draws its 3,750 elements
    # plus fewer than 4,096 before them per piece it touches.
    numel, limit, per_round = 30001, 30000, 4 * 1024
    for rank in range(8):
        first, stop = rank * numel // 8, (rank + 1) * numel // 8
        launches = row_launches(numel, 4, 4, SMALL, first, stop, limit=limit)
        drawn = sum(launch.numel for launch in launches)
        assert stop - first <= drawn < stop - first + len(launches) * per_round


def test_the_llama_3_70b_embedding_is_drawn_per_rank_from_its_two_32_bit_pieces() -> None:
    # 128256 x 8192 float32 on an H100 (measured: 7,776 for the whole fill): the whole tensor
    # reserves 3,888, then each 525,336,576-element half 1,944 (rounds of 1,081,344 elements).
    numel, row = 128256 * 8192, 8192
    half = numel // 2
    last_rank = row_launches(numel, 4, 4, H100, 7 * 16032 * row, numel)
    # rank 7's rows start 364 whole rounds (and part of one) into the second half
    assert last_rank == [
        Launch(start=half + 364 * 1081344, numel=numel - half - 364 * 1081344, offset=3888 + 1944 + 4 * 364)
    ]
    middle = row_launches(numel, 4, 4, H100, 3 * 16032 * row, 5 * 16032 * row)
    assert middle == [
        Launch(start=364 * 1081344, numel=half - 364 * 1081344, offset=3888 + 4 * 364),
        Launch(start=half, numel=5 * 16032 * row - half, offset=3888 + 1944),
    ]
    measured = next(r for r in OFFSETS["rows"] if r.get("shape") == [128256, 8192] and r["op"] == "normal_")
    assert 3888 + 1944 + 1944 == measured["increment"]


def test_a_range_outside_the_tensor_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"elements \[5, 11\) are not within a tensor of 10"):
        row_launches(10, 4, 4, SMALL, 5, 11)


class FilledOnCuda(torch.nn.Module):
    """Two fills recorded on a (fake) CUDA device: the weight's starts where the first one's ended."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, fill: str) -> None:
        super().__init__()
        self.before = torch.nn.Parameter(torch.empty(5000, device="cuda").uniform_())
        self.weight = torch.nn.Parameter(getattr(torch.empty(shape, dtype=dtype, device="cuda"), fill)())


@pytest.mark.parametrize(
    ("shape", "dtype", "fill", "kind"),
    [
        ((30, 300), torch.float32, "uniform_", "uniform"),
        ((7, 1500), torch.float32, "normal_", "normal"),
        ((90, 100), torch.float64, "uniform_", "uniform64"),
    ],
    ids=["uniform_-float32", "normal_-float32", "uniform_-float64"],
)
def test_rows_of_a_recorded_cuda_fill_equal_the_whole_fills_rows(shape, dtype, fill, kind, restore_rng) -> None:
    module = deferred_init(FilledOnCuda, shape, dtype, fill)
    handle = handle_of(module.weight)
    value = positional_value(handle.graph, handle.graph.tensors[handle.tensor_id])
    assert isinstance(value, PositionalValue) and value.kind == "random fill" and not value.tail
    recorded = value.source
    assert recorded.stream == ("cuda:0", 1)
    numel, row = module.weight.numel(), shape[1]
    seed, offset = 77, 4 * 5  # the state after `before`'s fill
    whole = whole_fill(kind, numel, seed, offset, SMALL, 2**31 - 1)
    for first, stop in [(0, shape[0]), (3, 5), (shape[0] - 2, shape[0])]:
        rows = cuda_rows(
            handle.graph,
            recorded,
            dtype,
            numel,
            SMALL,
            start_state(seed, offset),
            first * row,
            stop * row,
            emulated_draw(kind, SMALL, 2**31 - 1),
        )
        assert torch.equal(rows, whole[first * row : stop * row]), (first, stop)


class UnmappedOnCuda(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up_to_the_limit = torch.nn.Parameter(torch.empty(8, 64, device="cuda").random_(3, None))
        p = torch.full((8, 64), 0.5, device="cuda")
        self.by_tensor_p = torch.nn.Parameter(torch.empty(8, 64, device="cuda").bernoulli_(p))


def test_a_cuda_fill_whose_kernel_is_not_mapped_is_left_to_whole_replay(restore_rng) -> None:
    module = deferred_init(UnmappedOnCuda)
    handle = handle_of(module.up_to_the_limit)
    value = positional_value(handle.graph, handle.graph.tensors[handle.tensor_id])
    assert isinstance(value, PositionalValue) and value.source.func == getattr(torch.ops.aten.random_, "from")
    recorded = value.source

    def never(numel: int, state: torch.Tensor) -> torch.Tensor:
        raise AssertionError("an unmapped kernel must not be launched by rows")

    # random_(from, None) ranges up to the dtype's limit, which philox.py does not model
    assert cuda_rows(handle.graph, recorded, torch.float32, 512, SMALL, start_state(1, 0), 0, 64, never) is None
    # bernoulli_ with a tensor p reads another tensor: not a fill drawable by rows at all
    by_tensor = handle_of(module.by_tensor_p)
    reason = positional_value(by_tensor.graph, by_tensor.graph.tensors[by_tensor.tensor_id])
    assert reason == "aten.bernoulli_.Tensor reads another tensor"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fall-back of a machine without CUDA")
def test_rows_of_a_cuda_fill_are_left_to_whole_replay_without_that_device(restore_rng) -> None:
    module = deferred_init(FilledOnCuda, (30, 300), torch.float32, "uniform_")
    assert draw_rows(module.weight, 0, 10, "eager", device="cpu") is None
