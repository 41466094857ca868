"""Ops tab: recorded ops of the selected modules, filtered by kind."""


def test_ops_follow_the_selection(ui):
    ui.select("blocks.1.norm")
    table = ui.ops_tab.table
    assert table.row_keys == ["0:45", "0:46", "0:47", "0:48", "0:49", "0:50"]
    assert [(row[1], row[2]) for row in table.rows] == [
        ("aten.empty.memory_format", "factory"), ("aten.detach.default", "view"),
        ("aten.empty.memory_format", "factory"), ("aten.detach.default", "view"),
        ("aten.fill_.Scalar", "in-place"), ("aten.zero_.default", "in-place")]
    assert table.rows[1][4] == "blocks.1.norm.weight"  # outputs: the parameter's name


def test_a_tied_weight_brings_the_ops_that_built_it(ui):
    ui.select("head")
    assert [row[1] for row in ui.ops_tab.table.rows] == [
        "aten.empty.memory_format", "aten.detach.default", "aten.normal_.default"]
    assert ui.ops_tab.table.rows[0][6] == "embed, head"


def test_root_buffers_ops_name_the_root(ui):
    ui.select("")
    assert [(row[1], row[6]) for row in ui.ops_tab.table.rows[-2:]] == [
        ("aten.arange.default", "(root)"), ("aten.slice.Tensor", "(root)")]
    # ops 51-53 built head's own first weight, replaced by the tie: they serve no module, so only the
    # unfiltered view (nothing selected) lists them
    assert len(ui.ops_tab.table.row_keys) == 53 and "0:51" not in ui.ops_tab.table.row_keys


def test_kind_filter(ui):
    ui.select("blocks.0")
    ui.ops_tab.kind_filter.value = "random"
    assert ui.ops_tab.table.row_keys == ["0:7", "0:8", "0:13", "0:14", "0:19", "0:20"]
    ui.ops_tab.kind_filter.value = "in-place"
    assert [row[1] for row in ui.ops_tab.table.rows] == ["aten.fill_.Scalar", "aten.zero_.default"]


def test_nothing_selected_lists_every_op(ui):
    assert len(ui.ops_tab.table.row_keys) == 56
