"""Init tab (kernel side): classes grouped and counted, flags marked and counted, histograms on click."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import widgets
from explorer import deferred_init, materialize_module
from widgets.explorer_widget import TAB_TITLES
from widgets.init_tab import SEVERITY_COLOURS, InitTab


class Audited(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 32)
        self.norm = nn.BatchNorm1d(32)  # running stats written twice
        self.raw = nn.Parameter(torch.empty(2, 3))  # never written


def test_classes_are_grouped_with_their_defect_and_waste_counts_and_inits():
    tab = InitTab(deferred_init(Audited))
    assert tab.classes.row_keys == ["Audited", "BatchNorm1d", "Linear"]
    assert tab.classes.rows == [
        ["Audited", "1", "1", "0", "uninitialized"],
        ["BatchNorm1d", "5", "0", "3", "constant(1.0), zeros"],
        ["Linear", "2", "0", "0", "uniform(-0.125, 0.125)"],
    ]


@pytest.fixture
def one_ns_per_byte(monkeypatch):
    """Wasted writes cost exactly 1 ns per byte (the measured estimate varies with the machine)."""
    monkeypatch.setattr("explorer.analysis.init_report.write_seconds_per_byte", lambda: 1e-9)


def test_header_counts_defects_first_then_waste_with_its_cost(one_ns_per_byte):
    tab = InitTab(deferred_init(Audited))
    # running_mean and running_var: 32 float32 each, num_batches_tracked one int64, written twice
    assert tab.header.value == (
        "<div class='de-init-flags'>"
        "<span class='de-init-defects' data-count='1' style='font-weight:bold;margin-right:8px'>defects: 1</span>"
        "<span class='de-init-flag' data-flag='uninitialized' data-severity='defect' data-count='1' "
        "style='border-left:4px solid #d62728;padding:0 6px;margin-right:8px'>uninitialized: 1</span>"
        "<span class='de-init-flag' data-flag='overwritten' data-severity='waste' data-count='3' "
        "style='border-left:4px solid #8da0cb;padding:0 6px;margin-right:8px'>waste: overwritten 3 (264 B, ~0.3 µs)"
        "</span></div>"
    )


def test_header_of_a_clean_module_says_no_defects():
    tab = InitTab(deferred_init(nn.Linear, 2, 2))
    assert tab.header.value == (
        "<div class='de-init-flags'><span class='de-init-defects' data-count='0' "
        "style='font-weight:bold;margin-right:8px'>defects: 0</span></div>"
    )


def test_flagged_rows_are_coloured_by_severity():
    tab = InitTab(deferred_init(Audited))
    colours = dict(zip(tab.table.row_keys, tab.table.row_colours))
    assert colours["raw"] == SEVERITY_COLOURS["defect"] == "#d62728"
    assert colours["norm.running_mean"] == SEVERITY_COLOURS["waste"] == "#8da0cb"
    assert colours["proj.weight"] == ""


def test_clicking_a_class_keeps_its_tensors_and_flagged_only_filters():
    tab = InitTab(deferred_init(Audited))
    tab.classes.selected = "BatchNorm1d"
    assert tab.table.row_keys == ["norm.weight", "norm.bias", "norm.running_mean", "norm.running_var",
                                  "norm.num_batches_tracked"]
    tab.flagged_only.value = True
    assert tab.table.row_keys == ["norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]


def test_a_fake_tensor_asks_to_be_materialized():
    tab = InitTab(deferred_init(Audited))
    tab.table.selected = "proj.weight"
    assert tab.histogram.value == ("<div class='de-init-no-values'>proj.weight is fake: materialize it to see "
                                   "its values</div>")


def test_a_tensor_materialized_on_meta_says_it_has_no_values_to_draw():
    module = deferred_init(Audited)
    tab = InitTab(module)
    materialize_module(module.proj, device="meta")
    tab.refresh()
    tab.table.selected = "proj.weight"
    assert tab.histogram.value == ("<div class='de-init-no-values'>proj.weight was materialized on meta (shapes "
                                   "only): materialize it on a device to see its values</div>")


def test_a_materialized_tensor_shows_its_histogram_with_the_expected_density():
    torch.manual_seed(0)
    module = deferred_init(Audited)
    tab = InitTab(module)
    materialize_module(module.proj)
    tab.refresh()
    tab.table.selected = "proj.weight"
    svg = tab.histogram.value
    assert svg.startswith("<svg class='de-init-histogram'")
    assert "proj.weight: uniform(-0.125, 0.125)" in svg
    assert svg.count("class='de-init-bar'") == 40
    assert svg.count("class='de-init-density'") == 1


def test_the_explorer_has_an_init_tab():
    ui = widgets.ExplorerWidget(deferred_init(Audited))
    assert TAB_TITLES[-1] == "Init"
    assert ui.tabs.children[-1] is ui.init_tab and ui.tabs.titles[-1] == "Init"
    ui.close()


def test_a_large_module_is_audited_when_the_tab_is_first_shown():
    tab = InitTab(deferred_init(Audited), eager_limit=3)
    assert not tab.audited and tab.table.row_keys == []
    assert "not audited yet" in tab.header.value
    tab.set_active(False)
    assert not tab.audited
    tab.set_active(True)
    assert tab.audited and len(tab.table.row_keys) == 8
