"""The storages table: one row per piece of memory with every name that views it."""

import pandas as pd

from explorer import deferred_init, inspect
from tests.support.inspect_models import OnCuda, Tiny, table

LAYOUT = ["storage_id", "bytes", "device", "dtype", "tensors", "offsets", "shapes", "strides"]
# The base's storage carries three names: `shift` (base[1:], made a parameter by `.data =`), the
# base itself and `window` (base[2:]); the tied embedding/head weight and the shared proj one each.
TINY_STORAGES = [
    (0, 24, "cpu", "float32", ["shift", "base", "window"], [1, 0, 2], [(5,), (6,), (4,)], [(1,), (1,), (1,)]),
    (1, 4, "cpu", "float16", ["gain"], [0], [(2,)], [(1,)]),
    (2, 8, "cpu", "float32", ["const"], [0], [(2,)], [(1,)]),
    (3, 12, "cpu", "float32", ["scaled"], [0], [(3,)], [(1,)]),
    (4, 24, "cpu", "int64", ["steps"], [0], [(3,)], [(1,)]),
    (5, 48, "cpu", "float32", ["embed.weight", "head.weight"], [0, 0], [(4, 3), (4, 3)], [(3, 1), (3, 1)]),
    (6, 16, "cpu", "float32", ["block.proj.weight", "shared.proj.weight"], [0, 0], [(2, 2), (2, 2)],
     [(2, 1), (2, 1)]),
    (7, 8, "cpu", "float32", ["block.proj.bias", "shared.proj.bias"], [0, 0], [(2,), (2,)], [(1,), (1,)]),
]


def rows(frame: pd.DataFrame, columns: list[str]) -> list[tuple]:
    return [tuple(row) for row in frame[columns].itertuples(index=False)]


def test_storages_columns_are_the_documented_ones_in_order():
    assert list(inspect(deferred_init(Tiny, table())).storages.columns) == [
        "storage_id", "bytes", "device", "dtype", "state", "graph", "recorded_id", "tensors", "offsets",
        "shapes", "strides",
    ]


def test_every_storage_with_bytes_and_the_layout_of_each_name_on_it():
    assert rows(inspect(deferred_init(Tiny, table())).storages, LAYOUT) == TINY_STORAGES


def test_fake_storages_name_their_recorded_storage():
    storages = inspect(deferred_init(Tiny, table())).storages
    # Recorded storages are numbered as ops create them: embedding 0, head 1 (dropped), proj 2 and
    # 3, arange 4, the shift's first storage 5 (dropped), constant 6, scaled 7, steps 8, gain 9.
    assert storages["recorded_id"].tolist() == [4, 9, 6, 7, 8, 0, 2, 3]
    assert storages["graph"].tolist() == [0] * 8
    assert storages["state"].tolist() == ["fake"] * 8


def test_eager_storages_have_the_same_layout_and_no_recorded_storage():
    storages = inspect(Tiny(table())).storages
    assert rows(storages, LAYOUT) == TINY_STORAGES
    assert storages["state"].tolist() == ["real"] * 8
    assert storages["graph"].isna().all() and storages["recorded_id"].isna().all()


def test_cuda_fake_storages_are_on_the_recorded_device():
    storages = inspect(deferred_init(OnCuda)).storages
    assert rows(storages, ["storage_id", "bytes", "device", "dtype", "tensors"]) == [
        (0, 8, "cuda:0", "float16", ["mask"]),
        (1, 8, "cpu", "int64", ["count"]),
        (2, 24, "cuda:0", "float32", ["lin.weight"]),
        (3, 12, "cuda:0", "float32", ["lin.bias"]),
    ]
