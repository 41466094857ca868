"""A tensor tied across submodules, materialized or released from one side (note [Ties across a
partial materialization] in explorer/replay/materialize.py)."""

from __future__ import annotations

import torch
from safetensors.torch import save_file
from torch import nn

from explorer import deferred_init, is_fake, load_checkpoint, materialize_module, release_module


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_materializing_one_side_of_a_tie_fills_the_other_with_the_same_tensor(restore_rng):
    torch.manual_seed(0)
    eager = TiedLM()
    torch.manual_seed(0)
    model = deferred_init(TiedLM)
    materialize_module(model.head)
    assert model.embed.weight is model.head.weight and not is_fake(model.embed.weight)
    assert torch.equal(model.head.weight, eager.head.weight)
    assert is_fake(model.body.weight)  # only the tie crossed over


def test_releasing_one_side_of_a_tie_releases_the_other(restore_rng):
    model = deferred_init(TiedLM)
    fake = model.embed.weight
    materialize_module(model.head)
    release_module(model.head)
    assert model.head.weight is fake and model.embed.weight is fake


def test_one_side_of_a_tie_chosen_by_check_fn_keeps_the_tie_on_materializing_and_releasing(restore_rng):
    torch.manual_seed(0)
    eager = TiedLM()
    torch.manual_seed(0)
    model = deferred_init(TiedLM)
    fake = model.embed.weight
    materialize_module(model, check_fn=lambda module: module is model.head)  # as the notebook's selection does
    assert model.embed.weight is model.head.weight and torch.equal(model.head.weight, eager.head.weight)
    assert is_fake(model.body.weight)
    release_module(model, check_fn=lambda module: module is model.head)
    assert model.head.weight is fake and model.embed.weight is fake


def test_a_checkpoint_loaded_after_one_side_was_materialized_reaches_both(tmp_path, restore_rng):
    # before: the load went into the fake side only, and the real side kept its init values
    torch.manual_seed(3)
    source = TiedLM()
    save_file({k: v for k, v in source.state_dict().items() if k != "head.weight"}, str(tmp_path / "w.safetensors"))
    model = deferred_init(TiedLM)
    materialize_module(model.head)
    load_checkpoint(model, tmp_path / "w.safetensors")
    materialize_module(model)
    assert model.head.weight is model.embed.weight
    assert all(torch.equal(model.state_dict()[k], v) for k, v in source.state_dict().items())
