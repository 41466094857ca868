"""Diagrams (explorer.render): node names, labels, styles, clusters, collapse/fold/focus/cap, escaping."""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET

import pytest
import torch
from torch import nn

import explorer
from explorer import DeferredInitError, deferred_init, materialize_module, module_graph, node_kind, op_graph
from explorer.inspection import inspect, op_kind
from explorer.naming import format_bytes
from explorer.record.fake import handle_of
from explorer.render import module_layout, op_layout, save, to_html, to_png, to_svg
from explorer.render.escape import dot_id
from explorer.render.styles import STYLES

SVG = "{http://www.w3.org/2000/svg}"


# -- modules under test -----------------------------------------------------------------------------
class Leaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4, 3))  # 1 empty (factory), 2 detach (view)
        nn.init.normal_(self.weight)  # 3 normal_ (random)
        self.register_buffer("scale", torch.ones(3))  # 4 ones
        self.scale.mul_(2)  # 5 mul_ (in-place)
        self.register_buffer("steps", torch.tensor([1, 2]))  # 6 lift_fresh (external input)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = torch.arange(3.0)  # 0: feeds leaf.base and other.offset
        self.leaf = Leaf()
        self.other = nn.Module()
        self.other.register_buffer("offset", shared * 2)  # 7 mul
        self.leaf.register_buffer("base", shared + 1)  # 8 add
        n = int(torch.ones(()).add(1).item())  # 9 ones, 10 add, 11 _local_scalar_dense (data)
        self.head = nn.Linear(3, n, bias=False)  # 12 empty, 13 detach, 14 uniform_
        self.embed = nn.Embedding(n, 3)  # 15 empty, 16 detach, 17 normal_
        self.head.weight = self.embed.weight  # tied: head.weight is the first name
        torch.zeros(5)  # 18: a dropped temporary


def tiny_llama(layers: int = 4) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=50)
    return deferred_init(LlamaForCausalLM, config)


@pytest.fixture(scope="module")
def llama() -> nn.Module:
    return tiny_llama()


def graph_of(module: nn.Module):
    return handle_of(next(t for t in module.parameters())).graph


def node_names(diagram) -> set[str]:
    return {node.name for node in diagram.nodes}


def ops_of(diagram) -> set[str]:
    return {name for name in node_names(diagram) if name.startswith("op:")}


def svg_tree(digraph) -> ET.Element:
    return ET.fromstring(to_svg(digraph))


def svg_nodes(root: ET.Element) -> dict[str, ET.Element]:
    """SVG node groups by their <title> (the node name); their class is "node de-style-<style>"."""
    return {g.find(f"{SVG}title").text: g for g in root.iter(f"{SVG}g") if "node" in (g.get("class") or "").split()}


def fill_of(group: ET.Element) -> str:
    shape = next(e for e in group.iter() if e.tag in (f"{SVG}path", f"{SVG}polygon", f"{SVG}ellipse"))
    return shape.get("fill")


def texts_of(group: ET.Element) -> list[str]:
    return [t.text for t in group.iter(f"{SVG}text")]


def dot_clusters(digraph) -> dict[str, str | None]:
    """Node name → innermost enclosing cluster name, read from the DOT body's subgraph nesting."""
    stack: list[str] = []
    where: dict[str, str | None] = {}
    for line in digraph.body:
        text = line.strip()
        if text.startswith("subgraph "):
            stack.append(text[len("subgraph "):-1].strip().strip('"'))
        elif text == "}":
            stack.pop()
        elif text.startswith('"') and " [" in text and "->" not in text:
            where[text[1:text.index('" [')]] = stack[-1] if stack else None
    return where


# -- names, labels, styles, clusters ----------------------------------------------------------------
def test_full_view_draws_every_op_and_each_held_tensor_once_under_its_first_name():
    net = deferred_init(Net)
    diagram = op_layout(net)
    ops = {f"op:0:{index}" for index in range(19)}
    assert len(graph_of(net).ops) == 19
    tensors = {"tensor:leaf.weight", "tensor:leaf.scale", "tensor:leaf.steps", "tensor:leaf.base",
               "tensor:other.offset", "tensor:head.weight"}
    assert node_names(diagram) == ops | tensors  # tied embed.weight has no node of its own
    assert diagram.node("tensor:head.weight").lines == ["[2, 3] float32", "parameter · fake · 24 B", "= embed.weight"]
    assert diagram.omitted == 0


def test_op_nodes_are_styled_by_op_kind_and_tensors_by_state():
    net = deferred_init(Net)
    graph = graph_of(net)
    diagram = op_layout(net)
    for index, op in enumerate(graph.ops):
        assert diagram.node(f"op:0:{index}").style == op_kind(op)
    kinds = {index: diagram.node(f"op:0:{index}").style for index in (1, 2, 3, 5, 6, 7, 11)}
    assert kinds == {1: "factory", 2: "view", 3: "random", 5: "in-place", 6: "external-input", 7: "compute",
                     11: "data"}
    nodes = svg_nodes(svg_tree(op_graph(net)))
    assert fill_of(nodes["op:0:1"]) == "#cfe2ff"  # factory
    assert fill_of(nodes["op:0:3"]) == "#ffd8a8"  # random
    assert fill_of(nodes["op:0:5"]) == "#f8c9c4"  # in-place
    assert fill_of(nodes["op:0:2"]) == "#f1f3f5"  # view
    assert fill_of(nodes["op:0:6"]) == "#fff3bf"  # external input
    assert fill_of(nodes["tensor:leaf.weight"]) == "#ffffff"  # fake
    assert STYLES["view"]["style"] == "rounded,dashed,filled" and STYLES["fake"]["style"] == "dashed,filled"


def test_labels_show_op_index_name_arguments_and_edges_show_shape_and_dtype():
    net = deferred_init(Net)
    diagram = op_layout(net)
    assert (diagram.node("op:0:3").title, diagram.node("op:0:3").lines) == ("3: normal_", ["#2"])
    assert (diagram.node("op:0:5").title, diagram.node("op:0:5").lines) == ("5: mul_", ["#3, 2"])
    assert diagram.node("op:0:6").lines == ["external #0"]
    assert diagram.node("tensor:leaf.steps").lines == ["[2] int64", "buffer · fake · 16 B"]
    edges = {(edge.tail, edge.head): edge.label for edge in diagram.edges}
    assert edges[("op:0:1", "op:0:2")] == "[4, 3] float32"
    assert edges[("op:0:2", "op:0:3")] == "[4, 3] float32"
    assert edges[("op:0:3", "tensor:leaf.weight")] == "[4, 3] float32"  # from the last write, not the detach
    assert edges[("op:0:5", "tensor:leaf.scale")] == "[3] float32"
    assert ("op:0:2", "tensor:leaf.weight") not in edges
    nodes = svg_nodes(svg_tree(op_graph(net)))
    assert texts_of(nodes["op:0:3"]) == ["3: normal_", "#2"]
    assert texts_of(nodes["tensor:leaf.steps"]) == ["leaf.steps", "[2] int64", "buffer · fake · 16 B"]
    no_labels = op_layout(net, edge_labels=False)
    assert {edge.label for edge in no_labels.edges} == {""}


def test_each_op_sits_in_the_innermost_module_common_to_the_tensors_it_feeds():
    net = deferred_init(Net)
    diagram = op_layout(net)
    assert diagram.node("op:0:1").cluster == "leaf"
    assert diagram.node("op:0:7").cluster == "other"
    assert diagram.node("op:0:0").cluster == ""  # arange feeds leaf.base and other.offset
    assert diagram.node("op:0:18").cluster == ""  # feeds nothing the module holds
    assert sorted(diagram.members("leaf")) == sorted(
        ["op:0:1", "op:0:2", "op:0:3", "op:0:4", "op:0:5", "op:0:6", "op:0:8", "tensor:leaf.weight",
         "tensor:leaf.scale", "tensor:leaf.steps", "tensor:leaf.base"])
    assert [(c.path, c.parent, c.title, c.subtitle) for c in diagram.clusters.values()] == [
        ("", None, "Net", ""), ("head", "", "head", "Linear"), ("leaf", "", "leaf", "Leaf"),
        ("other", "", "other", "Module")]
    where = dot_clusters(op_graph(net))
    assert where["op:0:1"] == "cluster_module:leaf"
    assert where["tensor:other.offset"] == "cluster_module:other"
    assert where["op:0:0"] == "cluster_module:"
    assert where["legend:"] is None
    titles = [g.find(f"{SVG}title").text for g in svg_tree(op_graph(net)).iter(f"{SVG}g") if g.get("class") == "cluster"]
    assert sorted(titles) == ["cluster_module:", "cluster_module:head", "cluster_module:leaf", "cluster_module:other"]


def test_node_kind_parses_every_name_the_diagrams_use():
    assert node_kind("op:0:12") == ("op", "0:12")
    assert node_kind("tensor:layers.0.weight") == ("tensor", "layers.0.weight")
    assert node_kind("tensor:#0:5") == ("tensor", "#0:5")
    assert node_kind("module:") == ("module", "")
    assert node_kind("module:layers.0") == ("module", "layers.0")
    assert node_kind("cluster_module:layers.0") == ("cluster", "layers.0")
    assert node_kind("more:") == ("more", "")
    with pytest.raises(ValueError, match="'node1' is not a diagram node name"):
        node_kind("node1")


# -- collapse, fold, focus, closure, cap ------------------------------------------------------------
def test_depth_collapses_deeper_modules_and_folds_identical_layers(llama):
    diagram = op_layout(llama, depth=2)
    names = node_names(diagram)
    assert "module:model.layers.0" in names
    assert not {f"module:model.layers.{i}" for i in (1, 2, 3)} & names
    assert not any(node.cluster and node.cluster.startswith("model.layers.") for node in diagram.nodes)
    folded = diagram.node("module:model.layers.0")
    table = inspect(llama)
    layer_ops = sum(1 for modules in table.ops["modules"] if modules and all(
        m.startswith("model.layers.0.") for m in modules))
    layer_bytes = int(table.modules.set_index("name").loc["model.layers.0", "bytes"])
    assert folded.title == "LlamaDecoderLayer ×4"
    assert folded.lines == ["model.layers.0 … model.layers.3",
                            f"each: {layer_ops} ops · 9 tensors · {format_bytes(layer_bytes)}",
                            f"total: {format_bytes(4 * layer_bytes)}"]
    assert folded.style == "repeated modules" and folded.cluster == "model.layers"
    assert "tensor:model.embed_tokens.weight" in names  # depth 2 is still drawn
    svg = svg_nodes(svg_tree(op_graph(llama, depth=2)))
    assert texts_of(svg["module:model.layers.0"])[0] == "LlamaDecoderLayer ×4"


def test_fold_repeats_false_and_deeper_depth_draw_each_layer(llama):
    unfolded = op_layout(llama, depth=2, fold_repeats=False)
    for index in range(4):
        node = unfolded.node(f"module:model.layers.{index}")
        assert (node.style, node.title, node.lines[0]) == ("module", f"model.layers.{index}", "LlamaDecoderLayer")
    deeper = op_layout(llama, depth=3)
    names = node_names(deeper)
    # q_proj and k_proj have the same shape but are different things: named children never fold
    assert {f"module:model.layers.{i}.{child}" for i in range(4) for child in
            ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")} <= names
    assert deeper.node("module:model.layers.2.mlp").cluster == "model.layers.2"


def test_a_materialized_layer_is_not_folded_with_its_fake_siblings():
    model = tiny_llama()
    materialize_module(model.model.layers[2])
    diagram = op_layout(model, depth=2)
    assert diagram.node("module:model.layers.0").title == "LlamaDecoderLayer ×3"
    assert diagram.node("module:model.layers.0").lines[0] == "model.layers.0 … model.layers.3"
    assert diagram.node("module:model.layers.2").title == "model.layers.2"
    focused = op_layout(model, focus="model.layers.2")
    assert {focused.node(f"tensor:model.layers.2.{n}").style for n in ("mlp.up_proj.weight", "input_layernorm.weight")
            } == {"materialized"}
    svg = svg_nodes(svg_tree(op_graph(model, focus="model.layers.2")))
    assert fill_of(svg["tensor:model.layers.2.mlp.up_proj.weight"]) == "#b2f2bb"


def test_focus_draws_the_closures_of_the_module_tensors(llama):
    graph = graph_of(llama)
    layer = llama.model.layers[1]
    tids = [handle_of(t).tensor_id for t in [*layer.parameters(), *layer.buffers()]]
    diagram = op_layout(llama, focus="model.layers.1")
    assert ops_of(diagram) == {f"op:0:{i}" for i in graph.closure_of(tids)}
    assert {n for n in node_names(diagram) if n.startswith("tensor:")} == {
        f"tensor:model.layers.1.{name}" for name, _ in layer.named_parameters()}
    # depth never collapses the focused module itself, only what is below the collapse level
    collapsed = op_layout(llama, focus="model.layers.1", depth=1)
    assert {n for n in node_names(collapsed) if n.startswith("module:")} == {
        f"module:model.layers.1.{child}" for child in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")}


def test_focus_on_a_module_holding_a_tied_weight_under_its_second_name_draws_that_weight():
    net = deferred_init(Net)
    diagram = op_layout(net, focus="embed")
    assert node_names(diagram) == {"op:0:15", "op:0:16", "op:0:17", "tensor:head.weight"}
    assert diagram.title == "Net: 3 ops, 1 tensors; focus embed"


def test_closure_of_draws_exactly_what_materializing_the_tensor_replays(llama):
    graph = graph_of(llama)
    tid = handle_of(llama.model.rotary_emb.inv_freq).tensor_id
    diagram = op_layout(llama, closure_of="model.rotary_emb.inv_freq")
    assert ops_of(diagram) == {f"op:0:{i}" for i in graph.closure_of([tid])}
    assert "tensor:model.rotary_emb.inv_freq" in node_names(diagram)
    weight = handle_of(llama.model.layers[3].mlp.down_proj.weight).tensor_id
    by_weight = op_layout(llama, closure_of="model.layers.3.mlp.down_proj.weight")
    assert ops_of(by_weight) == {f"op:0:{i}" for i in graph.closure_of([weight])}
    # an unnamed intermediate, by id
    intermediate = graph.ops[min(graph.closure_of([tid]))].output_ids[0]
    unnamed = op_layout(llama, closure_of=f"#0:{intermediate}")
    assert ops_of(unnamed) == {f"op:0:{i}" for i in graph.closure_of([intermediate])}
    assert f"tensor:#0:{intermediate}" in node_names(unnamed)


def test_max_nodes_keeps_the_first_nodes_and_adds_one_n_more_node(llama):
    full = op_layout(llama, max_nodes=None)
    total = len(full.nodes)
    assert total == len(graph_of(llama).ops) + len(full.nodes) - len(ops_of(full))
    capped = op_layout(llama, max_nodes=50)
    assert [node.name for node in capped.nodes[:50]] == [node.name for node in full.nodes[:50]]
    assert len(capped.nodes) == 51 and capped.omitted == total - 50
    more = capped.nodes[-1]
    assert (more.name, more.title) == ("more:", f"{total - 50} more ops/tensors not shown")
    assert any(edge.head == "more:" and edge.dashed for edge in capped.edges)
    kept = node_names(capped)
    assert all(edge.tail in kept and edge.head in kept for edge in capped.edges)
    svg = svg_nodes(svg_tree(op_graph(llama, max_nodes=50)))
    assert texts_of(svg["more:"])[0] == f"{total - 50} more ops/tensors not shown"


def test_bad_focus_closure_and_options_name_the_culprit(llama):
    with pytest.raises(ValueError, match=r"focus='model\.nope': LlamaForCausalLM has no submodule with that path "
                                         r"\(modules at that depth: model\.embed_tokens, model\.layers"):
        op_graph(llama, focus="model.nope")
    with pytest.raises(ValueError, match=r"closure_of='model\.missing\.weight': no tensor of LlamaForCausalLM"):
        op_graph(llama, closure_of="model.missing.weight")
    with pytest.raises(ValueError, match="give focus= or closure_of=, not both"):
        op_graph(llama, focus="model", closure_of="lm_head.weight")
    with pytest.raises(ValueError, match="depth must be >= 0"):
        op_graph(llama, depth=-1)
    with pytest.raises(TypeError, match="op_graph expects an nn.Module, an InitGraph or a deferred_init error, got str"):
        op_graph("model")


# -- escaping ---------------------------------------------------------------------------------------
class Hostile(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_module("<script>", nn.Linear(2, 2))
        self.add_module('say "hi" {x}', nn.Linear(2, 2, bias=False))
        self.add_module("a&b\\N", nn.Linear(2, 2, bias=False))
        self.add_module("]", nn.Linear(2, 2, bias=False))  # Graphviz's lexer refuses `<b>]</b>` unescaped


@pytest.mark.parametrize("draw", [op_graph, module_graph], ids=["op_graph", "module_graph"])
def test_hostile_module_names_render_as_text_in_valid_svg(draw):
    digraph = draw(deferred_init(Hostile))
    svg = to_svg(digraph)
    root = ET.fromstring(svg)  # valid XML
    assert list(root.iter(f"{SVG}script")) == [] and "<script" not in svg
    titles = {e.text for e in root.iter(f"{SVG}title")}
    texts = {e.text for e in root.iter(f"{SVG}text")}
    if draw is op_graph:
        assert {"cluster_module:<script>", 'cluster_module:say "hi" {x}', "cluster_module:a&b\\N",
                "tensor:<script>.weight", 'tensor:say "hi" {x}.weight', "tensor:a&b\\N.weight"} <= titles
        assert {"<script>", "<script>.weight", 'say "hi" {x}.weight', "a&b\\N.weight", "]", "].weight"} <= texts
    else:
        assert {"module:<script>", 'module:say "hi" {x}', "module:a&b\\N"} <= titles
        assert {"<script>", 'say "hi" {x}', "a&b\\N", "]"} <= texts
    page = to_html(digraph)
    assert "<script" not in page and "&lt;script&gt;" in page


@pytest.mark.parametrize("name", ['plain', 'q"uote', 'a\\b', 'a\\\\"b', "x\ny", "<b>bold</b>", "{x}|y"])
def test_dot_ids_read_back_unchanged_from_the_svg_title(name):
    source = f"digraph {{ {dot_id(name)} [label=<x>] }}"
    svg = subprocess.run(["dot", "-Tsvg"], input=source.encode(), capture_output=True, check=True).stdout
    titles = [e.text for e in ET.fromstring(svg).iter(f"{SVG}title")]
    assert titles[1] == name


@pytest.mark.parametrize("name, title", [("end\\", "end\\\\"), ('odd\\"q', 'odd\\\\"q'), ("bell\x07", "bell\ufffd")])
def test_dot_ids_that_graphviz_cannot_spell_stay_valid(name, title):
    source = f"digraph {{ {dot_id(name)} [label=<x>] }}"
    svg = subprocess.run(["dot", "-Tsvg"], input=source.encode(), capture_output=True, check=True).stdout
    assert [e.text for e in ET.fromstring(svg).iter(f"{SVG}title")][1] == title


# -- partial graphs, eager modules, finished graphs -------------------------------------------------
@torch.library.custom_op("explorer_render_tests::no_fake_kernel", mutates_args=())
def no_fake_kernel(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


class FailsHalfway(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)  # 0 empty, 1 detach, 2 empty, 3 detach, 4 uniform_, 5 uniform_
        self.w = nn.Parameter(torch.ones(2))  # 6 ones, 7 detach
        self.register_buffer("bad", no_fake_kernel(self.w))


def test_failed_construction_draws_what_was_recorded_and_where_it_stopped():
    with pytest.raises(DeferredInitError) as caught:
        deferred_init(FailsHalfway)
    diagram = op_layout(caught.value)
    assert node_names(diagram) == {*(f"op:0:{i}" for i in range(8)), "tensor:#0:1", "tensor:#0:3", "tensor:#0:5",
                                   "error:"}
    error = diagram.node("error:")
    assert error.title == "construction failed here"
    assert error.lines[0].startswith("DeferredInitError: explorer_render_tests.no_fake_kernel.default failed under "
                                     "deferred_init while building FailsHalfway at ")
    assert ("op:0:7", "error:") in {(edge.tail, edge.head) for edge in diagram.edges}
    assert diagram.clusters == {}
    assert diagram.title == "partial graph: 8 ops, 3 tensors; construction failed: recorded up to the failing op"
    # the graph itself draws the same, with no message to show
    from_graph = op_layout(caught.value.graph)
    assert node_names(from_graph) == node_names(diagram)
    assert from_graph.node("error:").lines == ["construction did not finish"]
    ET.fromstring(to_svg(op_graph(caught.value)))


def test_exception_from_the_constructor_draws_its_partial_graph():
    def broken() -> nn.Module:
        nn.Linear(2, 2)
        raise KeyError("config field missing")

    with pytest.raises(KeyError) as caught:
        deferred_init(broken)
    diagram = op_layout(caught.value)
    assert ops_of(diagram) == {f"op:0:{i}" for i in range(6)}
    assert diagram.node("error:").lines == ["KeyError: 'config field missing'"]


def test_eager_module_draws_its_tensors_without_ops():
    diagram = op_layout(nn.Sequential(nn.Linear(2, 3)))
    assert node_names(diagram) == {"tensor:0.weight", "tensor:0.bias"}
    assert {node.style for node in diagram.nodes} == {"real"} and diagram.edges == []
    assert diagram.node("tensor:0.weight").cluster == "0"


def test_a_finished_graph_draws_like_its_module():
    net = deferred_init(Net)
    assert node_names(op_layout(graph_of(net))) == node_names(op_layout(net))


# -- module tree ------------------------------------------------------------------------------------
def test_module_graph_shows_sizes_states_and_folds_repeated_layers(llama):
    diagram = module_layout(llama)
    names = node_names(diagram)
    assert {"module:", "module:model", "module:model.embed_tokens", "module:model.layers", "module:model.layers.0",
            "module:model.layers.0.self_attn.q_proj", "module:model.norm", "module:lm_head"} <= names
    assert not any(name.startswith("module:model.layers.1") for name in names)
    params = sum(p.numel() for p in llama.parameters())
    nbytes = sum(t.numel() * t.element_size() for t in [*llama.parameters(), *llama.buffers()])
    root = diagram.node("module:")
    assert (root.title, root.lines) == ("LlamaForCausalLM", [f"{params / 1e3:.2f}K params · {format_bytes(nbytes)} · fake"])
    layers = diagram.node("module:model.layers.0")
    layer_params = sum(p.numel() for p in llama.model.layers[0].parameters())
    assert layers.title == "LlamaDecoderLayer ×4"
    assert layers.lines == ["model.layers.0 … model.layers.3",
                            f"each: {layer_params / 1e3:.2f}K params · {format_bytes(layer_params * 4)} · fake"]
    assert ("module:model.layers", "module:model.layers.0") in {(e.tail, e.head) for e in diagram.edges}
    shallow = module_layout(llama, depth=1)
    assert node_names(shallow) == {"module:", "module:model", "module:lm_head"}
    assert shallow.node("module:model").lines[-1] == "+4 submodules"


def test_module_graph_folds_only_siblings_whose_tensors_have_the_same_shapes():
    # 4->8 and 8->4 projections have the same class, parameter count and bytes, not the same weights
    def projections() -> nn.ModuleList:
        return nn.ModuleList([nn.Linear(4, 8, bias=False), nn.Linear(8, 4, bias=False), nn.Linear(8, 4, bias=False)])

    diagram = module_layout(deferred_init(projections))
    assert {"module:0", "module:1"} <= node_names(diagram) and "module:2" not in node_names(diagram)
    assert (diagram.node("module:0").title, diagram.node("module:1").title) == ("0", "Linear ×2")


def test_module_graph_states_follow_materialization():
    model = tiny_llama(layers=2)
    materialize_module(model.model.layers[0])
    diagram = module_layout(model)
    assert diagram.node("module:model.layers.0").lines[-1].endswith("· materialized")
    assert diagram.node("module:model.layers.1").lines[-1].endswith("· fake")
    assert diagram.node("module:model.layers.0").style == "module: materialized"
    share = inspect(model).modules.set_index("name").loc["model", "materialized"]
    assert diagram.node("module:model").lines[-1].endswith(f"· partly materialized ({100 * share:.0f}%)")
    eager = module_layout(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    assert eager.node("module:0").lines[-1].endswith("· real")
    assert eager.node("module:1").lines[-1] == "0 params · 0 B · no tensors"


# -- export -----------------------------------------------------------------------------------------
def test_exports_svg_png_html_and_dot(tmp_path):
    digraph = op_graph(deferred_init(Net))
    assert to_png(digraph)[:8] == b"\x89PNG\r\n\x1a\n"
    page = to_html(digraph)
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<?xml" not in page
    assert save(digraph, tmp_path / "net.dot").read_text() == digraph.source
    assert ET.parse(save(digraph, tmp_path / "net.svg")).getroot().tag == f"{SVG}svg"
    with pytest.raises(ValueError, match=r"cannot tell the format of '.*net\.txt'; use \.svg, \.png, \.html or \.dot"):
        save(digraph, tmp_path / "net.txt")


def test_public_names_are_exported_from_the_package():
    assert explorer.op_graph is op_graph and explorer.module_graph is module_graph
    assert explorer.node_kind is node_kind


def test_svg_nodes_carry_their_style_as_a_class_and_unfold_draws_repeats_one_by_one(llama):
    nodes = svg_nodes(svg_tree(op_graph(llama, depth=2)))
    assert nodes["module:model.layers.0"].get("class") == "node de-style-repeated-modules"
    assert "module:model.layers.1" not in nodes
    unfolded = svg_nodes(svg_tree(op_graph(llama, depth=2, unfold=["model.layers"], rankdir="TB")))
    assert unfolded["module:model.layers.1"].get("class") == "node de-style-module"  # a collapsed summary
    with pytest.raises(ValueError, match="op_graph: rankdir must be one of LR, TB, got 'RL'"):
        op_graph(llama, rankdir="RL")


def test_checkpoint_reads_are_named_by_file_and_disk_tensors_and_modules_have_their_style(tmp_path):
    from tests.support.checkpoints import loaded_pair

    module, file = loaded_pair(tmp_path)  # ops 0-11: the two linears' init, 12: the buffer, 13-16: reads
    diagram = op_layout(module)
    reads = [node for node in diagram.nodes if node.style == "checkpoint read"]
    assert [(node.title, node.lines) for node in reads] == [
        ("13: read pair.safetensors", ["first.bias"]), ("14: read pair.safetensors", ["first.weight"]),
        ("15: read pair.safetensors", ["second.bias"]), ("16: read pair.safetensors", ["second.weight"])]
    assert reads[1].tooltip.startswith(f"explorer.read_safetensors.default: first.weight [3, 4] bfloat16\nfrom {file}")
    weight = diagram.node("tensor:first.weight")
    assert (weight.style, weight.lines) == ("disk", ["[3, 4] float32", "parameter · disk · 48 B"])
    assert diagram.node("tensor:scale").style == "fake"
    nodes = svg_nodes(svg_tree(op_graph(module)))
    assert fill_of(nodes["op:0:14"]) == "#e5dbff" and fill_of(nodes["tensor:first.weight"]) == "#f3f0ff"
    modules = module_layout(module)
    assert [(node.name, node.style, node.lines[-1]) for node in modules.nodes] == [
        ("module:", "module: disk", "23 params · 100 B · disk"),
        ("module:first", "module: disk", "15 params · 60 B · disk"),
        ("module:second", "module: disk", "8 params · 32 B · disk")]
