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
