"""`explorer.replay.philox` against the Philox offsets measured on an H100 with torch 2.11.

The data files in data/ are measurements, not outputs of the code under test:
- philox_offsets_h100_torch211.json: 2,137 increments, 13 op families x 4 dtypes x 44 sizes;
- philox_sequences_h100_torch211.json: the offset before and after each random op of five real
  constructions (Llama-7B, Qwen2-MoE, ViT-B/16, ConvNeXt-T, ResNet-50) on cuda:0;
- philox_probe_h100_torch211.json: the rules those two leave open (random_() on 64-bit types,
  ranges from 2^28 on, bernoulli_(Tensor), dropout's short cuts, strided layouts, tensors split for
  32-bit indexing up to 8 pieces) and ops left to scratch (randperm, multinomial); its "how" says how.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from explorer import deferred_init
from explorer.record.fake import handle_of
from explorer.record.initializers import TRUNC_NORMAL
from explorer.replay.philox import (
    DeviceProperties,
    StreamIncrements,
    advanced_state,
    device_properties,
    offset_increment,
    recorded_increment,
)

DATA = Path(__file__).resolve().parent / "data"
OFFSETS = json.loads((DATA / "philox_offsets_h100_torch211.json").read_text())
SEQUENCES = json.loads((DATA / "philox_sequences_h100_torch211.json").read_text())
PROBE = json.loads((DATA / "philox_probe_h100_torch211.json").read_text())
H100 = DeviceProperties(OFFSETS["multi_processor_count"], OFFSETS["max_threads_per_multi_processor"])

aten = torch.ops.aten
# The offsets file names families by their eager call; a recording numbers them as these aten ops.
# Its random_ and randint rows are ranges below 2^28 (float64 takes 4 per curand4 call there, which
# random_() on float64 does not: see the probe file); torch 2.11's nn.init.trunc_normal_ draws one
# uniform_ over the tensor (inverse-CDF), then erfinv_ and clamp_, which draw nothing.
FAMILY_OPS: dict[str, tuple[Any, dict[str, Any]]] = {
    "normal_": (aten.normal_.default, {}),
    "uniform_": (aten.uniform_.default, {}),
    "bernoulli_": (aten.bernoulli_.float, {"p": 0.5}),
    "exponential_": (aten.exponential_.default, {}),
    "log_normal_": (aten.log_normal_.default, {}),
    "cauchy_": (aten.cauchy_.default, {}),
    "geometric_": (aten.geometric_.default, {"p": 0.5}),
    "random_": (getattr(aten.random_, "from"), {"from": 0, "to": 10}),
    "randn": (aten.randn.default, {}),
    "rand": (aten.rand.default, {}),
    "randint": (aten.randint.low, {"low": 0, "high": 10}),
    "trunc_normal_": (aten.uniform_.default, {}),
    "dropout": (aten.native_dropout.default, {"p": 0.5, "train": True}),
}


def aten_op(name: str) -> Any:
    """'aten.random_.from' → the OpOverload."""
    _, packet, overload = name.split(".")
    return getattr(getattr(aten, packet), overload)


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def test_the_data_files_cover_what_they_say() -> None:
    assert len(OFFSETS["rows"]) == 2137
    assert sorted({row["op"] for row in OFFSETS["rows"]}) == sorted(FAMILY_OPS)
    assert sum(len(ops) for ops in SEQUENCES["models"].values()) == 980


@pytest.mark.parametrize("family", sorted(FAMILY_OPS))
def test_every_measured_increment_of_a_family_is_reproduced_exactly(family: str) -> None:
    op, arguments = FAMILY_OPS[family]
    rows = [row for row in OFFSETS["rows"] if row["op"] == family]
    shapes = [row.get("shape", [row["numel"]]) for row in rows]
    modelled = [
        offset_increment(op, dtype_of(row["dtype"]), shape, H100, arguments=arguments)
        for row, shape in zip(rows, shapes)
    ]
    assert modelled == [row["increment"] for row in rows]
    assert len(rows) >= 44


@pytest.mark.parametrize("model", sorted(SEQUENCES["models"]))
def test_every_random_op_of_a_real_construction_moves_the_offset_as_measured(model: str) -> None:
    ops = SEQUENCES["models"][model]
    modelled = [offset_increment(aten_op(op["op"]), dtype_of(op["dtype"]), op["shape"], H100) for op in ops]
    assert modelled == [op["after"] - op["before"] for op in ops]
    # Nothing else moved the generator in between: the state before the last op is the start plus
    # the sum of the increments before it, which is what replay computes instead of running them.
    assert all(later["before"] == earlier["after"] for earlier, later in zip(ops, ops[1:]))
    start, increments = ops[0]["before"], [op["after"] - op["before"] for op in ops]
    assert start + sum(increments[:-1]) == ops[-1]["before"]


COVERED_PROBES = [
    row for row in PROBE["rows"] if row["op"] not in ("aten.randperm.default", "aten.multinomial.default")
]


@pytest.mark.parametrize("row", COVERED_PROBES, ids=lambda row: f"{row['call']}")
def test_every_probed_call_is_reproduced_exactly(row: dict[str, Any]) -> None:
    got = offset_increment(
        aten_op(row["op"]),
        dtype_of(row["dtype"]),
        row["shape"],
        H100,
        stride=row.get("stride"),
        arguments=row.get("arguments", {}),
    )
    assert got == row["increment"]


def test_randperm_and_multinomial_are_left_to_scratch_though_measured() -> None:
    rows = [row for row in PROBE["rows"] if row not in COVERED_PROBES]
    assert {row["increment"] for row in rows if row["op"] == "aten.randperm.default"} == {12, 1048584, 67109364}
    assert [offset_increment(aten_op(row["op"]), dtype_of(row["dtype"]), row["shape"], H100) for row in rows] == [
        None
    ] * len(rows)


def test_a_tensor_past_32_bit_indexing_reserves_the_whole_and_each_half_again() -> None:
    # The row that advances twice the formula: 128256 x 8192 float32 is 4.2 GB, split into two
    # halves of 525336576 elements. grid = min(132 * 8, n / 256) = 1056 blocks of 256 threads.
    whole = ((128256 * 8192 - 1) // (256 * 1056 * 4) + 1) * 4
    half = ((525336576 - 1) // (256 * 1056 * 4) + 1) * 4
    assert (whole, half) == (3888, 1944)
    assert offset_increment(aten.normal_.default, torch.float32, [128256, 8192], H100) == whole + 2 * half == 7776
    # Fused dropout indexes in 64 bits instead of splitting: the formula once.
    assert offset_increment(aten.native_dropout.default, torch.float32, [128256, 8192], H100, arguments={}) == 3888


def test_the_grid_follows_the_devices_launch_limits() -> None:
    a100 = DeviceProperties(multi_processor_count=108, max_threads_per_multi_processor=2048)
    # 2^20 elements: H100's 1056 blocks cover them in one round of 4; A100's 864 blocks need two.
    assert offset_increment(aten.uniform_.default, torch.float32, [1 << 20], H100) == 4
    assert offset_increment(aten.uniform_.default, torch.float32, [1 << 20], a100) == 8


def test_an_empty_tensor_moves_nothing() -> None:
    assert offset_increment(aten.normal_.default, torch.float32, [0, 5], H100) == 0
    assert offset_increment(aten.native_dropout.default, torch.float16, [0], H100, arguments={"p": 0.5}) == 0


@pytest.mark.parametrize(
    ("op", "dtype", "shape", "stride", "arguments"),
    [
        (aten.normal_.default, torch.complex64, [8], None, {}),  # complex: not modelled
        (aten.uniform_.default, torch.int64, [8], None, {}),  # the kernel refuses integers
        (aten.randperm.default, torch.int64, [8], None, {}),
        (aten.multinomial.default, torch.int64, [3], None, {}),
        (TRUNC_NORMAL, torch.float32, [8], None, {}),  # rejection sampling on 2.13+: value-dependent
        (getattr(aten.random_, "from"), torch.float32, [8], None, {"from": 3, "to": None}),  # up to the dtype's limit
        (aten.bernoulli_.Tensor, torch.float32, [0], None, {}),  # not measured empty
        (aten.normal_.default, torch.float32, [2**20, 2**11], [2**12, 2], {}),  # not dense, past 32 bits
        (aten.normal_.default, torch.float32, [4, 4], [0, 1], {}),  # overlapping
    ],
)
def test_what_the_model_does_not_cover_is_none(op: Any, dtype: torch.dtype, shape, stride, arguments) -> None:
    assert offset_increment(op, dtype, shape, H100, stride=stride, arguments=arguments) is None


def test_without_device_properties_nothing_is_known() -> None:
    assert offset_increment(aten.normal_.default, torch.float32, [8], None) is None


def test_device_properties_are_none_for_a_device_this_machine_lacks() -> None:
    assert device_properties("cpu") is None
    assert device_properties(f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}") is None


class CudaLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 32, device="cuda")
        self.embedding = nn.Embedding(1000, 1000, device="cuda", dtype=torch.float64)
        self.register_buffer("noise", torch.randint(0, 2**30, (600000,), device="cuda"))
        self.cpu = nn.Linear(4, 4)


def test_recorded_ops_read_their_written_tensor_and_arguments() -> None:
    module = deferred_init(CudaLayers)
    graph = handle_of(module.linear.weight).graph
    cuda_ops = [graph.ops[index] for index in graph.random_streams["cuda:0"]]
    # Linear's uniform_ on float32 (4 values per curand call); Embedding's normal_ on 10^6 float64
    # and randint over 2^30 on 600000 elements (2 values per call: 540672 per round of 1056 x 256
    # threads, so two rounds, where 4 per call would need one).
    assert [recorded_increment(graph, op, H100) for op in cuda_ops] == [4, 4, 8, 8]
    assert [str(op.func) for op in cuda_ops][-1] == "aten.randint.low"
    assert [recorded_increment(graph, graph.ops[index], H100) for index in graph.random_streams["cpu"]] == [None, None]
    assert recorded_increment(graph, cuda_ops[0], None) is None


class RepeatedLayouts(nn.Module):
    """Three layers of one layout, then randint over two ranges on one layout (2^20: 4 values per
    curand call; 2^30: 2), which a memo by layout alone would confuse."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(512, 512, device="cuda") for _ in range(3))
        self.register_buffer("small", torch.randint(0, 2**20, (600000,), device="cuda"))
        self.register_buffer("wide", torch.randint(0, 2**30, (600000,), device="cuda"))


def test_stream_increments_equal_recorded_increments_op_by_op_memo_or_not() -> None:
    module = deferred_init(RepeatedLayouts)
    graph = handle_of(module.small).graph
    ops = [graph.ops[index] for index in graph.random_streams["cuda:0"]]
    increments = StreamIncrements(graph, H100)
    assert [increments(op) for op in ops] == [recorded_increment(graph, op, H100) for op in ops]
    assert [increments(op) for op in ops][-2:] == [4, 8]
    assert [increments(op) for op in ops] == [4] * 6 + [4, 8]  # asked again: from the memo, unchanged
    assert StreamIncrements(graph, None)(ops[0]) is None


def test_advancing_a_state_keeps_the_seed_and_adds_to_the_offset() -> None:
    start = torch.tensor([210, 4, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0], dtype=torch.uint8)  # seed 1234, offset 4
    assert advanced_state(start, 7776).tolist() == [210, 4, 0, 0, 0, 0, 0, 0, 0x64, 0x1E, 0, 0, 0, 0, 0, 0]
