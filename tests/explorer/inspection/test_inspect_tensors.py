"""The tensors table: one row per parameter/buffer name, with layout, identity and provenance."""

import pandas as pd
import torch

from explorer import deferred_init, inspect
from tests.support.inspect_models import TINY_NAMES, OnCuda, Tiny, table, where

LAYOUT = ["name", "module", "kind", "shape", "stride", "storage_offset", "dtype", "device", "numel", "bytes",
          "contiguous", "requires_grad", "is_view"]
P, B, NP = "parameter", "buffer", "non-persistent buffer"
# name, module, kind, shape, stride, offset, dtype, device, numel, bytes, contiguous, requires_grad, is_view
TINY_LAYOUT = [
    ("shift", "", P, (5,), (1,), 1, "float32", "cpu", 5, 20, True, True, True),  # base[1:]
    ("gain", "", P, (2,), (1,), 0, "float16", "cpu", 2, 4, True, True, False),
    ("base", "", B, (6,), (1,), 0, "float32", "cpu", 6, 24, True, False, False),
    ("window", "", NP, (4,), (1,), 2, "float32", "cpu", 4, 16, True, False, True),  # base[2:]
    ("const", "", B, (2,), (1,), 0, "float32", "cpu", 2, 8, True, False, False),
    ("scaled", "", B, (3,), (1,), 0, "float32", "cpu", 3, 12, True, False, False),
    ("steps", "", B, (3,), (1,), 0, "int64", "cpu", 3, 24, True, False, False),
    ("embed.weight", "embed", P, (4, 3), (3, 1), 0, "float32", "cpu", 12, 48, True, True, False),
    ("head.weight", "head", P, (4, 3), (3, 1), 0, "float32", "cpu", 12, 48, True, True, False),
    ("block.proj.weight", "block.proj", P, (2, 2), (2, 1), 0, "float32", "cpu", 4, 16, True, True, False),
    ("block.proj.bias", "block.proj", P, (2,), (1,), 0, "float32", "cpu", 2, 8, True, True, False),
    ("shared.proj.weight", "shared.proj", P, (2, 2), (2, 1), 0, "float32", "cpu", 4, 16, True, True, False),
    ("shared.proj.bias", "shared.proj", P, (2,), (1,), 0, "float32", "cpu", 2, 8, True, True, False),
]
# storage_id, alias_group, tied_with: storages are numbered in the order names first reach them.
TINY_IDENTITY = {
    "shift": (0, ["base", "window"], []),
    "gain": (1, [], []),
    "base": (0, ["shift", "window"], []),
    "window": (0, ["shift", "base"], []),
    "const": (2, [], []),
    "scaled": (3, [], []),
    "steps": (4, [], []),
    "embed.weight": (5, ["head.weight"], ["head.weight"]),
    "head.weight": (5, ["embed.weight"], ["embed.weight"]),
    "block.proj.weight": (6, ["shared.proj.weight"], ["shared.proj.weight"]),
    "block.proj.bias": (7, ["shared.proj.bias"], ["shared.proj.bias"]),
    "shared.proj.weight": (6, ["block.proj.weight"], ["block.proj.weight"]),
    "shared.proj.bias": (7, ["block.proj.bias"], ["block.proj.bias"]),
}
# tensor_id, closure_ops, producer, last_write. Recording order (tensor ids in brackets):
# Embedding empty[0] detach[1] normal_; Linear empty[2] detach[3] uniform_; proj empty[4] detach[5]
# empty[6] detach[7] uniform_ uniform_; arange[8]; slice[9]; empty[10] detach[11]; slice[12];
# lift_fresh[13]; mul[14]; arange[15]; ones[16] detach[17]; and, when recording ends, the
# `.data = base[1:]` swap noticed as a set_data alias of the base's storage [18].
TINY_PROVENANCE = {
    "shift": (18, 2, "set_data", "aten.arange.default"),  # set_data + arange
    "gain": (17, 2, "aten.detach.default", "aten.ones.default"),
    "base": (8, 1, "aten.arange.default", "aten.arange.default"),
    "window": (9, 2, "aten.slice.Tensor", "aten.arange.default"),
    "const": (13, 1, "aten.lift_fresh.default", "aten.lift_fresh.default"),
    "scaled": (14, 1, "aten.mul.Tensor", "aten.mul.Tensor"),
    "steps": (15, 1, "aten.arange.default", "aten.arange.default"),
    "embed.weight": (1, 3, "aten.detach.default", "aten.normal_.default"),
    "head.weight": (1, 3, "aten.detach.default", "aten.normal_.default"),
    "block.proj.weight": (5, 3, "aten.detach.default", "aten.uniform_.default"),
    "block.proj.bias": (7, 3, "aten.detach.default", "aten.uniform_.default"),
    "shared.proj.weight": (5, 3, "aten.detach.default", "aten.uniform_.default"),
    "shared.proj.bias": (7, 3, "aten.detach.default", "aten.uniform_.default"),
}
TINY_SOURCE = {
    "shift": where("shift.data"), "gain": where("gain"), "base": where("base"), "window": where("window"),
    "const": where("const"), "scaled": where("scaled"), "steps": where("steps"),
    "embed.weight": where("embed"), "head.weight": where("embed"),
    "block.proj.weight": where("proj"), "block.proj.bias": where("proj"),
    "shared.proj.weight": where("proj"), "shared.proj.bias": where("proj"),
}


def rows(frame: pd.DataFrame, columns: list[str]) -> list[tuple]:
    return [tuple(row) for row in frame[columns].itertuples(index=False)]


def by_name(frame: pd.DataFrame, columns: list[str]) -> dict[str, tuple]:
    return {row[0]: row[1:] for row in rows(frame, ["name", *columns])}


def test_tensor_columns_are_the_documented_ones_in_order():
    tensors = inspect(deferred_init(Tiny, table())).tensors
    assert list(tensors.columns) == [
        "name", "module", "kind", "shape", "stride", "storage_offset", "dtype", "device", "numel", "bytes",
        "contiguous", "requires_grad", "is_view", "storage_id", "alias_group", "tied_with", "state",
        "graph", "tensor_id", "closure_ops", "producer", "last_write", "source", "file", "key", "offset", "disk_dtype",
    ]
    assert list(tensors["name"]) == TINY_NAMES


def test_every_name_has_its_layout_dtype_device_and_size():
    assert rows(inspect(deferred_init(Tiny, table())).tensors, LAYOUT) == TINY_LAYOUT


def test_views_tied_weights_and_shared_submodules_share_storage_ids():
    tensors = inspect(deferred_init(Tiny, table())).tensors
    assert by_name(tensors, ["storage_id", "alias_group", "tied_with"]) == TINY_IDENTITY


def test_fakes_name_their_recorded_tensor_producer_and_closure():
    tensors = inspect(deferred_init(Tiny, table())).tensors
    assert set(tensors["state"]) == {"fake"}
    assert set(tensors["graph"]) == {0}
    assert by_name(tensors, ["tensor_id", "closure_ops", "producer", "last_write"]) == TINY_PROVENANCE


def test_source_is_the_line_that_created_each_tensor():
    # `shift` points at `self.shift.data = self.base[1:]`, not at `nn.Parameter(torch.empty(5))`.
    tensors = inspect(deferred_init(Tiny, table())).tensors
    assert by_name(tensors, ["source"]) == {name: (source,) for name, source in TINY_SOURCE.items()}


def test_eager_module_has_the_same_layout_and_identities_and_is_real():
    tensors = inspect(Tiny(table())).tensors
    assert rows(tensors, LAYOUT) == TINY_LAYOUT
    assert by_name(tensors, ["storage_id", "alias_group", "tied_with"]) == TINY_IDENTITY
    assert set(tensors["state"]) == {"real"}
    for column in ("graph", "tensor_id", "closure_ops", "producer", "last_write", "source"):
        assert tensors[column].isna().all(), column
    assert [str(dtype) for dtype in tensors[["graph", "tensor_id", "closure_ops"]].dtypes] == ["Int64"] * 3


def test_cuda_fakes_report_the_recorded_device_dtype_and_bytes():
    tensors = inspect(deferred_init(OnCuda)).tensors
    assert rows(tensors, ["name", "device", "dtype", "shape", "bytes", "storage_id", "source"]) == [
        ("mask", "cuda:0", "float16", (4,), 8, 0, where("cuda.mask")),
        ("count", "cpu", "int64", (), 8, 1, where("cuda.count")),
        ("lin.weight", "cuda:0", "float32", (3, 2), 24, 2, where("cuda.lin")),
        ("lin.bias", "cuda:0", "float32", (3,), 12, 3, where("cuda.lin")),
    ]


def test_two_deferred_modules_in_one_container_number_their_graphs():
    container = torch.nn.Sequential(deferred_init(torch.nn.Linear, 2, 2), deferred_init(torch.nn.Linear, 2, 3))
    tensors = inspect(container).tensors
    # Each Linear's graph records its weight as tensor 1 and its bias as tensor 3.
    assert rows(tensors, ["name", "graph", "tensor_id", "storage_id"]) == [
        ("0.weight", 0, 1, 0), ("0.bias", 0, 3, 1), ("1.weight", 1, 1, 2), ("1.bias", 1, 3, 3),
    ]
