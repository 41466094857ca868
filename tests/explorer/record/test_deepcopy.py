"""`copy.deepcopy` of fake tensors inside a constructor (as `nn.Transformer` clones its layers) and
after deferred_init (an EMA or teacher copy of a deferred model)."""

import copy

import pytest
import torch
from torch import nn

from explorer import deferred, deferred_init, is_deferred, materialize_module


class Clones(nn.Module):
    """Clones a layer the way `nn.Transformer` does, plus buffers that are views of one storage."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.Linear(3, 4)
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(2)])
        with torch.no_grad():
            self.layers[1].weight.mul_(2)  # a copy is independent of its source and its sibling
        holder = nn.Module()
        base = torch.arange(6.0)
        holder.register_buffer("head", base[:2])
        holder.register_buffer("tail", base[2:].view(2, 2))
        holder.tail.tag = "kept"
        self.holder = copy.deepcopy(holder)


def test_deepcopy_inside_constructor_matches_eager_values_and_layout():
    torch.manual_seed(0)
    eager = Clones()
    torch.manual_seed(0)
    module = materialize_module(deferred_init(Clones))
    for (name, want), (_, got) in zip(eager.state_dict().items(), module.state_dict().items()):
        assert torch.equal(got, want), name
        assert (got.stride(), got.storage_offset()) == (want.stride(), want.storage_offset()), name
    assert type(module.layers[0].weight) is nn.Parameter
    first, second = (layer.weight.untyped_storage().data_ptr() for layer in module.layers)
    assert first != second
    assert module.holder.tail.storage_offset() == 2
    # views copied in one deepcopy share one storage, as eager's Tensor.__deepcopy__ keeps them
    assert module.holder.head.untyped_storage().data_ptr() == module.holder.tail.untyped_storage().data_ptr()
    assert torch.equal(module.holder.tail, torch.tensor([[2.0, 3.0], [4.0, 5.0]]))


def test_deepcopy_keeps_buffer_attributes_and_parameter_kind_while_recording():
    seen = {}

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            buffer = torch.zeros(2)
            buffer.tag = "kept"
            param = nn.Parameter(torch.ones(2), requires_grad=False)
            seen["buffer"], seen["param"] = copy.deepcopy(buffer), copy.deepcopy(param)
            self.register_buffer("b", seen["buffer"])
            self.p = seen["param"]

    module = deferred_init(Probe)
    assert seen["buffer"].tag == "kept"
    assert isinstance(seen["param"], nn.Parameter) and not seen["param"].requires_grad
    assert is_deferred(module.b) and is_deferred(module.p)
    materialize_module(module)
    assert torch.equal(module.b, torch.zeros(2)) and torch.equal(module.p, torch.ones(2))


class Shared(nn.Module):
    """A tie, two buffers viewing one storage, and a parameter's own attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 3), nn.Linear(4, 3)
        self.second.weight = self.first.weight
        base = torch.randn(7)
        self.register_buffer("head", base[:2])
        self.register_buffer("tail", base[3:].view(2, 2))
        self.first.bias.tag = "dropped"  # nn.Parameter.__deepcopy__ does not copy attributes
        self.tail.tag = ["copied"]  # Tensor.__deepcopy__ does


def test_deepcopy_after_deferred_init_materializes_to_the_eager_copy():
    torch.manual_seed(0)
    eager = Shared()
    eager_copy = copy.deepcopy(eager)
    nn.init.zeros_(eager.first.weight)  # a change after the copy reaches the source only
    torch.manual_seed(0)
    module = deferred_init(Shared)
    copied = copy.deepcopy(module)
    nn.init.zeros_(module.first.weight)
    assert is_deferred(copied.first.weight) and copied.second.weight is copied.first.weight
    materialize_module(copied)
    materialize_module(module)
    for want_module, got_module in ((eager_copy, copied), (eager, module)):
        for (name, want), (_, got) in zip(want_module.state_dict().items(), got_module.state_dict().items()):
            assert torch.equal(got, want), name
            assert (got.stride(), got.storage_offset()) == (want.stride(), want.storage_offset()), name
    assert type(copied.first.weight) is nn.Parameter and copied.second.weight is copied.first.weight
    assert not hasattr(eager_copy.first.bias, "tag") and not hasattr(copied.first.bias, "tag")
    assert copied.tail.tag == eager_copy.tail.tag == ["copied"] and copied.tail.tag is not module.tail.tag
    assert copied.head.untyped_storage().data_ptr() == copied.tail.untyped_storage().data_ptr()
    assert copied.head.untyped_storage().nbytes() == 28
    assert copied.first.weight.untyped_storage().data_ptr() != module.first.weight.untyped_storage().data_ptr()


def test_deepcopy_of_a_deferred_transformers_model_equals_the_eager_copy():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=64
    )
    torch.manual_seed(0)
    want = copy.deepcopy(LlamaForCausalLM(config)).state_dict()
    torch.manual_seed(0)
    teacher = copy.deepcopy(deferred_init(LlamaForCausalLM, config)).eval().requires_grad_(False)
    got = materialize_module(teacher).state_dict()
    assert list(got) == list(want)
    assert [name for name in want if not torch.equal(got[name], want[name])] == []
    assert not any(parameter.requires_grad for parameter in teacher.parameters())


def test_deepcopy_inside_another_recording_is_refused_naming_the_tensor():
    module = deferred_init(nn.Linear, 2, 3)
    with pytest.raises(TypeError) as error, deferred():
        copy.deepcopy(module)
    assert str(error.value) == (
        "copy.deepcopy of parameter 'weight' (shape (3, 2), float32): it belongs to another deferred "
        "recording than the one running here; copy it outside this block"
    )


def test_deepcopy_of_a_fake_from_a_failed_recording_is_refused():
    kept = []

    def build() -> nn.Module:
        kept.append(torch.ones(2, 3))
        raise ValueError("constructor failed")

    with pytest.raises(ValueError, match="constructor failed"):  # the constructor's own error
        deferred_init(build)
    with pytest.raises(TypeError) as error:
        copy.deepcopy(kept[0])
    assert str(error.value) == (
        "copy.deepcopy of a deferred tensor (shape (2, 3), float32): its recording is still running (or "
        "failed); copy it once deferred_init has returned"
    )


def test_a_dtype_view_copied_with_its_base_shares_the_copys_memory_as_eagers():
    class DtypeViews(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.arange(12.0).view(3, 4))
            self.register_buffer("column", self.table[:, 1])
            self.register_buffer("bits", self.table.view(torch.int32))

    eager = copy.deepcopy(DtypeViews())
    module = materialize_module(copy.deepcopy(deferred_init(DtypeViews)))
    assert module.bits.untyped_storage().data_ptr() == module.table.untyped_storage().data_ptr()
    assert module.column.untyped_storage().data_ptr() == module.table.untyped_storage().data_ptr()
    assert [torch.equal(module.get_buffer(n), eager.get_buffer(n)) for n in ("table", "column", "bits")] == [True] * 3
    module.table.fill_(1.0)
    assert module.bits[0, 0].item() == 1065353216  # the bits of 1.0, through the shared memory
