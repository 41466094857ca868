"""A training-mode batch norm updates running statistics its schema does not mark as written
(note [Batch norm as its kernels run it] in explorer/record/batch_norm.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explorer import deferred, deferred_init, materialize_module, materialize_tensor
from explorer.record.fake import handle_of


def _assert_state_equal(got: nn.Module, want: nn.Module) -> None:
    got_state, want_state = got.state_dict(), want.state_dict()
    assert list(got_state) == list(want_state)
    assert [name for name in want_state if not torch.equal(got_state[name], want_state[name])] == []


def _normed() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 3), nn.BatchNorm1d(3), nn.Linear(3, 4), nn.InstanceNorm1d(4, track_running_stats=True))


def _input() -> torch.Tensor:
    return torch.arange(40.0).reshape(2, 4, 5) / 10


def test_a_recorded_training_forward_updates_running_statistics_as_eager_does(restore_rng) -> None:
    torch.manual_seed(0)
    eager = _normed()
    x = _input()
    eager_out = eager[3](eager[2](eager[1](eager[0](x).transpose(1, 2)).transpose(1, 2)))
    torch.manual_seed(0)
    model = deferred_init(_normed)
    with deferred(model):
        out = model[3](model[2](model[1](model[0](x).transpose(1, 2)).transpose(1, 2)))
    assert torch.equal(materialize_tensor(out), eager_out)
    materialize_module(model)
    _assert_state_equal(model, eager)
    assert not torch.equal(eager[1].running_mean, torch.zeros(3))  # the forward did change them
    assert not torch.equal(eager[3].running_var, torch.ones(4))


class ProbesItsShape(nn.Module):
    """Runs a forward in its constructor (a common way to size a head), in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        features = self.body(torch.randn(2, 3, 8, 8)).flatten(1).shape[1]
        self.head = nn.Linear(features, 2)


def test_a_shape_probe_in_a_constructor_leaves_eagers_running_statistics(restore_rng) -> None:
    torch.manual_seed(0)
    eager = ProbesItsShape()
    torch.manual_seed(0)
    model = deferred_init(ProbesItsShape)
    materialize_module(model)
    _assert_state_equal(model, eager)
    assert eager.body[1].num_batches_tracked.item() == 1


def test_an_eval_mode_forward_writes_no_running_statistics(restore_rng) -> None:
    model = deferred_init(_normed).eval()
    graph = handle_of(model[1].running_mean).graph
    with deferred(model):
        model[1](torch.ones(4, 3))
    assert str(graph.ops[-1].func) == "aten.native_batch_norm.default"
    assert graph.ops[-1].writes == ()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 5)])
def test_the_recorded_batch_norm_kernel_gives_native_batch_norms_values(dtype, shape) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    weight, bias = torch.rand(3, dtype=dtype), torch.rand(3, dtype=dtype)
    mean, var = torch.rand(3, dtype=dtype), torch.rand(3, dtype=dtype) + 0.5
    stats = [(mean.clone(), var.clone()) for _ in range(2)]
    expected = torch.ops.aten.native_batch_norm.default(x, weight, bias, *stats[0], True, 0.1, 1e-5)
    got = torch.ops.aten._native_batch_norm_legit.default(x, weight, bias, *stats[1], True, 0.1, 1e-5)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert torch.equal(stats[0][0], stats[1][0]) and torch.equal(stats[0][1], stats[1][1])


def test_a_transposed_input_gives_the_kernels_contiguous_output_and_replays(restore_rng) -> None:
    # the fake kernel kept the input's strides; a matmul after it was then recorded as a view that
    # fails on eager's contiguous output
    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(5, 3), nn.BatchNorm1d(3))

    x = torch.arange(40.0).reshape(2, 4, 5) / 10
    torch.manual_seed(0)
    eager = build()
    eager_normed = eager[1](eager[0](x).transpose(1, 2))
    torch.manual_seed(0)
    model = deferred_init(build)
    with deferred(model):
        normed = model[1](model[0](x).transpose(1, 2))
        after = normed.transpose(1, 2) @ torch.ones(3, 2)
    assert normed.stride() == eager_normed.stride() == (12, 4, 1)
    assert torch.equal(materialize_tensor(after), eager_normed.transpose(1, 2) @ torch.ones(3, 2))
