"""DataTable: Python sorts, cuts and formats; the browser draws `rows` and reports clicks."""

from __future__ import annotations

import pandas as pd

from widgets.table import DataTable


def test_every_synced_trait_says_what_it_is():
    helps = {name: trait.help for name, trait in DataTable.class_own_traits(sync=True).items()}
    assert sorted(helps) == [
        "ascending",
        "caption",
        "columns",
        "highlighted",
        "labels",
        "path_columns",
        "row_colours",
        "row_groups",
        "row_keys",
        "rows",
        "selected",
        "sort_by",
        "sortable",
    ]
    assert [name for name, text in helps.items() if not text] == []
    assert helps["labels"] == 'Header text per column ("" shows its name)'


def test_a_header_click_sorts_and_the_caption_says_how_many_rows_show():
    table = DataTable(limit=2)
    table.show(pd.DataFrame({"name": ["b", "a", "c"], "size": [2, 3, 1]}), ["name", "size"], key="name")
    assert (table.rows, table.caption) == ([["b", "2"], ["a", "3"]], "showing 2 of 3 rows (filter to narrow)")
    table.sort_by = "size"  # what a header click sends
    assert table.row_keys == ["c", "b"]


def test_name_is_the_path_column_unless_paths_names_others():
    table = DataTable()
    frame = pd.DataFrame({"name": ["a.0.w"], "module": ["a.0"], "n": [1]})
    table.show(frame, ["name", "module", "n"], key="name")
    assert table.path_columns == ["name"]
    table.show(frame, ["module", "n"], key="name", paths=("name", "module"))
    assert table.path_columns == ["module"]


LAYER = [f"model.layers.3.self_attn.{leaf}_proj.weight" for leaf in "qkvo"] + ["model.norm.weight"]


def test_grouped_rows_in_module_order_come_in_runs_under_their_module():
    table = DataTable(group_rows=True)
    frame = pd.DataFrame({"name": LAYER, "n": [4, 1, 3, 2, 5]})
    table.show(frame, ["n", "name"], key="name")
    assert table.row_groups == [{"prefix": "model.layers.3.self_attn", "start": 0, "stop": 4}]
    table.selected = table.row_keys[1]  # what a click on the second row under the header sends
    assert table.selected == "model.layers.3.self_attn.k_proj.weight"
    table.ascending = False  # sorted by name, a module's rows stay together
    table.sort_by = "name"
    assert table.row_keys[0] == "model.norm.weight"
    assert table.row_groups == [{"prefix": "model.layers.3.self_attn", "start": 1, "stop": 5}]


def test_rows_sorted_by_another_column_or_not_grouping_have_no_groups():
    table = DataTable(group_rows=True)
    table.show(pd.DataFrame({"name": LAYER, "n": [4, 1, 3, 2, 5]}), ["name", "n"], key="name")
    table.sort_by = "n"
    assert table.row_keys[:2] == [LAYER[1], LAYER[3]] and table.row_groups == []
    table.sort_by = ""
    assert len(table.row_groups) == 1
    table.group_rows = False
    assert table.row_groups == []
    assert DataTable().group_rows is False  # the ops, init and memory tables stay flat
