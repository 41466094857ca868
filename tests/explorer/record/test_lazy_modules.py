"""Lazy modules whose shapes come from a dry-run call inside module_fn."""

import pytest
import torch
from torch import nn

from explorer import MaterializationError, deferred_init, is_deferred, materialize_module


def build_lazy() -> nn.Module:
    module = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2))
    module(torch.randn(3, 5))  # dry run: infers in_features
    return module


def test_lazy_linear_with_dry_run_matches_eager():
    torch.manual_seed(0)
    eager = build_lazy()
    torch.manual_seed(0)
    module = deferred_init(build_lazy)
    assert type(module[0]) is nn.Linear and module[0].weight.shape == (4, 5)
    assert is_deferred(module[0].weight) and isinstance(module[0].weight, nn.Parameter)
    materialize_module(module)
    for name, value in eager.state_dict().items():
        assert torch.equal(module.state_dict()[name], value), name
    assert type(module[0].weight) is nn.Parameter


def test_lazy_module_without_dry_run_names_the_uninitialized_parameter():
    module = deferred_init(nn.LazyLinear, 4)
    with pytest.raises(MaterializationError, match=r"'weight' is an uninitialized lazy parameter"):
        materialize_module(module)


def test_uninitialized_parameter_is_restored_after_deferred_init():
    deferred_init(build_lazy)
    param = nn.parameter.UninitializedParameter()
    assert type(param) is nn.parameter.UninitializedParameter


def build_lazy_conv() -> nn.Module:
    module = nn.LazyConv2d(4, 3)  # shaping asserts isinstance(self.weight, UninitializedParameter)
    module(torch.randn(1, 2, 5, 5))
    return module


def test_lazy_conv_with_dry_run_matches_eager():
    torch.manual_seed(0)
    eager = build_lazy_conv()
    torch.manual_seed(0)
    module = materialize_module(deferred_init(build_lazy_conv))
    assert type(module) is nn.Conv2d and module.weight.shape == (4, 2, 3, 3)
    for name, value in eager.state_dict().items():
        assert torch.equal(module.state_dict()[name], value), name


def test_uninitialized_fakes_are_instances_of_the_torch_uninitialized_classes():
    seen = {}

    def build() -> nn.Module:
        module = nn.LazyBatchNorm1d()
        seen["weight"], seen["running_mean"] = module.weight, module.running_mean
        return module

    deferred_init(build)
    assert isinstance(seen["weight"], nn.parameter.UninitializedParameter)
    assert isinstance(seen["running_mean"], nn.parameter.UninitializedBuffer)
    assert not isinstance(seen["running_mean"], nn.Parameter)


def _linear_then_lazy() -> nn.Module:
    return nn.Sequential(nn.Linear(7, 7), nn.LazyLinear(5), nn.LazyBatchNorm1d())


def test_a_forward_after_deferred_init_shapes_lazy_modules_in_the_recording(restore_rng):
    # before: the lazy parameter was shaped with a real tensor, refused as a `.data = real` set by the user
    torch.manual_seed(0)
    eager = _linear_then_lazy()
    x = torch.arange(14.0).reshape(2, 7)
    eager_out = eager(x)
    torch.manual_seed(0)
    module = deferred_init(_linear_then_lazy)
    out = module(x)  # recorded, as calling a deferred model is
    assert type(module[1]) is nn.Linear and module[1].weight.shape == (5, 7) and is_deferred(module[1].weight)
    assert type(module[2]) is nn.BatchNorm1d and is_deferred(module[2].running_mean)
    from explorer import materialize_tensor

    assert torch.equal(materialize_tensor(out), eager_out)
    materialize_module(module)
    assert list(module.state_dict()) == list(eager.state_dict())
    assert [n for n, v in eager.state_dict().items() if not torch.equal(module.state_dict()[n], v)] == []
    assert type(module[1].weight) is nn.Parameter
