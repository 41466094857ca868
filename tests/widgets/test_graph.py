"""Graph tab: what it asks `explorer.op_graph` for, and how clicks in the SVG travel back."""

from widgets.explorer_widget import GRAPH_TAB


def open_graph_tab(ui):
    ui.tabs.selected_index = GRAPH_TAB


def test_graph_is_laid_out_only_while_its_tab_is_visible(ui, graph_stand_in):
    ui.select("blocks.1")
    assert graph_stand_in.calls == []
    open_graph_tab(ui)
    assert graph_stand_in.calls == [{"focus": "blocks.1", "depth": 4}]
    assert ui.graph_tab.view.svg.startswith("<?xml") and "cluster_module:blocks.1" in ui.graph_tab.view.svg
    assert ui.graph_tab.status.value == "blocks.1, depth 4"


def test_graph_follows_the_selection_while_visible(ui, graph_stand_in):
    open_graph_tab(ui)
    ui.select("blocks.0.mlp")
    ui.tree.set_checked("blocks.0.attn", True)
    assert graph_stand_in.calls == [{"focus": None, "depth": 2}, {"focus": "blocks.0.mlp", "depth": 5},
                                    {"focus": "blocks.0", "depth": 4}]


def test_depth_slider_counts_levels_below_the_focus(ui, graph_stand_in):
    ui.select("blocks")
    open_graph_tab(ui)
    ui.graph_tab.depth.value = 0
    assert graph_stand_in.calls[-1] == {"focus": "blocks", "depth": 1}
    assert ui.graph_tab.depth.max == 4  # the deepest module, blocks.0.mlp.0, is at depth 4


def test_closure_toggle_draws_the_open_tensors_closure(ui, graph_stand_in):
    open_graph_tab(ui)
    ui.graph_tab.closure.value = True  # no tensor open yet: nothing to take the closure of
    assert graph_stand_in.calls[-1] == {"focus": None, "depth": 2}
    assert ui.graph_tab.status.value == "whole module (closure: open a tensor first), depth 2"
    ui.show_tensor("blocks.1.norm.weight")
    assert graph_stand_in.calls[-1] == {"closure_of": "blocks.1.norm.weight", "depth": 2}
    assert ui.graph_tab.status.value == "closure of blocks.1.norm.weight, depth 2"
    assert ui.graph_tab.view.selected == "tensor:blocks.1.norm.weight"
    ui.select("blocks.1")  # the closure replaces the focus; the depth still counts from it
    assert graph_stand_in.calls[-1] == {"closure_of": "blocks.1.norm.weight", "depth": 4}
    ui.graph_tab.closure.value = False
    assert graph_stand_in.calls[-1] == {"focus": "blocks.1", "depth": 4}


def test_clicking_a_module_cluster_selects_it_in_the_tree(ui, graph_stand_in):
    ui.graph_tab.view.clicked = "cluster_module:blocks.0.mlp"  # what graph.js sends
    assert ui.tree.checked == ["blocks.0.mlp", "blocks.0.mlp.0", "blocks.0.mlp.1", "blocks.0.mlp.2"]
    assert ui.tree.active == "blocks.0.mlp"
    assert ui.graph_tab.view.clicked == ""  # ready for the next click, even on the same node
    ui.graph_tab.view.clicked = "module:blocks.1"  # a collapsed summary node
    assert ui.tree.active == "blocks.1"


def test_clicking_a_tensor_node_selects_its_row_and_opens_it(ui, graph_stand_in):
    ui.graph_tab.view.clicked = "tensor:blocks.1.attn.weight"
    assert ui.tensors_tab.table.selected == "blocks.1.attn.weight"
    assert ui.details.values["shape"] == "(4, 4)"


def test_clicking_an_intermediate_or_an_op_changes_no_selection(ui, graph_stand_in):
    ui.select("embed")
    ui.graph_tab.view.clicked = "tensor:#0:4"
    ui.graph_tab.view.clicked = "op:0:3"
    assert ui.tree.checked == ["embed"] and ui.tensor is None
    assert ui.graph_tab.status.value == "#0:4 is an intermediate tensor (not a parameter or buffer)"


def test_graph_failure_is_shown_in_the_status_line(ui, graph_stand_in):
    graph_stand_in.error = ValueError("too many nodes")
    open_graph_tab(ui)
    assert ui.graph_tab.status.value == "graph failed: ValueError: too many nodes"
    assert ui.graph_tab.view.svg == ""


def test_graph_is_redrawn_after_materializing(ui, graph_stand_in):
    ui.select("blocks.0.norm")
    open_graph_tab(ui)
    ui.materialize_selected(wait=True)
    assert graph_stand_in.calls == [{"focus": "blocks.0.norm", "depth": 5}] * 2


def test_clicking_a_node_unknown_to_the_tree_is_reported(ui, graph_stand_in):
    ui.select("embed")
    ui.graph_tab.view.clicked = "module:blocks.7"
    assert ui.graph_tab.status.value == "module:blocks.7: no module at path 'blocks.7'"
    assert ui.tree.checked == ["embed"] and ui.graph_tab.view.clicked == ""


def test_real_diagram_node_titles_select_what_they_name(ui):
    """With the real renderer: every tensor title in the SVG maps back to a row when clicked."""
    import re

    ui.select("blocks.0")
    open_graph_tab(ui)
    titles = re.findall(r"<title>([^<]*)</title>", ui.graph_tab.view.svg)
    assert "cluster_module:blocks.0" in titles
    assert "tensor:blocks.0.attn.weight" in titles
    ui.graph_tab.view.clicked = "tensor:blocks.0.attn.weight"
    assert ui.tensors_tab.table.selected == "blocks.0.attn.weight"
    ui.graph_tab.view.clicked = "cluster_module:blocks.0.mlp"
    assert ui.tree.active == "blocks.0.mlp"


def test_clicking_a_folded_node_unfolds_the_repeats_instead_of_selecting(ui):
    open_graph_tab(ui)
    ui.graph_tab.depth.value = 1  # blocks.0 and blocks.1 collapse, and fold into "Block ×2"
    assert ui.graph_tab.folded == {"module:blocks.0"}
    assert ui.graph_tab.status.value == 'whole module, depth 1; click a "×N" node to unfold it'
    ui.graph_tab.view.clicked = "module:blocks.0"  # what graph.js sends for the "Block ×2" node
    assert ui.graph_tab.unfolded == {"blocks"} and ui.graph_tab.folded == set()
    assert "<title>module:blocks.1</title>" in ui.graph_tab.view.svg
    assert ui.tree.checked == []  # unfolding selected nothing
    ui.graph_tab.view.clicked = "module:blocks.1"  # now a plain summary node: selects
    assert ui.tree.active == "blocks.1"


def test_direction_and_breadcrumb(ui, graph_stand_in):
    open_graph_tab(ui)
    drawn = len(graph_stand_in.calls)
    ui.graph_tab.rankdir.value = "TB"
    assert len(graph_stand_in.calls) == drawn + 1 and graph_stand_in.calls[-1] == {"focus": None, "depth": 2}
    assert ui.graph_tab.graph_arguments()["rankdir"] == "TB"  # laid out by Graphviz top to bottom
    ui.select("blocks.0.mlp")
    crumbs = ui.graph_tab.breadcrumb.children
    assert [c.description for c in crumbs] == ["(root)", "blocks", "0", "mlp"]
    assert [c.tooltip for c in crumbs] == ["(root)", "blocks", "blocks.0", "blocks.0.mlp"]
    crumbs[1].click()  # what clicking "blocks" in the breadcrumb does
    assert ui.tree.active == "blocks" and graph_stand_in.calls[-1]["focus"] == "blocks"


# -- forward mode (real renderer, a tiny Llama: hidden 32, 2 layers, 4 heads, vocab 96) -----------------
import pytest  # noqa: E402
import torch  # noqa: E402

import explorer  # noqa: E402
import widgets  # noqa: E402
from explorer.render.forward_view import format_flops  # noqa: E402
from tests.support.hf_configs import HF_BY_NAME  # noqa: E402
from widgets.graph import describe_forward_op, heat_colours  # noqa: E402
from widgets.overlays import HEAT, NONE  # noqa: E402


@pytest.fixture
def llama_ui():
    torch.manual_seed(0)
    arch = HF_BY_NAME["llama"]
    ui = widgets.explore(arch.cls, arch.config())
    open_graph_tab(ui)
    return ui


def mm_index(forward, module: str) -> int:
    ops = forward.ops
    return int(ops[(ops["module"] == module) & (ops["op"] == "mm")]["index"].iloc[0])


def test_forward_mode_draws_the_memory_tabs_inputs(llama_ui):
    tab = llama_ui.graph_tab
    llama_ui.memory_tab.shapes.value = "1x8"  # the Memory tab's dry-run box feeds the Graph tab
    assert tab.inputs.value == "1x8"
    tab.kind.value = "forward"
    expected = explorer.forward_graph(llama_ui.module, (1, 8))
    assert tab.status.value == (f"forward of [1, 8] int64: {len(expected.graph.ops)} ops, "
                                f"{format_flops(expected.flops)} — whole module, outline; "
                                'click a "×N" node to unfold it')
    assert tab.folded == {"module:model.layers.0"}
    assert "<title>tensor:#forward:0</title>" in tab.view.svg and "LlamaDecoderLayer ×2" in tab.view.svg
    assert tab.closure.disabled and tab.forward_controls.layout.display is None
    tab.inputs.value = "2x4"  # new inputs, new forward
    assert tab.status.value.startswith("forward of [2, 4] int64: ")
    tab.kind.value = "construction"
    assert "op:forward:" not in tab.view.svg and not tab.closure.disabled


def test_a_forward_opens_on_the_outline_top_to_bottom_fitted_until_a_depth_is_chosen(llama_ui):
    tab = llama_ui.graph_tab
    tab.inputs.value = "1x8"
    tab.kind.value = "forward"
    assert tab.graph_arguments() == {"focus": None, "outline": True, "rankdir": "TB"}  # FORWARD_FIRST_VIEW
    assert tab.rankdir.value == "TB" and tab.view.first_view == "fit"
    assert "<title>op:forward:" not in tab.view.svg and "LlamaDecoderLayer ×2" in tab.view.svg
    tab.depth.value = 3  # a depth asked for: drawn by depth, opened readable
    assert not tab.outline.value and tab.status.value.endswith("— whole module, depth 3")
    assert tab.view.first_view == "readable" and "<title>op:forward:" in tab.view.svg
    tab.outline.value = True
    assert tab.status.value.endswith("— whole module, outline; click a \"×N\" node to unfold it")
    llama_ui.select("model.layers.1")  # a selected module is drawn by depth, as in construction
    assert tab.status.value.endswith("— model.layers.1, depth 6")
    tab.kind.value = "construction"  # each kind keeps its direction
    assert tab.rankdir.value == "LR" and "rankdir" not in tab.graph_arguments()
    tab.rankdir.value = "TB"
    tab.kind.value = "forward"
    tab.rankdir.value = "LR"
    tab.kind.value = "construction"
    assert tab.rankdir.value == "TB"


def test_forward_mode_starts_a_token_model_on_a_short_sequence(llama_ui):
    llama_ui.graph_tab.kind.value = "forward"
    assert llama_ui.graph_tab.inputs.value == llama_ui.memory_tab.shapes.value == "1x16"


def test_unfolding_and_clicking_in_the_forward(llama_ui):
    tab = llama_ui.graph_tab
    tab.inputs.value = "1x8"
    tab.kind.value = "forward"
    tab.view.clicked = "module:model.layers.0"  # the "LlamaDecoderLayer ×2" node
    assert tab.unfolded == {"model.layers"} and "<title>module:model.layers.1</title>" in tab.view.svg
    q = mm_index(tab.forward, "model.layers.0.self_attn.q_proj")
    tab.view.clicked = f"op:forward:{q}"
    assert tab.status.value == (f"op {q}: mm in model.layers.0.self_attn.q_proj (Linear) · [8, 32] float32, "
                                "[32, 32] float32 → [8, 32] float32 · 16.4 kFLOP · creates 1.0 KiB")
    assert tab.view.selected == f"op:forward:{q}" and tab.view.clicked == ""
    assert llama_ui.tree.checked == []  # an op selects no module
    tab.view.clicked = "module:model.layers.1"  # a plain summary: selects, and the forward focuses on it
    assert llama_ui.tree.active == "model.layers.1"
    assert tab.status.value.endswith("— model.layers.1, depth 5")  # depth 3 + the slider's 2
    assert [button.description for button in tab.breadcrumb.children] == ["(root)", "model", "layers", "1"]
    tab.view.clicked = "tensor:model.layers.1.mlp.up_proj.weight"  # parameters open as in construction
    assert llama_ui.tensors_tab.table.selected == "model.layers.1.mlp.up_proj.weight"


def test_search_lights_up_forward_ops(llama_ui):
    tab = llama_ui.graph_tab
    tab.inputs.value = "1x8"
    tab.kind.value = "forward"
    llama_ui.search("mm")
    forward = tab.forward
    expected = [f"op:forward:{i}" for i in forward.ops.index[forward.ops["op"] == "mm"]]
    assert len(expected) == 15  # 7 projections in each of 2 layers, and lm_head
    assert [name for name in tab.view.highlighted if name.startswith("op:forward:")] == expected
    llama_ui.search("")
    assert tab.view.highlighted == []


def test_export_saves_the_forward_drawing(llama_ui):
    tab = llama_ui.graph_tab
    tab.inputs.value = "1x8"
    tab.kind.value = "forward"
    name, data = llama_ui.export_bar.produce("graph", "svg")  # what the export buttons call
    assert name == "LlamaForCausalLM-all-forward.svg"
    assert b"<title>module:model.layers.0</title>" in data and b"<title>op:forward:" not in data  # the outline
    assert llama_ui.export_bar.produce("table", "csv")[0] == "LlamaForCausalLM-tensors.csv"  # tables as before
    tab.kind.value = "construction"
    assert llama_ui.export_bar.produce("graph", "svg")[0] == "LlamaForCausalLM-all-graph.svg"


def test_forward_colours_paint_modules_by_flops_and_give_the_overlay_back(llama_ui):
    tab = llama_ui.graph_tab
    tab.inputs.value = "1x8"
    tab.kind.value = "forward"
    explorer_colours = dict(tab.view.module_colours)
    tab.forward_colour.value = "flops"
    colours = tab.view.module_colours
    assert colours[""] == HEAT[-1]  # the whole model does the most
    assert colours["model.layers.0.input_layernorm"] == NONE  # counts no FLOPs
    tab.forward_colour.value = ""
    assert tab.view.module_colours == explorer_colours


def test_unreadable_forward_inputs_are_reported(llama_ui):
    tab = llama_ui.graph_tab
    tab.inputs.value = "1xq"
    tab.kind.value = "forward"
    assert tab.status.value == "graph failed: ValueError: cannot read '1xq' as a shape (write 1x16 or (1, 16))"
    assert tab.view.svg == ""


def test_heat_colours_use_a_log_scale():
    assert heat_colours({"a": 1, "b": 10, "c": 100_000, "d": 0}) == {
        "a": HEAT[0], "b": HEAT[1], "c": HEAT[-1], "d": NONE}


def test_describe_forward_op_names_op_module_shapes_and_cost():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    forward = explorer.forward_graph(model, (4, 3))
    assert describe_forward_op(forward, 1) == (
        "op 1: addmm in 0 (Linear) · [2] float32, [4, 3] float32, [3, 2] float32 → [4, 2] float32 · "
        "48 FLOP · creates 32 B")
