"""storage_views: every name on a tensor's storage with the byte range it covers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explorer import deferred_init, inspect
from explorer.inspection.aliasing import storage_views


class Views(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("base", torch.zeros(4, 6))  # 96 bytes
        self.register_buffer("row", self.base[1])  # bytes 24-48
        self.register_buffer("column", self.base[:, 2])  # elements 2, 8, 14, 20: bytes 8-84
        self.register_buffer("empty", self.base[4:])  # no elements
        self.head = nn.Linear(6, 4, bias=False)
        self.tail = nn.Linear(6, 4, bias=False)
        self.tail.weight = self.head.weight


def test_views_report_offsets_strides_and_the_bytes_they_reach():
    inspection = inspect(deferred_init(Views))
    views, size = storage_views(inspection.tensors, inspection.storages, "column")
    assert size == 96
    assert views[["name", "shape", "stride", "storage_offset", "start_byte", "end_byte"]].values.tolist() == [
        ["base", (4, 6), (6, 1), 0, 0, 96],
        ["row", (6,), (1,), 6, 24, 48],
        ["column", (4,), (6,), 2, 8, 84],
        ["empty", (0, 6), (6, 1), 24, 96, 96],
    ]


def test_tied_parameters_share_one_range_and_unknown_names_raise():
    inspection = inspect(deferred_init(Views))
    views, size = storage_views(inspection.tensors, inspection.storages, "tail.weight")
    assert views[["name", "start_byte", "end_byte"]].values.tolist() == [["head.weight", 0, 96], ["tail.weight", 0, 96]]
    assert size == 96
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        storage_views(inspection.tensors, inspection.storages, "nope")
