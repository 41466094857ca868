"""PEFT adapters on a deferred model: added in `with deferred(model):`, they are recorded into the
model's graph like any surgery, and materializing gives what eager construction followed by
`get_peft_model` gives, bit for bit, for each adapter family and initialisation PEFT offers (random,
zeros, Gaussian, SVD-based PiSSA and QR-based OLoRA that read the base weights' values, DoRA's
magnitude read from them), and for `merge_and_unload()`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers

from explorer import deferred, deferred_init, is_deferred, is_fake, materialize_module
from tests.support.parity import assert_module_equals_eager

peft = pytest.importorskip("peft")

SEED = 0


def _config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )


ADAPTERS: dict[str, Callable[[], Any]] = {
    "lora": lambda: peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    "lora-gaussian-all-linear": lambda: peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights="gaussian"),
    "dora": lambda: peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], use_dora=True),
    "pissa": lambda: peft.LoraConfig(r=4, target_modules=["q_proj", "o_proj"], init_lora_weights="pissa"),
    "olora": lambda: peft.LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights="olora"),
    "ia3": lambda: peft.IA3Config(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]),
    "lokr": lambda: peft.LoKrConfig(r=4, target_modules=["q_proj", "v_proj"]),
    "loha": lambda: peft.LoHaConfig(r=4, target_modules=["q_proj", "v_proj"]),
}
# Adapters drawn from a generator of their own, seeded from the config (note [A constructor's own
# generators] in explorer/record/private_generators.py), where this PEFT release has them.
OWN_GENERATOR_ADAPTERS: dict[str, tuple[str, dict[str, Any]]] = {
    "vera": ("VeraConfig", {"r": 4, "projection_prng_key": 3}),
    "fourierft": ("FourierFTConfig", {"n_frequency": 16, "init_weights": False}),
    "randlora": ("RandLoraConfig", {"r": 4}),
    "shira": ("ShiraConfig", {"r": 2}),
    "waveft": ("WaveFTConfig", {"n_frequency": 16}),
    "tinylora": ("TinyLoraConfig", {}),
    "pvera": ("PveraConfig", {"r": 4}),
}
for _name, (_class, _options) in OWN_GENERATOR_ADAPTERS.items():
    if hasattr(peft, _class):
        ADAPTERS[_name] = lambda config=getattr(peft, _class), options=_options: config(
            target_modules=["q_proj", "v_proj"], **options
        )

# the prefixes of PEFT's adapter parameters
ADAPTER_NAMES = ("lora_", "ia3_", "lokr_", "hada_", *(f"{name}_" for name in OWN_GENERATOR_ADAPTERS))


def _deferred_with(adapter: Callable[[], Any], after: Callable[[Any], Any] = lambda m: m) -> Any:
    torch.manual_seed(SEED)
    model = deferred_init(transformers.LlamaForCausalLM, _config())
    with deferred(model):
        model = after(peft.get_peft_model(model, adapter()))
    return model


def _eager_with(adapter: Callable[[], Any], after: Callable[[Any], Any] = lambda m: m) -> Any:
    torch.manual_seed(SEED)
    return after(peft.get_peft_model(transformers.LlamaForCausalLM(_config()), adapter()))


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_an_adapter_added_in_a_deferred_block_materializes_bitwise_equal_to_eager(name: str):
    module = _deferred_with(ADAPTERS[name])
    adapter = {n: p for n, p in module.named_parameters() if any(k in n for k in ADAPTER_NAMES)}
    assert adapter, "the adapter added no parameters"
    assert [n for n, p in adapter.items() if not is_fake(p)] == [], "adapter parameters made for real"
    assert is_deferred(module)
    materialize_module(module)
    assert_module_equals_eager(name, module, _eager_with(ADAPTERS[name]))


def test_merge_and_unload_in_a_deferred_block_gives_eagers_merged_weights():
    def merge(model: Any) -> Any:
        return model.merge_and_unload()

    def random_b() -> Any:  # B is not zeroed, so merging changes the weights
        return peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)

    module = _deferred_with(random_b, merge)
    assert type(module) is transformers.LlamaForCausalLM
    materialize_module(module)
    eager = _eager_with(random_b, merge)
    assert not torch.equal(eager.model.layers[0].self_attn.q_proj.weight, _eager_base_q_proj())
    assert_module_equals_eager("merged", module, eager)


def _eager_base_q_proj() -> torch.Tensor:
    torch.manual_seed(SEED)
    return transformers.LlamaForCausalLM(_config()).model.layers[0].self_attn.q_proj.weight
