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


@pytest.fixture
def one_ns_per_byte(monkeypatch):
    """Wasted writes cost exactly 1 ns per byte (the measured estimate varies with the machine)."""
    monkeypatch.setattr("explorer.analysis.init_report.write_seconds_per_byte", lambda: 1e-9)


def test_summary_counts_defects_first_then_waste_with_its_bytes_and_time(one_ns_per_byte):
    module = deferred_init(Flagged)
    report = explorer.inspect(module).init
    assert report.flag_counts() == {"uninitialized": 1, "overwritten": 3}
    assert report.summary() == (
        "Flagged: 6 tensors; 1 defect (1 uninitialized); waste: 3 overwritten (40 B of dead writes, ~40.0 ns)"
    )
    assert repr(report) == report.summary()


def test_summary_of_a_clean_module():
    module = deferred_init(nn.Linear, 2, 2)
    assert explorer.inspect(module).init.summary() == "Linear: 2 tensors; 0 defects"


def test_html_colours_rows_by_severity_and_escapes_text():
    module = deferred_init(Flagged)
    html = explorer.inspect(module).init._repr_html_()
    assert html.startswith("<div class='explorer-init'><p><b>Flagged: 6 tensors; 1 defect (1 uninitialized)")
    assert html.count('<tr style="background:#f8d7da">') == 1  # the defect: red
    assert html.count('<tr style="background:#e8edf5">') == 3  # the waste: blue-grey
    assert "<td>raw</td><td>Flagged</td><td>uninitialized</td>" in html
    assert "<td>uninitialized</td><td>defect</td>" in html


def test_init_after_the_module_is_gone_raises():
    inspection = explorer.inspect(deferred_init(nn.Linear, 2, 2))
    gc.collect()
    with pytest.raises(ReferenceError, match="^Inspection.init: the inspected Linear no longer exists$"):
        inspection.init
