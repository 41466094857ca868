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
    ui.graph_tab.rankdir.value = "TB"
    assert graph_stand_in.calls[-1] == {"focus": None, "depth": 2, "rankdir": "TB"}
    ui.select("blocks.0.mlp")
    crumbs = ui.graph_tab.breadcrumb.children
    assert [c.description for c in crumbs] == ["(root)", "blocks", "0", "mlp"]
    assert [c.tooltip for c in crumbs] == ["(root)", "blocks", "blocks.0", "blocks.0.mlp"]
    crumbs[1].click()  # what clicking "blocks" in the breadcrumb does
    assert ui.tree.active == "blocks" and graph_stand_in.calls[-1]["focus"] == "blocks"
