"""The recorder's direct records (note [Direct records] in record/builder.py) write exactly the graph
that the general `GraphBuilder.record` writes: every op field, every tensor, storage, writer list and
random stream, for real models and for programs built to reach each branch where the two could
part (signed zeros, integer and bool fills, inference mode, `.data =` swaps, views, real tensors
from outside, ops recorded after construction). Replay then gives eager's values bitwise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from explorer import deferred_init, materialize_module
from explorer.record.modes import RecordingDispatchMode
from tests.support.graphs import assert_same_graph, graph_of
from tests.support.hf_configs import HF_ARCHITECTURES
from tests.support.parity import same_bits


def _general_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RecordingDispatchMode, "_record_directly", lambda *args: NotImplemented)


def _record_both_ways(build: Callable[[], nn.Module], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    torch.manual_seed(0)
    direct = deferred_init(build)
    with monkeypatch.context() as patched:
        _general_path_only(patched)
        torch.manual_seed(0)
        general = deferred_init(build)
    return direct, general


class Fills(nn.Module):
    """Fills and draws that the direct records must tell apart from one another."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("negative_zero", torch.empty(3).fill_(-0.0))
        self.register_buffer("positive_zero", torch.empty(3).fill_(0.0))
        self.register_buffer("ints", torch.empty(4, dtype=torch.int64).fill_(7))
        self.register_buffer("flags", torch.empty(4, dtype=torch.bool).fill_(True))
        self.register_buffer("full_int", torch.full((2,), 3))
        self.register_buffer("full_bool", torch.full((2,), False))
        self.register_buffer("halves", torch.ones(2, 2, dtype=torch.float16))
        self.register_buffer("steps", torch.arange(0, 10, 2))
        self.register_buffer("zeroed", torch.randn(2, 5).zero_())
        self.w = nn.Parameter(torch.empty(4, 6))
        nn.init.uniform_(self.w, -0.5, 0.5)
        self.w.data[1].normal_(0.0, 2.0)  # a view: does not cover the storage, reads nothing
        self.w.data[:, 0].fill_(1.0)
        self.v = nn.Parameter(self.w.detach()[2:])  # a parameter over a view of another one
        self.v.data = torch.empty(2, 6).bernoulli_(0.3)  # swapped: the next op records the swap first
        self.v.data.exponential_()
        self.u = nn.Parameter(torch.empty(3, 3).t())
        self.u.data.random_(0, 10)


class Inference(nn.Module):
    """Tensors made and filled under inference mode, then wrapped as parameters outside it."""

    def __init__(self) -> None:
        super().__init__()
        with torch.inference_mode():
            made = torch.empty(3, 3).normal_()
            made.fill_(2.0)
            self.register_buffer("table", made.detach())
        self.w = nn.Parameter(torch.empty(3).uniform_())


class FromOutside(nn.Module):
    """A fake view of a real tensor from outside: writes into it are refused by the general path."""

    def __init__(self, real: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(5).normal_())
        self.register_buffer("seen", real.view(2, 3) * 1.0)
        self.seen.fill_(4.0)


PROGRAMS: dict[str, Callable[[], nn.Module]] = {
    "fills and draws": Fills,
    "inference mode": Inference,
    "a real tensor from outside": lambda: FromOutside(torch.arange(6.0)),
    "a stack of linears": lambda: nn.Sequential(*(nn.Linear(8, 8) for _ in range(4)), nn.LayerNorm(8)),
    "embedding with a padding row": lambda: nn.Embedding(10, 4, padding_idx=0),
    "transformer encoder": lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=16),
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_direct_records_write_the_general_graph_for_programs_that_probe_each_branch(name, monkeypatch, restore_rng):
    direct, general = _record_both_ways(PROGRAMS[name], monkeypatch)
    assert_same_graph(graph_of(direct), graph_of(general))
    torch.manual_seed(0)
    eager = PROGRAMS[name]()
    materialize_module(direct)
    for (key, ours), (_, theirs) in zip(direct.state_dict().items(), eager.state_dict().items()):
        assert same_bits(ours, theirs), key


@pytest.mark.parametrize("arch", HF_ARCHITECTURES, ids=lambda arch: arch.name)
def test_direct_records_write_the_general_graph_for_transformers_models(arch, monkeypatch, restore_rng):
    config = arch.config()
    direct, general = _record_both_ways(lambda: arch.cls(config), monkeypatch)
    assert_same_graph(graph_of(direct), graph_of(general))


def test_ops_after_construction_are_recorded_alike(monkeypatch, restore_rng):
    """Re-initialization after deferred_init returned (model surgery) takes the same records."""

    def build_then_reinit() -> nn.Module:
        model = deferred_init(nn.Linear, 6, 4)
        nn.init.normal_(model.weight, std=0.5)
        model.bias.data.fill_(-0.0)
        model.weight.data[0].zero_()
        return model

    torch.manual_seed(0)
    direct = build_then_reinit()
    with monkeypatch.context() as patched:
        _general_path_only(patched)
        torch.manual_seed(0)
        general = build_then_reinit()
    assert_same_graph(graph_of(direct), graph_of(general))
