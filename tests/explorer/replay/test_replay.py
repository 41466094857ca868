"""Materialization: views, in-place ops, memoization, ties and partial orders."""

import copy

import pytest
import torch
from torch import nn

from explorer import deferred_init, is_deferred, materialize_module, materialize_tensor


class ViewsAndInplace(nn.Module):
    """The seed documents' example: an in-place op after a view reaches the view."""

    def __init__(self) -> None:
        super().__init__()
        a = torch.ones(2, 3)
        self.register_buffer("flat", a.view(-1))
        a.add_(2)
        self.register_buffer("base", a)
        self.register_buffer("row", a[1])


def test_later_inplace_reaches_earlier_view():
    module = deferred_init(ViewsAndInplace)
    flat = materialize_tensor(module.flat)
    assert torch.equal(flat, torch.full((6,), 3.0))


def test_materialized_view_shares_storage_with_base_in_any_order():
    module = deferred_init(ViewsAndInplace)
    row = materialize_tensor(module.row)
    base = materialize_tensor(module.base)
    flat = materialize_tensor(module.flat)
    assert row.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert flat.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert row.storage_offset() == 3 and row.stride() == (1,)
    base.mul_(2)  # they really are one memory
    assert torch.equal(flat, torch.full((6,), 6.0)) and torch.equal(row, torch.full((3,), 6.0))


def test_materialize_tensor_is_memoized_for_the_same_fake():
    module = deferred_init(nn.Linear, 3, 2)
    first = materialize_tensor(module.weight)
    assert materialize_tensor(module.weight) is first
    module.weight = first
    assert materialize_tensor(module.weight) is first  # a real tensor passes through


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_tied_parameters_stay_one_object():
    torch.manual_seed(0)
    eager = Tied()
    torch.manual_seed(0)
    module = materialize_module(deferred_init(Tied))
    assert module.head.weight is module.embed.weight
    assert isinstance(module.head.weight, nn.Parameter)
    assert torch.equal(module.embed.weight, eager.embed.weight)


def test_tied_parameters_stay_one_object_when_materialized_separately():
    module = deferred_init(Tied)
    materialize_module(module.head)
    materialize_module(module.embed)
    assert module.head.weight is module.embed.weight


def test_materialized_parameter_keeps_kind_and_requires_grad():
    class Frozen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(2), requires_grad=False)
            self.register_buffer("b", torch.zeros(2))

    module = materialize_module(deferred_init(Frozen))
    assert type(module.w) is nn.Parameter and module.w.requires_grad is False
    assert type(module.b) is torch.Tensor


class Tagged(nn.Module):
    """Attributes set on tensors, as Mamba's `A_log._no_weight_decay` and parallel libraries' tags."""

    def __init__(self) -> None:
        super().__init__()
        self.decay_free = nn.Parameter(torch.ones(3))
        self.decay_free._no_weight_decay = True
        self.linear = nn.Linear(2, 2)
        self.linear.weight.owner = self.linear  # an object, kept by reference
        self.register_buffer("mask", torch.zeros(2))
        self.mask.tag = ["kept"]


def _tags(module: nn.Module) -> list:
    return [
        module.decay_free._no_weight_decay,
        module.linear.weight.owner is module.linear,
        module.mask.tag,
        sorted(vars(module.linear.bias)),
    ]


def test_materialized_tensors_keep_attributes_set_on_them_as_eager():
    eager = Tagged()
    module = deferred_init(Tagged)
    materialize_tensor(module.mask)  # one tensor alone, then the rest
    materialize_module(module)
    assert _tags(module) == _tags(eager) == [True, True, ["kept"], []]
    assert module.mask.tag is not eager.mask.tag  # each construction makes its own list


def _halve_the_gradient(parameter: nn.Parameter) -> None:
    parameter.grad.mul_(0.5)


class GradientMasked(nn.Module):
    """Gradient hooks registered in a constructor: rows of an embedding kept frozen by a mask, and a
    step after each gradient is accumulated."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(4, 2)
        self.register_buffer("mask", torch.tensor([[0.0], [1.0], [1.0], [1.0]]))
        self.emb.weight.register_hook(lambda grad: grad * self.mask)
        self.lin = nn.Linear(2, 2)
        self.lin.weight.register_post_accumulate_grad_hook(_halve_the_gradient)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.lin(self.emb(idx)).sum()


@pytest.mark.parametrize("order", ["whole", "one tensor, then the rest"])
def test_gradient_hooks_registered_in_the_constructor_act_on_the_materialized_parameters(order):
    torch.manual_seed(0)
    eager = GradientMasked()
    torch.manual_seed(0)
    module = deferred_init(GradientMasked)
    if order != "whole":
        materialize_tensor(module.lin.weight)
    materialize_module(module)
    idx = torch.tensor([0, 1, 2])
    eager(idx).backward()
    module(idx).backward()
    assert module.emb.weight.grad[0].tolist() == [0.0, 0.0]  # the masked row
    for name, parameter in eager.named_parameters():
        assert torch.equal(module.get_parameter(name).grad, parameter.grad), name


class ScaledParameter(nn.Parameter):
    """A parameter subclass with its own `__new__` and an attribute, as quantization libraries have."""

    def __new__(cls, data: torch.Tensor, scale: float = 1.0) -> "ScaledParameter":
        parameter = super().__new__(cls, data)
        parameter.scale = scale
        return parameter


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = ScaledParameter(torch.ones(2), scale=3.0)
        self.frozen = ScaledParameter(torch.zeros(1))
        self.frozen.requires_grad_(False)
        self.linear = nn.Linear(2, 2)


def _kinds(module: nn.Module) -> list:
    return [
        (type(module.w), module.w.scale, module.w.requires_grad),
        (type(module.frozen), module.frozen.requires_grad),
    ]


def test_a_parameter_subclass_materializes_as_its_class_and_so_does_a_deepcopy():
    eager = Scaled()
    module = deferred_init(Scaled)
    copied = copy.deepcopy(module)
    materialize_module(module)
    materialize_module(copied)
    want = [(ScaledParameter, 3.0, True), (ScaledParameter, False)]
    assert _kinds(module) == _kinds(eager) == want
    assert type(module.linear.weight) is nn.Parameter
    assert type(copied.w) is type(copy.deepcopy(eager).w) is ScaledParameter


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.norm = nn.BatchNorm1d(3)
        self.b = nn.Linear(3, 2)


def test_buffers_only_leaves_parameters_fake():
    module = materialize_module(deferred_init(Stack), buffers_only=True)
    assert not is_deferred(module.norm.running_mean)
    assert is_deferred(module.a.weight) and is_deferred(module.norm.weight)


def test_check_fn_chooses_submodules():
    module = materialize_module(deferred_init(Stack), check_fn=lambda m: isinstance(m, nn.Linear))
    assert not is_deferred(module.a) and not is_deferred(module.b)
    assert is_deferred(module.norm)


def test_materialize_module_returns_the_module_for_chaining():
    module = deferred_init(Stack)
    assert materialize_module(module) is module
    assert not is_deferred(module)


class _GramInit(nn.Module):
    """A parameter made by a matmul, which autocast would run in bfloat16."""

    def __init__(self) -> None:
        super().__init__()
        w = torch.randn(4, 4)
        self.p = nn.Parameter(w @ w.t())
        self.register_buffer("projected", torch.nn.functional.linear(torch.randn(2, 4), w))


def test_materializing_under_the_callers_autocast_gives_eagers_dtypes_and_values():
    torch.manual_seed(0)
    eager = _GramInit()
    torch.manual_seed(0)
    model = deferred_init(_GramInit)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        materialize_module(model)
        assert torch.is_autocast_enabled("cpu")  # the caller's autocast is back after materializing
    for name, tensor in eager.state_dict().items():
        assert model.state_dict()[name].dtype == torch.float32, name
        assert torch.equal(model.state_dict()[name], tensor), name


def test_tensors_made_on_meta_are_made_again_when_asked_for_on_a_device():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    torch.manual_seed(0)
    model = deferred_init(lambda: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
    materialize_module(model, device="meta")  # shapes only
    assert model[0].weight.is_meta and not is_deferred(model)
    materialize_module(model[1])  # where it was recorded: the cpu
    assert model[0].weight.is_meta and model[1].weight.device.type == "cpu"
    materialize_module(model, device="cpu")
    for name, tensor in eager.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert isinstance(model[0].weight, nn.Parameter) and model[0].weight.requires_grad
    materialize_module(model, device="meta")  # what is made stays made
    assert model[0].weight.device.type == "cpu"


class _ComplexHeld(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attribute = torch.randn(3, dtype=torch.complex64, requires_grad=True)
        self.register_buffer("buffer", torch.randn(3, dtype=torch.complex64).requires_grad_())


def test_complex_tensors_that_require_grad_keep_it_as_buffers_and_attributes():
    torch.manual_seed(0)
    eager = _ComplexHeld()
    torch.manual_seed(0)
    model = materialize_module(deferred_init(_ComplexHeld))
    for name in ("attribute", "buffer"):
        real, expected = getattr(model, name), getattr(eager, name)
        assert (real.dtype, real.requires_grad, real.is_leaf) == (torch.complex64, True, True), name
        assert torch.equal(real.detach(), expected.detach()), name


class _ConjugateViews(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        a = torch.randn(4, dtype=torch.complex64)
        self.first = nn.Module()
        self.first.register_buffer("a", a)
        self.second = nn.Module()
        self.second.register_buffer("conj_view", a.conj())
        self.second.register_buffer("scaled", a.conj() * 2)
        self.second.register_buffer("hfft", torch.fft.hfft(a, n=6))
        self.second.register_buffer("negative", torch._neg_view(a.real))


@pytest.mark.parametrize("base_first", [True, False])
def test_conjugate_and_negative_views_of_a_base_made_earlier_keep_their_bit(base_first):
    torch.manual_seed(0)
    eager = _ConjugateViews()
    torch.manual_seed(0)
    model = deferred_init(_ConjugateViews)
    if base_first:
        materialize_module(model.first)
    materialize_module(model.second, device="cpu")
    for name in ("conj_view", "scaled", "hfft", "negative"):
        real, expected = getattr(model.second, name), getattr(eager.second, name)
        assert (real.is_conj(), real.is_neg()) == (expected.is_conj(), expected.is_neg()), name
        assert torch.equal(real.resolve_conj().resolve_neg(), expected.resolve_conj().resolve_neg()), name


def test_a_materialized_model_converts_by_swapping_tensors_as_an_eager_one_does():
    torch.manual_seed(0)
    eager = nn.Linear(4, 4)
    torch.manual_seed(0)
    model = materialize_module(deferred_init(nn.Linear, 4, 4))
    weight = model.weight
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        eager.half()
        model.half()
        model.load_state_dict(eager.state_dict())
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert model.weight is weight and weight.dtype == torch.float16  # swapped in place: the same object
    assert torch.equal(model.weight, eager.weight) and torch.equal(model.bias, eager.bias)
    assert materialize_tensor(weight) is weight
