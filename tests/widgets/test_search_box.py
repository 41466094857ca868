"""The explorer's search: what typing and Enter (the SearchBox's intents) do to every view."""

from __future__ import annotations


def test_typing_filters_the_tables_marks_the_tree_and_lights_the_graph(ui):
    ui.search_box.query = "blocks.1.mlp"  # what typing sends
    assert ui.search_box.counts == "4 modules · 4 tensors · 12 ops"
    assert ui.tree.matches == ["blocks.1.mlp", "blocks.1.mlp.0", "blocks.1.mlp.1", "blocks.1.mlp.2"]
    assert {"blocks", "blocks.1", "blocks.1.mlp"} <= set(ui.tree.expanded)
    assert ui.tensors_tab.table.row_keys == ["blocks.1.mlp.0.weight", "blocks.1.mlp.0.bias", "blocks.1.mlp.2.weight",
                                             "blocks.1.mlp.2.bias"]
    assert len(ui.ops_tab.table.row_keys) == 12
    assert "module:blocks.1.mlp" in ui.graph_tab.view.highlighted
    assert "tensor:blocks.1.mlp.2.bias" in ui.graph_tab.view.highlighted


def test_enter_walks_the_matches_and_wraps(ui):
    ui.search("window")
    assert ui.search_result.targets() == [("tensor", "window")]
    ui.search_box._on_front_end_msg(ui.search_box, {"type": "next"}, [])  # what Enter sends
    assert ui.tensor == "window" and ui.details.title.value == "window"
    assert ui.search_box.counts == "0 modules · 1 tensor · 0 ops — 1 of 1: window"
    ui.search("norm")
    assert ui.step_match() == ("module", "blocks.0.norm")
    assert ui.selection == ["blocks.0.norm"]
    assert ui.step_match() == ("module", "blocks.1.norm")
    assert ui.step_match(-1) == ("module", "blocks.0.norm")  # Shift+Enter: back
    assert ui.step_match(-1)[0] == "op"  # wraps to the last match
    assert ui.tabs.selected_index == 1 and ui.ops_tab.table.selected


def test_regex_errors_show_in_the_box_and_an_empty_query_clears(ui):
    ui.search(r"attn\.(weight", regex=True)
    assert ui.search_box.error and ui.search_box.counts.startswith("invalid regular expression")
    ui.search(r"attn\.(weight|bias)$", regex=True)
    assert not ui.search_box.error and ui.tensors_tab.table.row_keys == [
        "blocks.0.attn.weight", "blocks.0.attn.bias", "blocks.1.attn.weight", "blocks.1.attn.bias"]
    ui.search("")
    assert ui.search_box.counts == "" and ui.tree.matches == [] and ui.graph_tab.view.highlighted == []
    assert len(ui.tensors_tab.table.row_keys) == 20


def test_every_synced_trait_says_what_it_is():
    from widgets.search_box import SearchBox

    helps = {name: trait.help for name, trait in SearchBox.class_own_traits(sync=True).items()}
    assert sorted(helps) == ["counts", "error", "query", "regex"]
    assert [name for name, text in helps.items() if not text] == []
    assert helps["regex"] == "Whether `query` is a regular expression (else a substring)"
