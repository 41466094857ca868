"""diffusers parity: tiny UNets, autoencoders and DiT-style transformers, deferred then materialized,
equal eager construction bit for bit (values, layout, Parameter-ness, ties), and neither step moves
the global RNG."""

from __future__ import annotations

import pytest
import torch

from explorer import deferred_init, is_deferred, materialize_module
from tests.support.diffusers_configs import DIFFUSERS_MODELS, DiffusersModel
from tests.support.parity import assert_module_equals_eager

pytest.importorskip("diffusers")

SEED = 0


@pytest.mark.parametrize("model", DIFFUSERS_MODELS, ids=[m.name for m in DIFFUSERS_MODELS])
def test_diffusers_model_materializes_bitwise_equal_to_eager(model: DiffusersModel):
    torch.manual_seed(SEED)
    eager = model.build()
    torch.manual_seed(SEED)
    before = torch.get_rng_state()
    module = deferred_init(model.build)
    assert torch.equal(torch.get_rng_state(), before), "deferred_init advanced the global RNG"
    assert is_deferred(module)
    torch.manual_seed(99)
    before = torch.get_rng_state()
    materialize_module(module)
    assert torch.equal(torch.get_rng_state(), before), "materialize_module advanced the global RNG"
    assert_module_equals_eager(model.name, module, eager)


def test_sample_spans_unets_autoencoders_and_transformers():
    names = {m.name for m in DIFFUSERS_MODELS}
    assert len(names) >= 10
    assert {"UNet2DConditionModel", "AutoencoderKL", "FluxTransformer2DModel", "SD3Transformer2DModel"} <= names
