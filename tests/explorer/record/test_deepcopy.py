"""`copy.deepcopy` of fake tensors inside a constructor (as `nn.Transformer` clones its layers)."""

import copy

import pytest
import torch
from torch import nn

from explorer import deferred_init, is_deferred, materialize_module


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


def test_deepcopy_of_a_deferred_module_outside_deferred_init_says_to_materialize_first():
    module = deferred_init(nn.Linear, 2, 3)
    with pytest.raises(TypeError) as error:
        copy.deepcopy(module)
    assert str(error.value) == (
        "copy.deepcopy of parameter 'weight' (shape (3, 2), float32) works only inside the deferred_init "
        "that created it; "
        "materialize the module first (explorer.materialize_module), then copy it"
    )
