"""Inspection.search: modules, tensors and ops matched by substring or regex, case-insensitive."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explorer import deferred_init, inspect
from explorer.inspection import SearchError


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.mlp = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.register_buffer("steps", torch.arange(3))


@pytest.fixture(scope="module")
def inspection():
    return inspect(deferred_init(Net))


def test_a_module_path_finds_the_module_its_subtree_tensors_and_ops(inspection):
    result = inspection.search("blocks.1.MLP")
    assert result.modules == ["blocks.1.mlp", "blocks.1.mlp.0", "blocks.1.mlp.1", "blocks.1.mlp.2"]
    assert result.tensors == ["blocks.1.mlp.0.weight", "blocks.1.mlp.0.bias", "blocks.1.mlp.2.weight",
                              "blocks.1.mlp.2.bias"]
    ops = inspection.ops.assign(key=inspection.ops["graph"].astype(str) + ":" + inspection.ops["index"].astype(str))
    assert set(ops.loc[ops["key"].isin(result.ops), "op"]) == {
        "aten.empty.memory_format", "aten.detach.default", "aten.uniform_.default"}
    assert result.reveal == ["", "blocks", "blocks.1", "blocks.1.mlp"]
    assert result.counts_text() == f"4 modules · 4 tensors · {len(result.ops)} ops"


def test_shapes_dtypes_and_classes_are_searchable(inspection):
    assert inspection.search("(8, 4)").tensors == ["blocks.0.mlp.0.weight", "blocks.1.mlp.0.weight"]
    assert inspection.search("int64").tensors == ["steps"]
    assert inspection.search("gelu").modules == ["blocks.0.mlp.1", "blocks.1.mlp.1"]
    assert inspection.search("uniform_").modules == [] and len(inspection.search("uniform_").ops) == 12  # 6 Linear


def test_regex_and_its_errors(inspection):
    result = inspection.search(r"^blocks\.\d\.attn$", regex=True)
    assert result.modules == ["blocks.0.attn", "blocks.1.attn"]
    assert inspection.search("^blocks").empty  # not a regex by default: no name starts with "^"
    with pytest.raises(SearchError, match=r"invalid regular expression '\(': missing \)"):
        inspection.search("(", regex=True)


def test_an_empty_pattern_matches_nothing_and_targets_walk_modules_then_tensors(inspection):
    assert inspection.search("  ").empty and inspection.search("").counts_text() == "no match"
    result = inspection.search("embed")
    assert result.targets()[:2] == [("module", "embed"), ("tensor", "embed.weight")]
