"""explorer.naming: the one home for module paths, dtype names and byte sizes and spans."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

import explorer
from explorer.naming import (
    ModuleGroup,
    byte_span,
    common_module,
    dtype_name,
    dtype_named,
    group_prefix,
    module_groups,
    short_path,
)

SHORT_PATH_SPEC = json.loads((pathlib.Path(__file__).parents[1] / "support" / "short_path_cases.json").read_text())


def test_byte_span_is_from_the_first_element_to_the_end_of_the_last():
    base = torch.zeros(4, 6, dtype=torch.float64)  # 192 bytes
    spans = {
        label: byte_span(view.shape, view.stride(), view.storage_offset(), view.element_size())
        for label, view in {
            "row": base[1],
            "column": base[:, 2],
            "transposed": base.t(),
            "every other of two rows": base[1:3, ::2],
            "element": base[2, 3],
            "empty": base[4:],
        }.items()
    }
    assert spans == {
        "row": (48, 96),
        "column": (16, 168),  # elements 2, 8, 14, 20: the gaps between them count
        "transposed": (0, 192),
        "every other of two rows": (48, 136),  # elements 6 ... 16
        "element": (120, 128),
        "empty": (192, 192),  # reaches nothing, starts at its offset
    }


def test_byte_span_of_a_real_view_starts_at_its_data_pointer():
    base = torch.arange(30, dtype=torch.int16)
    view = base[3:].as_strided((3, 2), (5, 2), 7)
    start, end = byte_span(view.shape, view.stride(), view.storage_offset(), view.element_size())
    assert start == view.data_ptr() - base.data_ptr() == 14
    assert end == view[-1, -1].data_ptr() + 2 - base.data_ptr() == (7 + 10 + 2 + 1) * 2


def test_dtype_named_inverts_dtype_name_and_names_a_wrong_string():
    for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.bool, torch.complex64, torch.float8_e4m3fn):
        assert dtype_named(dtype_name(dtype)) is dtype
    with pytest.raises(ValueError, match=r"^'Tensor' is not a torch dtype name \(as `dtype_name` spells them"):
        dtype_named("Tensor")
    with pytest.raises(ValueError, match=r"^'float33' is not a torch dtype name"):
        dtype_named("float33")


def test_common_module_is_the_innermost_path_holding_all():
    assert common_module(["layers.1.attn", "layers.1.mlp"]) == "layers.1"
    assert common_module(["layers.1", "layers.10"]) == "layers"  # by component, not by character
    assert common_module(["layers.1.attn", ""]) == ""
    assert common_module(["head"]) == "head"


@pytest.mark.parametrize(
    "case", SHORT_PATH_SPEC["cases"], ids=lambda case: f"{case['name'] or 'empty'}@{case['width']}"
)
def test_short_path_gives_the_short_name_of_the_shared_spec(case):
    assert short_path(case["name"], case["width"]) == case["short"]


def test_short_path_of_24_layers_at_a_narrow_width_are_distinct_and_each_shows_its_index():
    shorts = [short_path(f"model.layers.{i}.self_attn.q_proj.weight", 18) for i in range(24)]
    assert shorts[:3] == ["…0.…q_proj.weight", "…1.…q_proj.weight", "…2.…q_proj.weight"]
    assert shorts[17] == "…17.…q_proj.weight"
    assert len(set(shorts)) == 24
    assert all(short.startswith(f"…{i}.") for i, short in enumerate(shorts))


def test_short_path_keeps_every_index_however_narrow():
    assert short_path("blocks.3.experts.12.w1.weight", 1) == "…3.…12.…weight"


def test_short_path_returns_a_name_that_fits_unchanged():
    name = "model.layers.17.self_attn.q_proj.weight"
    assert [short_path(name, width) for width in (39, 80)] == [name, name]


def test_group_prefix_is_the_module_holding_the_tensors_module():
    assert group_prefix("model.layers.3.self_attn.q_proj.weight") == "model.layers.3.self_attn"
    assert group_prefix("blocks.0.mlp.2.bias") == "blocks.0.mlp"
    assert (group_prefix("embed.weight"), group_prefix("positions")) == ("", "")


def test_module_groups_of_a_2_layer_llama_are_its_attention_mlp_and_norm_runs():
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    names = [name for name, _ in explorer.deferred_init(transformers.LlamaForCausalLM, config).named_parameters()]
    assert module_groups(names) == [
        ("model.layers.0.self_attn", 1, 5),  # q_proj k_proj v_proj o_proj .weight
        ("model.layers.0.mlp", 5, 8),  # gate_proj up_proj down_proj .weight
        ("model.layers.0", 8, 10),  # input_layernorm post_attention_layernorm .weight
        ("model.layers.1.self_attn", 10, 14),
        ("model.layers.1.mlp", 14, 17),
        ("model.layers.1", 17, 19),
    ]  # embed_tokens, norm (under "model" but apart) and lm_head (the root) stand alone
    assert (names[0], names[19], names[20]) == ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
    assert all(isinstance(group, ModuleGroup) for group in module_groups(names))


def test_module_groups_are_consecutive_runs_of_two_or_more_under_a_module():
    scattered = ["a.x.w", "b.x.w", "a.y.w", "a.z.w", "top.w", "root_buffer", "other"]
    assert module_groups(scattered) == [("a", 2, 4)]
    assert module_groups([]) == []
    assert module_groups(["a.x.w"]) == []
