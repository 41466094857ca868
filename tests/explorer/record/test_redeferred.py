"""A materialized tensor given a deferred tensor's data inside `with deferred(model):` (note
[A materialized tensor given deferred data] in explorer/record/redeferred.py)."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

from explorer import DeferredInitError, deferred, deferred_init, is_deferred, materialize_module, release_module


def _assert_state_equal(got: nn.Module, want: nn.Module) -> None:
    got_state, want_state = got.state_dict(), want.state_dict()
    assert list(got_state) == list(want_state)
    assert [name for name in want_state if not torch.equal(got_state[name], want_state[name])] == []


def _two_linears() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


def test_a_materialized_parameter_given_deferred_data_is_deferred_again_and_materializes_to_eager(restore_rng):
    torch.manual_seed(0)
    eager = _two_linears()
    eager[0].weight.requires_grad_(False)
    eager[0].weight.no_decay = True
    replacement = nn.Linear(4, 4)
    eager[0].weight.data = replacement.weight.data
    torch.manual_seed(0)
    model = deferred_init(_two_linears)
    materialize_module(model[0])
    model[0].weight.requires_grad_(False)
    model[0].weight.no_decay = True
    with deferred(model):
        replacement = nn.Linear(4, 4)
        model[0].weight.data = replacement.weight.data
    weight = model[0].weight
    assert is_deferred(weight) and isinstance(weight, nn.Parameter)
    assert (weight.requires_grad, weight.no_decay, weight.device) == (False, True, torch.device("cpu"))
    materialize_module(model)
    _assert_state_equal(model, eager)
    assert (model[0].weight.requires_grad, model[0].weight.no_decay) == (False, True)
    assert torch.equal(model(torch.ones(1, 4)), eager(torch.ones(1, 4)))


def test_a_tied_parameter_given_deferred_data_stays_tied(restore_rng):
    def tied() -> nn.Module:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
        model[1].weight = model[0].weight
        return model

    torch.manual_seed(0)
    eager = tied()
    eager[0].weight.data = torch.full((4, 4), 0.5)
    torch.manual_seed(0)
    model = deferred_init(tied)
    materialize_module(model[0])
    materialize_module(model[1])  # model[2] stays deferred
    assert model[0].weight is model[1].weight
    with deferred(model):
        model[0].weight.data = torch.full((4, 4), 0.5)
    assert model[0].weight is model[1].weight and is_deferred(model[1].weight)
    materialize_module(model)
    assert model[0].weight is model[1].weight
    _assert_state_equal(model, eager)


@pytest.mark.parametrize("tie", [True, False])
def test_resizing_token_embeddings_after_materializing_them_matches_eager(tie: bool, restore_rng):
    def config() -> transformers.LlamaConfig:  # resize_token_embeddings changes its config
        return transformers.LlamaConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=tie,
        )  # fmt: skip

    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(config())
    eager.resize_token_embeddings(130, mean_resizing=False)
    torch.manual_seed(0)
    model = deferred_init(transformers.LlamaForCausalLM, config())
    materialize_module(model.model.embed_tokens)
    with deferred(model):
        model.resize_token_embeddings(130, mean_resizing=False)
    assert is_deferred(model.model.embed_tokens.weight)
    materialize_module(model)
    _assert_state_equal(model, eager)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    ids = torch.tensor([[1, 2, 129]])
    assert torch.equal(model(ids).logits, eager(ids).logits)


def test_writing_deferred_values_into_a_materialized_tensor_names_it_and_the_way_out(restore_rng):
    model = deferred_init(_two_linears)
    materialize_module(model[0])
    with pytest.raises(DeferredInitError) as caught, deferred(model), torch.no_grad():
        model[0].weight[:2] = nn.Linear(4, 4).weight[:2]
    assert str(caught.value).startswith(
        "aten.copy_.default writes values of a deferred model into '0.weight' (float32[2, 4] on cpu) at "
    )
    assert str(caught.value).endswith(
        "which was materialized before this block: it holds real values and the written ones are not made "
        "yet, so the write cannot be deferred. Release it before the block (explorer.release_module(model[0])), "
        "which makes it deferred again and lets the block record the write, or materialize what the write "
        "reads first"
    )


def test_released_first_the_same_write_is_recorded_and_matches_eager(restore_rng):
    torch.manual_seed(0)
    eager = _two_linears()
    with torch.no_grad():
        eager[0].weight[:2] = nn.Linear(4, 4).weight[:2]
    torch.manual_seed(0)
    model = deferred_init(_two_linears)
    materialize_module(model[0])
    release_module(model[0])
    with deferred(model), torch.no_grad():
        model[0].weight[:2] = nn.Linear(4, 4).weight[:2]
    materialize_module(model)
    _assert_state_equal(model, eager)


def test_a_materialized_parameter_given_deferred_data_outside_a_block_materializes_to_eagers_values():
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    def build() -> nn.Sequential:
        return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))

    torch.manual_seed(0)
    eager = build()
    vector_to_parameters(parameters_to_vector(eager.parameters()) * 2, eager.parameters())
    torch.manual_seed(0)
    model = deferred_init(build)
    materialize_module(model[0])
    vector_to_parameters(parameters_to_vector(model.parameters()) * 2, model.parameters())
    materialize_module(model)
    for name, tensor in eager.state_dict().items():
        assert model.state_dict()[name].device.type == "cpu", name
        assert torch.equal(model.state_dict()[name], tensor), name
    assert model(torch.ones(1, 4)).shape == (1, 2)


def test_a_tensor_made_real_after_deferred_init_and_given_deferred_data_materializes_to_eagers_values():
    # PEFT's PiSSA init outside a block: adapters made real, then given data computed from the base
    torch.manual_seed(0)
    eager = nn.Linear(4, 4)
    eager.extra = nn.Linear(4, 4)
    eager.extra.weight.data = eager.weight.data * 2
    torch.manual_seed(0)
    model = deferred_init(nn.Linear, 4, 4)
    torch.manual_seed(0)
    model.extra = nn.Linear(4, 4)  # real: made outside any block
    model.extra.weight.data = model.weight.data * 2  # now on the fake's meta storage
    materialize_module(model)
    assert model.extra.weight.device.type == "cpu" and not is_deferred(model)
    assert torch.equal(model.extra.weight, model.weight * 2) and torch.equal(model.weight, eager.weight)


def test_a_materialization_refused_for_its_arguments_leaves_a_tensor_given_deferred_data_as_it_was():
    from explorer import MaterializationError, inspect

    model = deferred_init(_two_linears)
    materialize_module(model[0])
    model[0].weight.data = model[1].weight.data  # deferred again only by a materialization that runs
    held, ops = model[0].weight, len(inspect(model).ops)
    with pytest.raises(MaterializationError, match="unknown device 'nodevice'"):
        materialize_module(model, device="nodevice")
    assert model[0].weight is held and len(inspect(model).ops) == ops
