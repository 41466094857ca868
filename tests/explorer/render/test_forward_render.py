"""op_graph(forward_graph(...)): the forward drawn like construction — clusters, edges, folding, states.

Expected values are worked out from the configs by hand (a tiny Llama: hidden 32, 2 layers, input
(1, 16); T5 with 3 encoder and decoder blocks; a small CNN), not printed by the code under test.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import torch
from torch import nn

from explorer import deferred_init, forward_graph, materialize_module, node_kind, op_graph
from explorer.inspection.census import FAKE, MATERIALIZED, REAL
from explorer.render import op_layout, to_svg
from explorer.render.forward_view import FORWARD_FIRST_VIEW, format_flops
from explorer.render.styles import COMPUTE, FOLDED, FORWARD_INPUT, FORWARD_LEGEND, SUMMARY, VIEW
from tests.support.hf_configs import HF_BY_NAME, config_with_layers

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def llama() -> nn.Module:
    torch.manual_seed(0)
    arch = HF_BY_NAME["llama"]  # hidden 32, intermediate 64, 4 heads, 2 kv heads, vocab 96, 2 layers
    return deferred_init(arch.cls, arch.config()).eval()


@pytest.fixture(scope="module")
def llama_forward(llama):
    return forward_graph(llama, (1, 16))


def op_named(forward, module: str, op: str) -> int:
    rows = forward.ops[(forward.ops["module"] == module) & (forward.ops["op"] == op)]
    return int(rows["index"].iloc[0])


def edge(diagram, tail: str, head: str):
    return next(e for e in diagram.edges if (e.tail, e.head) == (tail, head))


def test_each_op_is_drawn_in_the_cluster_of_the_module_that_ran_it(llama_forward):
    diagram = op_layout(llama_forward)
    mm = op_named(llama_forward, "model.layers.1.self_attn.q_proj", "mm")
    node = diagram.node(f"op:forward:{mm}")
    assert (node.cluster, node.style, node.title, node.lines) == (
        "model.layers.1.self_attn.q_proj", COMPUTE, f"{mm}: mm", ["32.8 kFLOP"])
    assert diagram.node(f"op:forward:{mm - 2}").style == VIEW  # the weight's transpose `t`
    cluster = diagram.clusters["model.layers.1.self_attn.q_proj"]
    assert (cluster.title, cluster.subtitle, cluster.parent) == (
        "model.layers.1.self_attn.q_proj", "Linear · 4 ops · 32.8 kFLOP · act 2.0 KiB", "model.layers.1.self_attn")
    assert node_kind(f"op:forward:{mm}") == ("op", f"forward:{mm}")


def test_parameters_and_inputs_feed_their_readers_with_shapes_on_edges(llama_forward):
    diagram = op_layout(llama_forward)
    weight = diagram.node("tensor:model.layers.1.self_attn.q_proj.weight")
    assert (weight.style, weight.cluster, weight.lines) == (
        FAKE, "model.layers.1.self_attn.q_proj", ["[32, 32] float32", "parameter · fake · 4.0 KiB"])
    mm = op_named(llama_forward, "model.layers.1.self_attn.q_proj", "mm")
    assert edge(diagram, "tensor:model.layers.1.self_attn.q_proj.weight", f"op:forward:{mm - 2}").label == \
        "[32, 32] float32"
    assert edge(diagram, f"op:forward:{mm - 1}", f"op:forward:{mm}").label == "[16, 32] float32"  # tokens flattened
    assert edge(diagram, f"op:forward:{mm - 2}", f"op:forward:{mm}").label == "[32, 32] float32"  # weight.t()
    tokens = diagram.node("tensor:#forward:0")
    assert (tokens.style, tokens.title, tokens.cluster) == (FORWARD_INPUT, "input 0", "")
    embedding = op_named(llama_forward, "model.embed_tokens", "embedding")
    assert edge(diagram, "tensor:#forward:0", f"op:forward:{embedding}").label == "[1, 16] int64"
    names = [node.name for node in diagram.nodes]  # inputs are drawn just before their first reader
    assert names[:3] == ["tensor:#forward:0", "tensor:model.embed_tokens.weight", f"op:forward:{embedding}"]
    norm = op_named(llama_forward, "model.norm", "mul")
    assert names.index("tensor:model.norm.weight") == names.index(f"op:forward:{norm + 1}") - 1


def test_identical_layers_fold_and_unfold(llama_forward):
    diagram = op_layout(llama_forward, depth=2)
    folded = diagram.node("module:model.layers.0")
    layer_ops, layer_flops, layer_bytes = llama_forward.module_totals("model.layers.0")
    assert (folded.style, folded.title, folded.cluster) == (FOLDED, "LlamaDecoderLayer ×2", "model.layers")
    assert folded.lines[0] == "model.layers.0, model.layers.1"
    assert folded.lines[2] == (f"total: {2 * layer_ops} ops · {format_flops(2 * layer_flops)} · act "
                               f"{'%.1f KiB' % (2 * layer_bytes / 1024)}")
    assert "module:model.layers.1" not in [node.name for node in diagram.nodes]
    norm = op_named(llama_forward, "model.norm", "pow")  # the last layer's output feeds the final norm
    assert edge(diagram, "module:model.layers.0", f"op:forward:{norm}").label == "[1, 16, 32] float32"

    unfolded = op_layout(llama_forward, depth=2, unfold=["model.layers"])
    for path in ("model.layers.0", "model.layers.1"):
        node = unfolded.node(f"module:{path}")
        assert (node.style, node.lines[0]) == (SUMMARY, "LlamaDecoderLayer")
    assert edge(unfolded, "module:model.layers.0", "module:model.layers.1").label == "[1, 16, 32] float32"


def test_states_colour_parameters_and_keep_different_layers_apart():
    torch.manual_seed(0)
    arch = HF_BY_NAME["llama"]
    model = deferred_init(arch.cls, arch.config()).eval()
    materialize_module(model.model.layers[0])
    forward = forward_graph(model, (1, 4))
    diagram = op_layout(forward)
    assert diagram.node("tensor:model.layers.0.mlp.up_proj.weight").style == MATERIALIZED
    assert diagram.node("tensor:model.layers.1.mlp.up_proj.weight").style == FAKE
    collapsed = op_layout(forward, depth=2)  # layer 0 is materialized, layer 1 is not: not "identical"
    assert [collapsed.node(f"module:model.layers.{i}").style for i in (0, 1)] == [SUMMARY, SUMMARY]
    eager = op_layout(forward_graph(nn.Linear(3, 2), (5, 3)))
    assert eager.node("tensor:weight").style == REAL


def test_t5_folds_the_identical_blocks_of_encoder_and_decoder():
    arch = HF_BY_NAME["t5"]
    config = arch.config()
    config.num_layers = config.num_decoder_layers = 3  # block 0 owns the relative bias; 1 and 2 are alike
    torch.manual_seed(0)
    model = deferred_init(arch.cls, config).eval()
    diagram = op_layout(forward_graph(model, arch.inputs()), depth=2)
    titles = {node.name: node.title for node in diagram.nodes if node.name.startswith("module:")}
    assert titles == {
        "module:encoder.block.0": "encoder.block.0", "module:encoder.block.1": "T5Block ×2",
        "module:decoder.block.0": "decoder.block.0", "module:decoder.block.1": "T5Block ×2",
    }
    assert {node.cluster for node in diagram.nodes if node.name.startswith("module:")} == {
        "encoder.block", "decoder.block"}
    # the encoder's output (its final norm, drawn op by op) feeds the decoder's cross attention
    clusters = {node.name: node.cluster for node in diagram.nodes}
    into_decoder = {(clusters[e.tail], e.label) for e in diagram.edges if e.head == "module:decoder.block.0"}
    assert ("encoder.final_layer_norm", "[2, 8, 32] float32") in into_decoder


def test_cnn_convolutions_sit_in_their_clusters_with_shapes():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))
    diagram = op_layout(forward_graph(model, (2, 3, 16, 16)))
    assert [(n.name, n.cluster) for n in diagram.nodes if n.name.startswith("op:")] == [
        ("op:forward:0", "0"), ("op:forward:1", "1"), ("op:forward:2", "2")]
    assert edge(diagram, "op:forward:1", "op:forward:2").label == "[2, 8, 16, 16] float32"
    assert edge(diagram, "tensor:2.weight", "op:forward:2").label == "[4, 8, 3, 3] float32"
    assert diagram.node("op:forward:2").lines == [format_flops(2 * (2 * 4 * 16 * 16) * (8 * 3 * 3))]


def test_focus_draws_only_the_ops_run_inside_the_module(llama_forward):
    diagram = op_layout(llama_forward, focus="model.layers.0.mlp")
    drawn = sorted(int(n.name.rpartition(":")[2]) for n in diagram.nodes if n.name.startswith("op:"))
    expected = [i for i, owner in enumerate(llama_forward.owners) if owner.startswith("model.layers.0.mlp")]
    assert drawn == expected
    assert sorted(n.name for n in diagram.nodes if n.name.startswith("tensor:")) == [
        f"tensor:model.layers.0.mlp.{p}_proj.weight" for p in ("down", "gate", "up")]


def test_the_svg_names_nodes_for_clicks_and_carries_title_and_legend(llama_forward):
    svg = ET.fromstring(to_svg(op_graph(llama_forward, depth=2, rankdir="TB")))
    titles = {g.find(f"{SVG}title").text for g in svg.iter(f"{SVG}g") if g.get("class", "").startswith("node")}
    assert {"module:model.layers.0", "tensor:#forward:0", "tensor:lm_head.weight", "legend:"} <= titles
    assert "cluster_module:model.layers" in {g.find(f"{SVG}title").text for g in svg.iter(f"{SVG}g")
                                              if g.get("class") == "cluster"}
    text = " ".join(t.text or "" for t in svg.iter(f"{SVG}text"))
    assert "LlamaDecoderLayer ×2" in text and "parameter: materialized" in text
    diagram = op_layout(llama_forward, depth=2)
    assert diagram.legend == FORWARD_LEGEND
    assert diagram.title.startswith(
        f"LlamaForCausalLM forward (input 0 [1, 16] int64): {len(llama_forward.graph.ops)} ops, ")
    assert diagram.title.endswith("; modules below depth 2 collapsed")


def test_closure_of_is_refused_on_a_forward_graph(llama_forward):
    with pytest.raises(ValueError) as caught:
        op_graph(llama_forward, closure_of="lm_head.weight")
    assert str(caught.value) == ("op_graph: closure_of= is for construction graphs; a forward graph has no "
                                 "closures (use focus= to draw one module's ops)")


def test_format_flops_uses_decimal_units():
    assert [format_flops(n) for n in (0, 999, 1500, 32768, 3 * 10**12)] == [
        "0 FLOP", "999 FLOP", "1.5 kFLOP", "32.8 kFLOP", "3.0 TFLOP"]


def test_the_first_view_is_the_models_outline_top_to_bottom():
    """What the Graph tab opens a forward on (FORWARD_FIRST_VIEW): Qwen2 with 4 layers (hidden 32,
    4 heads: head dim 8; vocab 96, embeddings tied to lm_head), input (1, 16)."""
    arch = HF_BY_NAME["qwen2"]
    torch.manual_seed(0)
    forward = forward_graph(deferred_init(arch.cls, config_with_layers(arch, 4)).eval(), (1, 16))
    layout_view = {key: value for key, value in FORWARD_FIRST_VIEW.items() if key != "rankdir"}
    diagram = op_layout(forward, **layout_view)
    # no op nodes: the modules of the outline, the forward's own ops folded per module, the input
    assert [(node.name, node.style, node.title, node.cluster) for node in diagram.nodes] == [
        ("tensor:#forward:0", FORWARD_INPUT, "input 0", ""),
        ("module:model.embed_tokens", SUMMARY, "model.embed_tokens", "model"),
        ("module:model", SUMMARY, "Qwen2Model.forward", "model"),  # position ids, causal mask
        ("module:model.rotary_emb", SUMMARY, "model.rotary_emb", "model"),
        ("module:model.layers.0", FOLDED, "Qwen2DecoderLayer ×4", "model.layers"),
        ("module:model.norm", SUMMARY, "model.norm", "model"),
        ("module:", SUMMARY, "Qwen2ForCausalLM.forward", ""),  # the logits slice
        ("module:lm_head", SUMMARY, "lm_head", ""),
    ]
    assert diagram.node("module:model.layers.0").lines[0] == "model.layers.0 … model.layers.3"
    assert diagram.node("module:model").lines[0] == "ops outside its submodules"
    assert list(diagram.clusters) == ["", "model", "model.layers"]
    assert {(e.tail, e.head): e.label for e in diagram.edges} == {
        ("tensor:#forward:0", "module:model.embed_tokens"): "[1, 16] int64",
        ("module:model", "module:model.rotary_emb"): "[1, 16] int64",  # position ids
        ("module:model.embed_tokens", "module:model.layers.0"): "[1, 16, 32] float32",
        ("module:model.rotary_emb", "module:model.layers.0"): "[1, 16, 8] float32",  # cos, sin
        ("module:model.layers.0", "module:model.norm"): "[1, 16, 32] float32",
        ("module:model.norm", "module:"): "[1, 16, 32] float32",
        ("module:", "module:lm_head"): "[1, 16, 32] float32",
        ("module:model.embed_tokens", "module:lm_head"): "[96, 32] float32",  # the tied weight
    }
    assert op_graph(forward, **FORWARD_FIRST_VIEW).graph_attr["rankdir"] == "TB"

    unfolded = op_layout(forward, **layout_view, unfold=["model.layers"])  # "×4" clicked: one node per layer
    assert [n.name for n in unfolded.nodes if n.cluster == "model.layers"] == [
        f"module:model.layers.{i}" for i in range(4)]
    # the outline from a layer down: attention runs most of the layer's ops, so it opens too; the
    # layer's residual adds and attention's own ops (reshapes, rotation, softmax) are one node each
    focused = op_layout(forward, **layout_view, focus="model.layers.2")
    layer = "module:model.layers.2"
    assert {(n.name, n.cluster) for n in focused.nodes if n.name.startswith("module:")} == {
        (layer, "model.layers.2"), (f"{layer}.input_layernorm", "model.layers.2"),
        (f"{layer}.self_attn", "model.layers.2.self_attn"),
        *((f"{layer}.self_attn.{p}_proj", "model.layers.2.self_attn") for p in "qkvo"),
        (f"{layer}.post_attention_layernorm", "model.layers.2"), (f"{layer}.mlp", "model.layers.2")}
    assert not [n.name for n in focused.nodes if n.name.startswith("op:")]
    with pytest.raises(ValueError, match="depth= or outline=True, not both"):
        op_layout(forward, depth=2, outline=True)


def test_the_outline_of_an_encoder_decoder_opens_both_stacks_not_their_blocks():
    arch = HF_BY_NAME["t5"]
    config = arch.config()
    config.num_layers = config.num_decoder_layers = 3  # block 0 owns the relative bias; 1 and 2 are alike
    torch.manual_seed(0)
    diagram = op_layout(forward_graph(deferred_init(arch.cls, config).eval(), arch.inputs()), outline=True)
    assert [(node.name, node.title) for node in diagram.nodes if node.name.startswith("module:")] == [
        ("module:shared", "shared"),
        ("module:encoder.embed_tokens", "encoder.embed_tokens"),
        ("module:encoder.block.0", "encoder.block.0"),
        ("module:encoder.block.1", "T5Block ×2"),
        ("module:encoder.final_layer_norm", "encoder.final_layer_norm"),
        ("module:decoder.embed_tokens", "decoder.embed_tokens"),
        ("module:decoder.block.0", "decoder.block.0"),
        ("module:decoder.block.1", "T5Block ×2"),
        ("module:decoder.final_layer_norm", "decoder.final_layer_norm"),
        ("module:", "T5ForConditionalGeneration.forward"),
        ("module:lm_head", "lm_head"),
    ]
    assert not [node.name for node in diagram.nodes if node.name.startswith("op:")]
    assert list(diagram.clusters) == ["", "decoder", "encoder", "decoder.block", "encoder.block"]
