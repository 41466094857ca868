"""InitReport (Inspection.init): the one-line summary, the HTML display, the weak module reference."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import explorer
from explorer import deferred_init, init_report


class Flagged(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(4)  # running stats written twice
        self.raw = nn.Parameter(torch.empty(2, 3))  # never written


def test_inspection_init_is_the_init_report_table():
    module = deferred_init(Flagged)
    report = explorer.inspect(module).init
    expected = init_report(module)
    assert report.table[["name", "init", "flags"]].equals(expected[["name", "init", "flags"]])


def test_summary_counts_each_flag_and_the_dead_bytes():
    module = deferred_init(Flagged)
    report = explorer.inspect(module).init
    assert report.flag_counts() == {"uninitialized": 1, "overwritten": 3}
    assert report.summary() == "Flagged: 6 tensors; 1 uninitialized, 3 overwritten (40 B of dead writes)"
    assert repr(report) == report.summary()


def test_summary_of_a_clean_module():
    module = deferred_init(nn.Linear, 2, 2)
    assert explorer.inspect(module).init.summary() == "Linear: 2 tensors; no flags"


def test_html_highlights_flagged_rows_and_escapes_text():
    module = deferred_init(Flagged)
    html = explorer.inspect(module).init._repr_html_()
    assert html.startswith("<div class='explorer-init'><p><b>Flagged: 6 tensors; 1 uninitialized")
    assert html.count('<tr style="background:#fff3cd">') == 4
    assert "<td>raw</td><td>Flagged</td><td>uninitialized</td>" in html


def test_init_after_the_module_is_gone_raises():
    inspection = explorer.inspect(deferred_init(nn.Linear, 2, 2))
    gc.collect()
    with pytest.raises(ReferenceError, match="^Inspection.init: the inspected Linear no longer exists$"):
        inspection.init
