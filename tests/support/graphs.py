"""Comparing two recorded graphs field by field (direct records vs `GraphBuilder.record`, plans on
vs off): every op field (func, args, kwargs, outputs, inputs, reads, writes, creates, stream,
source...), every tensor, storage and writer list, the random streams, the generators' start
states and restarts, and the real tensors from outside."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from explorer.graph import InitGraph
from explorer.record.fake import handle_of


def graph_of(module: nn.Module) -> InitGraph:
    """The graph a deferred module was recorded into."""
    handle = handle_of(next(t for t in (*module.parameters(), *module.buffers()) if handle_of(t) is not None))
    assert handle is not None
    return handle.graph


def _op_fields(graph: InitGraph) -> list[tuple]:
    return [tuple(getattr(op, f.name) for f in dataclasses.fields(op)) for op in graph.ops]


def _same_state(ours: torch.Tensor | None, theirs: torch.Tensor | None) -> bool:
    return (ours is None and theirs is None) or (ours is not None and theirs is not None and torch.equal(ours, theirs))


def assert_same_graph(ours: InitGraph, theirs: InitGraph) -> None:
    """Raise AssertionError naming the first difference between two graphs."""
    assert len(ours.ops) == len(theirs.ops)
    for index, (mine, other) in enumerate(zip(_op_fields(ours), _op_fields(theirs))):
        assert mine == other, f"op {index} differs: {mine} != {other}"
    assert ours.tensors == theirs.tensors
    assert ours.storages == theirs.storages
    assert ours.writers == theirs.writers
    assert ours.random_streams == theirs.random_streams
    assert ours.rng_start.keys() == theirs.rng_start.keys()
    assert all(_same_state(ours.rng_start[key], theirs.rng_start[key]) for key in ours.rng_start)
    restarts = [{key: sorted(positions) for key, positions in g.rng_restarts.items()} for g in (ours, theirs)]
    assert restarts[0] == restarts[1]
    assert [(e.version, e.fresh) for e in ours.externals] == [(e.version, e.fresh) for e in theirs.externals]
    assert ours.constructor_ops == theirs.constructor_ops
