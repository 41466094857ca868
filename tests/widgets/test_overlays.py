"""Overlays: the tree's swatches and the graph's module fills, by state, bytes, dtype or device."""

from __future__ import annotations

import pandas as pd
import pytest

from widgets.overlays import HEAT, MIXED, NONE, overlay
from widgets.states import STATE_COLOURS


def test_state_is_the_default_and_every_module_gets_a_colour(ui):
    assert ui.overlay_mode.value == "state"
    assert set(ui.tree.colours) == {node["path"] for node in ui.tree.nodes}
    assert ui.tree.colours["embed"] == STATE_COLOURS["fake"] and ui.tree.colours["blocks.0.mlp.1"] == NONE
    assert 'data-label="fake"' in ui.legend.value


def test_bytes_is_a_log_heat_map_counting_shared_storage_once(ui):
    ui.overlay_mode.value = "bytes"  # what the dropdown sends
    colours = ui.tree.colours
    # the root holds 1,024 B (the tied embed/head weight counted once): the largest, darkest
    assert ui.inspection.modules.set_index("name").loc["", "bytes"] == 1024 == 160 + 2 * 416 + 32
    assert colours[""] == HEAT[-1] and colours["blocks.0.mlp.1"] == NONE
    assert colours["blocks.0.norm"] == HEAT[0]  # 32 B: the smallest
    assert ui.graph_tab.view.module_colours == colours
    assert ui.overlay.legend[0] == ("32 B – 63 B", HEAT[0])


def test_dtype_and_device_are_categories_with_mixed(ui):
    ui.set_overlay("dtype")
    assert ui.tree.colours["embed"] != ui.tree.colours[""] == MIXED  # float32 weights + int64 buffers
    assert [label for label, _ in ui.overlay.legend] == ["float32", "mixed dtypes", "no bytes"]
    ui.set_overlay("device")
    assert [label for label, _ in ui.overlay.legend] == ["cpu", "no bytes"]


def test_materializing_recolours_the_state_overlay(ui):
    ui.select("blocks.0.norm")
    ui.materialize_selected(wait=True)
    assert ui.tree.colours["blocks.0.norm"] == STATE_COLOURS["materialized"]
    assert ui.tree.colours["blocks.0"] == STATE_COLOURS["partly"]


def test_unknown_modes_are_refused():
    with pytest.raises(ValueError, match="unknown overlay 'size'; choose one of state, bytes, dtype, device"):
        overlay(pd.DataFrame(), "size")


def test_checkpoint_backed_modules_are_disk_in_the_state_overlay_and_its_legend(disk_ui):
    colours = disk_ui.tree.colours
    assert colours["model.layers.0"] == colours[""] == STATE_COLOURS["disk"]  # the root: 99.9% from disk
    assert colours["model.rotary_emb"] == STATE_COLOURS["fake"]  # computed buffers, in no file
    assert disk_ui.overlay.legend == [("fake", STATE_COLOURS["fake"]), ("disk", STATE_COLOURS["disk"]),
                                      ("empty", STATE_COLOURS["empty"])]  # the activations hold nothing
    assert 'data-label="disk"' in disk_ui.legend.value
