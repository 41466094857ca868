"""Ops that repeat op after op (same fill on tensors of one layout, in-place random inits) take the
recorder's short paths; the graph must say exactly what the general path says, and replay must
give eager's values bitwise."""

import torch
from torch import nn

from explorer import deferred_init, materialize_module
from explorer.record.fake import handle_of


class Filled(nn.Module):
    """Three buffers of one layout filled alike (the fill is checked once for that layout), then a
    parameter drawn in place and a fill that reads its target's neighbour."""

    def __init__(self) -> None:
        super().__init__()
        for i in range(3):
            self.register_buffer(f"b{i}", torch.empty(2, 3).fill_(float(i) + 0.5))
        self.w = nn.Parameter(torch.empty(2, 3))
        nn.init.normal_(self.w)
        nn.init.uniform_(self.w[0], -1.0, 1.0)  # a view: writes part of w's storage


def test_repeated_fills_record_one_write_each_with_no_reads():
    module = deferred_init(Filled)
    graph = handle_of(module.w).graph
    fills = [op for op in graph.ops if op.label == "aten.fill_.Scalar"]
    assert len(fills) == 3
    storages = [graph.tensors[handle_of(getattr(module, f"b{i}")).tensor_id].storage for i in range(3)]
    for op, storage, value in zip(fills, storages, (0.5, 1.5, 2.5)):
        assert op.args[1] == value
        assert op.writes == (storage,)
        assert op.reads == frozenset()
        assert op.overwrites is True
        assert len(op.inputs) == 1 and graph.tensors[op.inputs[0]].storage == storage


def test_in_place_random_ops_record_their_stream_and_whether_they_cover_the_storage():
    module = deferred_init(Filled)
    graph = handle_of(module.w).graph
    normal, uniform = [op for op in graph.ops if op.random]
    w_storage = graph.tensors[handle_of(module.w).tensor_id].storage
    assert normal.label == "aten.normal_.default" and uniform.label == "aten.uniform_.default"
    assert (normal.stream, uniform.stream) == (("cpu", 0), ("cpu", 1))
    assert normal.writes == uniform.writes == (w_storage,)
    assert normal.overwrites is True and normal.reads == frozenset()
    assert uniform.overwrites is False  # one row of w: the rest of the storage stays
    assert uniform.reads == frozenset()


def test_repeated_fills_and_draws_replay_eagers_values_bitwise():
    torch.manual_seed(7)
    eager = Filled()
    torch.manual_seed(7)
    module = materialize_module(deferred_init(Filled))
    for name, tensor in eager.state_dict().items():
        assert torch.equal(module.state_dict()[name], tensor), name
