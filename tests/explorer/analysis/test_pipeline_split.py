"""The stage split: blocks evenly and in order, embedding on the first stage, norm and head on the last,
the chained stages computing the model's own logits; unsplittable models refused by name."""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from torch import nn

from explorer.analysis.pipeline_split import PipelineSplitError, StagePlan, plan_stages, split_stages
from tests.support.hf_configs import HF_BY_NAME


def _model(name: str, layers: int = 4) -> nn.Module:
    arch = HF_BY_NAME[name]
    config = arch.config()
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i % len(config.layer_types)] for i in range(layers)]
    torch.manual_seed(0)
    return arch.cls(config).eval()


def test_four_blocks_over_two_stages_go_in_order_embedding_first_head_last():
    assert plan_stages(_model("llama"), 2) == [
        StagePlan(0, 2, ("model.layers.0", "model.layers.1"), embedding=True, head=False),
        StagePlan(1, 2, ("model.layers.2", "model.layers.3"), embedding=False, head=True),
    ]


def test_a_middle_stage_owns_neither_embedding_nor_head_and_keeps_block_names():
    model = _model("llama")
    first, middle, last = (split_stages(model, 4, [i])[0] for i in (0, 1, 3))
    assert (first.embed_tokens is model.model.embed_tokens, first.norm, first.lm_head) == (True, None, None)
    assert (middle.embed_tokens, middle.norm, middle.lm_head) == (None, None, None)
    assert (last.embed_tokens, last.norm is model.model.norm, last.lm_head is model.lm_head) == (None, True, True)
    assert (
        list(dict(middle.named_parameters()))
        == [f"layers.1.{name}" for name, _ in model.model.layers[1].named_parameters()]
        and middle.layers["1"] is model.model.layers[1]
    )


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "gemma"])
def test_the_chained_stages_compute_the_models_logits(name):
    model = _model(name)
    ids = HF_BY_NAME[name].inputs()["input_ids"]
    with torch.no_grad():
        hidden = ids
        for stage in split_stages(model, 2):
            hidden = stage(hidden)
        assert torch.equal(hidden, model(ids).logits)


def test_stages_call_a_mask_function_by_transformers_4s_names(monkeypatch):
    # transformers 4.57's create_causal_mask(config, input_embeds, attention_mask, cache_position,
    # past_key_values, position_ids=None, ...): the stage passes what the signature names
    from transformers import masking_utils

    current = masking_utils.create_causal_mask
    seen: list[set[str]] = []

    def create_causal_mask_4(config, input_embeds, attention_mask, cache_position, past_key_values, position_ids=None):
        seen.append({"input_embeds", "cache_position", "past_key_values"})
        names = inspect.signature(current).parameters  # the installed release's own names
        passed = {"cache" if "cache" in names else "past_key_values": None}
        passed["input_embeds" if "input_embeds" in names else "inputs_embeds"] = input_embeds
        if "cache_position" in names:
            passed["cache_position"] = cache_position
        return current(config=config, attention_mask=attention_mask, position_ids=position_ids, **passed)

    monkeypatch.setattr(masking_utils, "create_causal_mask", create_causal_mask_4)
    model = _model("llama")
    ids = HF_BY_NAME["llama"].inputs()["input_ids"]
    with torch.no_grad():
        first, last = split_stages(model, 2)
        assert torch.equal(last(first(ids)), model(ids).logits)
    assert len(seen) == 2


def test_a_model_without_the_llama_layout_is_refused_naming_what_is_missing():
    message = (
        "no pipeline split for Sequential: it has no `model.embed_tokens` (a stage split is known for decoder-only "
        "transformers laid out as Llama: model.embed_tokens, model.layers, model.norm, model.rotary_emb, lm_head)"
    )
    with pytest.raises(PipelineSplitError, match=re.escape(message)):
        plan_stages(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), 2)


def test_a_transformers_release_without_mask_functions_is_refused_naming_it(monkeypatch):
    import sys

    import transformers

    model = _model("llama")
    monkeypatch.setitem(sys.modules, "transformers.masking_utils", None)  # as releases before it (4.46)
    message = (
        "no pipeline split for LlamaForCausalLM: stages build their attention masks with transformers.masking_utils, "
        f"which transformers {transformers.__version__} does not have (the Llama-layout models of releases before "
        "it build masks inside the model's forward); upgrade transformers, or plan layouts without pipeline stages "
        "(pp=1)"
    )
    assert [plan.blocks for plan in plan_stages(model, 2)] == [
        ("model.layers.0", "model.layers.1"),
        ("model.layers.2", "model.layers.3"),
    ]
    with pytest.raises(PipelineSplitError, match=re.escape(message)):
        split_stages(model, 2)


def test_blocks_not_divisible_by_the_stages_are_refused_with_both_counts():
    message = "LlamaForCausalLM has 4 blocks (model.layers), not divisible into 3 pipeline stages"
    with pytest.raises(PipelineSplitError, match=re.escape(message)):
        plan_stages(_model("llama"), 3)
