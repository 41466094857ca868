"""Region: the bytes a strided layout touches, and set operations on byte intervals."""

from __future__ import annotations

import numpy as np
import torch

from explorer.analysis import init_regions
from explorer.analysis.init_regions import Region


def intervals(region: Region) -> list[tuple[int, int]]:
    return list(zip(region.starts.tolist(), region.ends.tolist()))


def test_a_contiguous_layout_is_one_interval():
    assert intervals(Region.of_layout((4, 4), (4, 1), 0, 4)) == [(0, 64)]


def test_a_row_slice_and_a_column_slice():
    base = torch.empty(4, 4)
    rows, column = base[1:3], base[:, 1]
    assert intervals(Region.of_layout(rows.shape, rows.stride(), rows.storage_offset(), 4)) == [(16, 48)]
    assert intervals(Region.of_layout(column.shape, column.stride(), column.storage_offset(), 4)) == [
        (4, 8), (20, 24), (36, 40), (52, 56)]


def test_a_transposed_layout_covers_its_storage():
    t = torch.empty(3, 5).t()
    assert intervals(Region.of_layout(t.shape, t.stride(), 0, 4)) == [(0, 60)]


def test_an_expanded_layout_covers_its_bytes_once():
    t = torch.empty(4, 1).expand(4, 3)
    assert intervals(Region.of_layout(t.shape, t.stride(), 0, 8)) == [(0, 32)]


def test_an_empty_layout_covers_nothing():
    assert Region.of_layout((0, 4), (4, 1), 0, 4).is_empty()


def test_union_difference_intersection():
    a = Region(np.array([0, 20]), np.array([10, 30]))
    b = Region(np.array([5, 30]), np.array([25, 40]))
    assert intervals(a.union(b)) == [(0, 40)]
    assert intervals(a.difference(b)) == [(0, 5), (25, 30)]
    assert intervals(a.intersection(b)) == [(5, 10), (20, 25)]
    assert a.union(b).covers(a) and not a.covers(b)
    assert Region.span(0, 40).difference(a.union(b)).is_empty()


def test_more_runs_than_the_limit_are_approximated_by_the_extent(monkeypatch):
    monkeypatch.setattr(init_regions, "MAX_RUNS", 2)
    t = torch.empty(4, 4)[:, 1]
    assert intervals(Region.of_layout(t.shape, t.stride(), t.storage_offset(), 4)) == [(4, 56)]
