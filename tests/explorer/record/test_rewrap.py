"""`type(p)(data, requires_grad=..., **p.__dict__)`, the re-wrap idiom of accelerate and transformers 4,
on a deferred parameter means what it means on an eager one (note [Re-wrapping a deferred tensor]):
`nn.Parameter(data, requires_grad)`, with the fake's own state left out and a caller's attributes
passed on as eager passes them."""

from __future__ import annotations

import pytest
import torch
from accelerate import init_empty_weights
from accelerate.utils import set_module_tensor_to_device
from torch import nn

from explorer import deferred_init, is_deferred, is_fake, materialize_module
from tests.support.parity import assert_module_equals_eager


def _rewrap_parameters(module: nn.Module, device: str) -> None:
    """What accelerate's `init_empty_weights` does to each parameter a module registers."""
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                sub._parameters[name] = type(p)(p.to(device), requires_grad=p.requires_grad, **p.__dict__)


def _built() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    model[2].weight.requires_grad_(False)
    return model


def test_parameters_rewrapped_after_deferred_init_materialize_as_eager(restore_rng):
    torch.manual_seed(0)
    eager = _built()
    _rewrap_parameters(eager, "cpu")
    torch.manual_seed(0)
    module = deferred_init(_built)
    _rewrap_parameters(module, "cpu")
    assert is_deferred(module) and all(isinstance(p, nn.Parameter) and is_fake(p) for p in module.parameters())
    assert [p.requires_grad for p in module.parameters()] == [True, True, True, True, False, True]
    materialize_module(module)
    assert_module_equals_eager("rewrapped", module, eager)


def test_init_empty_weights_inside_deferred_init_gives_eagers_meta_parameters():
    def build() -> nn.Module:
        with init_empty_weights():
            return nn.Linear(4, 3)

    module = deferred_init(build)
    assert [(is_fake(p), p.device.type) for p in module.parameters()] == [(True, "meta"), (True, "meta")]
    materialize_module(module)
    eager = build()
    for got, want in zip(module.parameters(), eager.parameters(), strict=True):
        assert (type(got), got.device, got.shape, got.requires_grad) == (type(want), want.device, want.shape, True)


def test_set_module_tensor_to_device_puts_real_data_in_a_deferred_module(restore_rng):
    torch.manual_seed(0)
    module = deferred_init(nn.Linear, 4, 3)
    set_module_tensor_to_device(module, "weight", "cpu", value=torch.full((3, 4), 0.5))
    assert type(module.weight) is nn.Parameter and not is_fake(module.weight) and module.weight.requires_grad
    assert is_fake(module.bias)
    materialize_module(module)
    torch.manual_seed(0)
    eager = nn.Linear(4, 3)
    set_module_tensor_to_device(eager, "weight", "cpu", value=torch.full((3, 4), 0.5))
    assert_module_equals_eager("set_module_tensor_to_device", module, eager)


def test_an_attribute_nn_parameter_does_not_take_fails_as_it_fails_eagerly():
    deferred = deferred_init(nn.Linear, 4, 3).weight
    eager = nn.Linear(4, 3).weight
    for p in (deferred, eager):
        p.tp_axis = 0  # set by a library; nn.Parameter's constructor takes no such keyword
    errors = []
    for p in (deferred, eager):
        with pytest.raises(TypeError) as error:
            type(p)(p.detach(), requires_grad=True, **p.__dict__)
        errors.append(str(error.value))
    assert errors == ["Parameter.__new__() got an unexpected keyword argument 'tp_axis'"] * 2


def test_a_bare_call_of_the_deferred_class_says_which_readings_it_has():
    buffer = deferred_init(nn.BatchNorm1d, 3).running_mean
    with pytest.raises(TypeError) as error:
        type(buffer)(buffer)
    assert str(error.value) == (
        "type(t)(data) with t deferred and data of shape (3,), float32: deferred parameters and buffers share "
        "one class, so say which is meant: for a parameter pass requires_grad= (as nn.Parameter(data, "
        "requires_grad)); for a buffer's torch.Tensor(data), use data.view_as(data)"
    )


class QuantizedParameter(nn.Parameter):
    """Takes its attributes back as keywords, as bitsandbytes' `Params4bit` does for the re-wrap idiom."""

    def __new__(cls, data: torch.Tensor, requires_grad: bool = True, blocksize: int = 64) -> QuantizedParameter:
        parameter = super().__new__(cls, data, requires_grad)
        parameter.blocksize = blocksize
        return parameter


class Quantized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = QuantizedParameter(torch.ones(2, 2), blocksize=32)


def test_a_parameter_subclass_rewrapped_after_deferred_init_keeps_its_class_and_attributes():
    eager, module = Quantized(), deferred_init(Quantized)
    for owner in (eager, module):
        p = owner.w
        owner.w = type(p)(p.data * 2, requires_grad=False, **p.__dict__)  # accelerate's idiom
    materialize_module(module)
    assert type(module.w) is type(eager.w) is QuantizedParameter
    assert (module.w.blocksize, module.w.requires_grad) == (eager.w.blocksize, eager.w.requires_grad) == (32, False)
    assert torch.equal(module.w, eager.w)
