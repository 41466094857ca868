"""Export buttons: the current diagram and the current table, saved and sent for download."""

from __future__ import annotations

import pandas as pd
import pytest


@pytest.fixture
def exporting(ui, tmp_path):
    ui.export_bar.folder = tmp_path
    sent = []
    ui.export_bar.send = lambda content, buffers=None: sent.append((content, buffers))
    return ui, tmp_path, sent


def test_the_diagram_exports_as_svg_png_and_standalone_html(exporting):
    ui, folder, sent = exporting
    ui.select("blocks.0")
    svg = ui.export("graph", "svg")
    assert svg == folder / "Net-blocks.0-graph.svg"
    assert svg.read_text().lstrip().startswith("<?xml") and "<title>tensor:blocks.0.attn.weight</title>" in svg.read_text()
    png = ui.export("graph", "png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html_path = ui.export("graph", "html")
    page = html_path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "<svg" in page
    assert sent[0][0] == {"type": "download", "filename": "Net-blocks.0-graph.svg", "mime": "image/svg+xml"}
    assert sent[0][1] == [svg.read_bytes()]
    assert ui.export_bar.status == f"saved {html_path} ({len(page.encode()):,} bytes)"


def test_the_current_table_exports_every_filtered_row_sorted_as_shown(exporting):
    ui, folder, _ = exporting
    ui.select("blocks.1")
    ui.tensors_tab.table.sort_by, ui.tensors_tab.table.ascending = "bytes", False
    frame = pd.read_csv(ui.export("table", "csv"))
    assert frame.columns.tolist() == ["name", "shape", "stride", "storage_offset", "dtype", "device", "state",
                                      "alias_group", "bytes"]
    assert frame["name"].tolist()[:2] == ["blocks.1.mlp.0.weight", "blocks.1.mlp.2.weight"]
    assert frame["bytes"].tolist() == sorted(frame["bytes"].tolist(), reverse=True) and len(frame) == 8
    parquet = pd.read_parquet(ui.export("table", "parquet"))
    assert parquet["name"].tolist() == frame["name"].tolist() and parquet["shape"].tolist()[0] == "(8, 4)"
    ui.tabs.selected_index = 1  # the Ops tab
    assert ui.export("table", "csv").name == "Net-ops.csv"


def test_a_failed_export_is_reported_in_the_bar_and_unknown_formats_raise(exporting, monkeypatch):
    ui, _, _ = exporting
    monkeypatch.setattr("explorer.op_graph", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("dot crashed")))
    assert ui.export("graph", "svg") is None
    assert ui.export_bar.status == "export failed: RuntimeError: dot crashed"
    with pytest.raises(ValueError, match=r"cannot export graph as 'jpeg'"):
        ui.export("graph", "jpeg")


def test_every_synced_trait_says_what_it_is():
    from widgets.export_bar import ExportBar

    helps = {name: trait.help for name, trait in ExportBar.class_own_traits(sync=True).items()}
    assert helps == {"choices": '[target, format] per button, e.g. ["graph", "svg"]',
                     "status": "What the last export did: the path written, or why it failed"}
