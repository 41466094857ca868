"""The modules table: one row per module path, sizes counting each storage once per subtree."""

import math

import pandas as pd
import torch

from explorer import deferred_init, inspect
from tests.support.inspect_models import OnCuda, Tiny, table

# Storages of Tiny (bytes): base/window/shift 24, gain 4 (float16), const 8, scaled 12, steps 24
# (int64), embed/head 48, proj.weight 16, proj.bias 8: 144 in all. Parameters: shift 5, gain 2,
# embed (= head) 12, proj (shared) 4 + 2: 25 distinct elements.
TINY_MODULES = [
    # name, class, depth, own_params, total_params, bytes, bytes_by_dtype, bytes_by_device
    ("", "Tiny", 0, 7, 25, 144, {"float32": 116, "float16": 4, "int64": 24}, {"cpu": 144}),
    ("embed", "Embedding", 1, 12, 12, 48, {"float32": 48}, {"cpu": 48}),
    ("head", "Linear", 1, 12, 12, 48, {"float32": 48}, {"cpu": 48}),
    ("block", "Block", 1, 0, 6, 24, {"float32": 24}, {"cpu": 24}),
    ("block.proj", "Linear", 2, 6, 6, 24, {"float32": 24}, {"cpu": 24}),
    ("shared", "Block", 1, 0, 6, 24, {"float32": 24}, {"cpu": 24}),
    ("shared.proj", "Linear", 2, 6, 6, 24, {"float32": 24}, {"cpu": 24}),
]
SIZES = ["name", "class", "depth", "own_params", "total_params", "bytes", "bytes_by_dtype", "bytes_by_device"]


def rows(frame: pd.DataFrame, columns: list[str]) -> list[tuple]:
    return [tuple(row) for row in frame[columns].itertuples(index=False)]


def test_modules_columns_are_the_documented_ones_in_order():
    assert list(inspect(deferred_init(Tiny, table())).modules.columns) == [
        "name", "class", "depth", "own_params", "total_params", "bytes", "bytes_by_dtype", "bytes_by_device",
        "share", "materialized_bytes", "materialized", "disk_bytes", "remote_bytes",
    ]


def test_every_module_path_with_parameter_counts_and_bytes_by_dtype_and_device():
    modules = inspect(deferred_init(Tiny, table())).modules
    assert rows(modules, SIZES) == TINY_MODULES
    assert modules["share"].tolist() == [1.0, 1 / 3, 1 / 3, 1 / 6, 1 / 6, 1 / 6, 1 / 6]
    assert modules["materialized_bytes"].tolist() == [0] * 7
    assert modules["materialized"].tolist() == [0.0] * 7


def test_eager_module_has_the_same_sizes_fully_materialized():
    eager = Tiny(table())
    modules = inspect(eager).modules
    assert rows(modules, SIZES) == TINY_MODULES
    assert modules["total_params"][0] == sum(p.numel() for p in eager.parameters())
    assert modules["materialized_bytes"].tolist() == modules["bytes"].tolist()
    assert modules["materialized"].tolist() == [1.0] * 7


def test_cuda_fakes_count_bytes_by_device():
    modules = inspect(deferred_init(OnCuda)).modules
    assert rows(modules, SIZES) == [
        ("", "OnCuda", 0, 0, 9, 52, {"float16": 8, "int64": 8, "float32": 36}, {"cuda:0": 44, "cpu": 8}),
        ("lin", "Linear", 1, 9, 9, 36, {"float32": 36}, {"cuda:0": 36}),
    ]


def test_a_module_without_tensors_has_nan_share_and_fraction():
    modules = inspect(deferred_init(torch.nn.ReLU)).modules
    assert rows(modules, SIZES) == [("", "ReLU", 0, 0, 0, 0, {}, {})]
    assert math.isnan(modules["share"][0]) and math.isnan(modules["materialized"][0])
