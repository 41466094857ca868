"""Ops whose output shape depends on values, inside constructors: computed for real when cheap,
recorded with the real shape, replayed as eager; refused with the culprit's size above the limit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explorer import DeferredInitError, deferred_init, is_deferred, materialize_module
from explorer.record.computed import DEFAULT_LIMIT_BYTES, value_read_limit


class DataDependent(nn.Module):
    """What RegNet-like and routing constructors do with tensors they computed themselves."""

    def __init__(self) -> None:
        super().__init__()
        depths = torch.linspace(0, 3, 12).round()
        self.register_buffer("stages", torch.unique(depths))  # aten._unique2
        self.register_buffer("counts", torch.unique(depths, return_counts=True)[1])
        self.register_buffer("kept", torch.tensor([0.0, 1.0, 2.0]).nonzero())
        mask = torch.arange(10) % 3 == 0
        self.register_buffer("selected", torch.arange(10.0)[mask])  # boolean-mask indexing
        self.register_buffer("masked", torch.masked_select(torch.arange(6.0), torch.arange(6) > 2))
        self.register_buffer("repeated", torch.repeat_interleave(torch.arange(3), torch.tensor([1, 2, 3])))
        self.register_buffer("bins", torch.bincount(torch.tensor([0, 1, 1, 5])))
        noise = torch.rand(20)  # random, so parity needs the eager generator state
        self.register_buffer("high", noise[noise > 0.5])
        self.weight = nn.Parameter(torch.randn(int(self.stages.numel()), 3))  # drawn after the reads
        self.same = torch.equal(self.stages, self.stages)  # a bool computed from values


def test_data_dependent_ops_record_real_shapes_and_materialize_as_eager(restore_rng) -> None:
    torch.manual_seed(4)
    eager = DataDependent()
    torch.manual_seed(4)
    module = deferred_init(DataDependent)
    assert torch.equal(torch.get_rng_state(), eager_state_after_seed(4))  # recording drew nothing
    shapes = {name: tuple(t.shape) for name, t in module.named_buffers()}
    assert shapes == {name: tuple(t.shape) for name, t in eager.named_buffers()}
    assert module.same is True and is_deferred(module)
    materialize_module(module)
    for (name, want), (_, got) in zip(eager.state_dict().items(), module.state_dict().items()):
        assert got.dtype == want.dtype and got.stride() == want.stride(), name
        assert torch.equal(got, want), name


def eager_state_after_seed(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.get_rng_state()


class UniqueOfAParameter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64, 64))
        self.register_buffer("levels", torch.unique(self.weight.detach().round()))


def test_above_the_limit_the_error_names_the_tensor_its_size_and_the_opt_in(monkeypatch) -> None:
    monkeypatch.setenv("EXPLORER_VALUE_READ_LIMIT", "4KiB")
    with pytest.raises(DeferredInitError) as error:
        deferred_init(UniqueOfAParameter)
    message = str(error.value)
    assert message.startswith("aten._unique2.default needs the values of its inputs (its output shape depends "
                              "on them) while building UniqueOfAParameter at ")
    # randn's 16 KiB and round's 16 KiB
    assert "computing a deferred tensor (shape (64, 64), float32) would replay 32.0 KiB of recorded ops, over " \
           "the 4.0 KiB limit. Set EXPLORER_VALUE_READ_LIMIT" in message
    monkeypatch.setenv("EXPLORER_VALUE_READ_LIMIT", "1MiB")
    module = deferred_init(UniqueOfAParameter)  # opted in: computed
    materialize_module(module)
    assert torch.equal(module.levels, torch.unique(module.weight.detach().round()))


def test_the_limit_reads_sizes_and_refuses_nonsense(monkeypatch) -> None:
    monkeypatch.delenv("EXPLORER_VALUE_READ_LIMIT", raising=False)
    assert value_read_limit() == DEFAULT_LIMIT_BYTES == 64 * 2**20
    monkeypatch.setenv("EXPLORER_VALUE_READ_LIMIT", "1.5GiB")
    assert value_read_limit() == int(1.5 * 2**30)
    monkeypatch.setenv("EXPLORER_VALUE_READ_LIMIT", "lots")
    with pytest.raises(ValueError, match="EXPLORER_VALUE_READ_LIMIT='lots': use bytes or a size like"):
        value_read_limit()


def test_rng_fast_keeps_the_recorded_shapes_by_drawing_their_sources_as_eager(restore_rng) -> None:
    torch.manual_seed(4)
    eager = DataDependent()
    torch.manual_seed(4)
    module = deferred_init(DataDependent)
    materialize_module(module, rng="fast")
    assert torch.equal(module.high, eager.high)  # its source `noise` drew eager's numbers
    assert module.weight.shape == eager.weight.shape and not torch.equal(module.weight, eager.weight)
