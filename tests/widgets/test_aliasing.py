"""Opening a tensor lights up every name on its storage: tree, tensors table, graph, details pane."""

from __future__ import annotations


def test_a_tied_weight_lights_up_its_twin_everywhere(ui):
    ui.tensors_tab.table.selected = "head.weight"  # what clicking the row sends
    assert ui.sharers == ["embed.weight", "head.weight"]
    assert ui.tree.aliases == ["embed", "head"]
    assert ui.tensors_tab.table.highlighted == ["embed.weight", "head.weight"]
    assert ui.graph_tab.view.aliases == ["tensor:embed.weight", "tensor:head.weight"]
    assert ui.details.sharers_table.row_keys == ["embed.weight", "head.weight"]
    assert ui.details.sharers_table.rows[0] == ["embed.weight", "(10, 4)", "(4, 1)", "0", "float32", "0–160 (160 B)"]


def test_a_view_shows_its_offset_and_the_bytes_it_covers_in_the_strip(ui):
    ui.show_tensor("window")  # positions[1:3] of an int64 arange(4)
    assert ui.details.sharers_table.rows == [
        ["positions", "(4,)", "(1,)", "0", "int64", "0–32 (32 B)"],
        ["window", "(2,)", "(1,)", "1", "int64", "8–24 (16 B)"],
    ]
    strip = ui.details.strip.value
    assert "storage: 32 B, 2 names" in strip
    assert 'data-name="window" data-start="8" data-end="24"' in strip
    assert 'style="left:25.000%;width:50.000%"' in strip
    assert ui.tree.aliases == [""]  # both are root buffers
