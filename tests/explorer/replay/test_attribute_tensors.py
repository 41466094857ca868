"""Tensors a module holds as plain attributes, not parameters or buffers (note [Tensors held as
attributes] in explorer/replay/materialize.py)."""

from __future__ import annotations

import torch
from torch import nn

from explorer import deferred_init, is_deferred, is_fake, materialize_module, release_module


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.scale = torch.randn(3)  # a plain attribute
        self.weight_alias = self.linear.weight  # the parameter again, under another attribute
        self.not_a_tensor = "kept as is"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


def test_a_tensor_held_as_an_attribute_materializes_with_the_module_to_eagers_value(restore_rng) -> None:
    torch.manual_seed(0)
    eager = Scaled()
    torch.manual_seed(0)
    model = deferred_init(Scaled)
    assert is_fake(model.scale)
    materialize_module(model)
    assert not is_deferred(model) and not is_fake(model.scale)
    assert torch.equal(model.scale, eager.scale)
    assert model.weight_alias is model.linear.weight and model.not_a_tensor == "kept as is"
    assert torch.equal(model(torch.ones(1, 3)), eager(torch.ones(1, 3)))


def test_buffers_only_leaves_attributes_deferred_and_the_module_still_deferred(restore_rng) -> None:
    model = deferred_init(Scaled)
    materialize_module(model, buffers_only=True)
    assert is_fake(model.scale) and is_deferred(model)


def test_released_attributes_get_their_fake_back_and_materialize_again_to_the_same_bytes(restore_rng) -> None:
    torch.manual_seed(0)
    model = deferred_init(Scaled)
    fake = model.scale
    first = materialize_module(model).scale.clone()
    release_module(model)
    assert model.scale is fake
    assert torch.equal(materialize_module(model).scale, first)
