"""Inspection.diff and the graph export: metadata differences between two models, ops as networkx."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from explorer import deferred_init, inspect


class Base(nn.Module):
    def __init__(self, vocab: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        self.head = nn.Linear(4, vocab, bias=False)
        self.head.weight = self.embed.weight


class Refactor(Base):
    def __init__(self) -> None:
        super().__init__(vocab=12)
        self.block[1] = nn.RMSNorm(4)  # no bias
        self.head = nn.Linear(4, 12, bias=False)  # untied
        self.block[0].half()
        self.extra = nn.Linear(4, 2)


def test_diff_lists_added_removed_and_changed_modules_and_tensors():
    diff = inspect(deferred_init(Base)).diff(inspect(deferred_init(Refactor)))
    assert diff.modules.values.tolist() == [
        ["extra", "added", "", "Linear"],
        ["", "class", "Base", "Refactor"],
        ["block.1", "class", "LayerNorm", "RMSNorm"],
    ]
    assert diff.tensors[["name", "change"]].values.tolist() == [
        ["block.1.bias", "removed"], ["extra.weight", "added"], ["extra.bias", "added"]]
    assert diff.tensor_changes.values.tolist() == [
        ["embed.weight", "shape", (10, 4), (12, 4)],
        ["embed.weight", "tied_with", ("head.weight",), ()],
        ["block.0.weight", "dtype", "float32", "float16"],
        ["block.0.bias", "dtype", "float32", "float16"],
        ["head.weight", "shape", (10, 4), (12, 4)],
        ["head.weight", "tied_with", ("embed.weight",), ()],
    ]
    assert diff.summary() == ("1 module added; 2 modules changed class; 2 tensors added; 1 tensor removed; "
                              "4 tensors changed (dtype, shape, tied_with)")


def test_the_same_model_twice_has_no_differences_and_bad_arguments_raise():
    diff = inspect(deferred_init(Base)).diff(inspect(Base()))  # deferred against eager: same metadata
    assert diff.empty and diff.summary() == "no differences in modules or tensor metadata"
    with pytest.raises(TypeError, match="Inspection.diff expects another Inspection, got Linear"):
        inspect(Base()).diff(nn.Linear(2, 2))


def test_ops_export_as_a_networkx_graph_and_node_link_json():
    inspection = inspect(deferred_init(lambda: nn.Linear(3, 2)))
    graph = inspection.to_networkx()
    ops = [n for n, data in graph.nodes(data=True) if data["type"] == "op"]
    assert len(ops) == len(inspection.ops)
    assert graph.nodes["tensor:weight"] == {"type": "tensor", "shape": [2, 3], "dtype": "float32"}
    producers = [graph.nodes[p]["op"] for p in graph.predecessors("tensor:weight")]
    assert producers == ["aten.detach.default", "aten.uniform_.default"]  # made, then written in place
    data = json.loads(json.dumps(inspection.to_json()))
    assert {node["id"] for node in data["nodes"]} == set(graph.nodes)
    assert len(data["links"]) == graph.number_of_edges()
