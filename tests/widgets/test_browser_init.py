"""The Init tab in JupyterLab in Chromium: flags counted, a class opened, a tensor's histogram drawn.

Opens a notebook written here (a small model with an uninitialized parameter, running statistics
written twice, and a materialized Linear), clicks the Init tab, the `Linear` class and its weight,
then the `BatchNorm1d` class, and checks what the page draws against what the kernel holds. The
screenshot is docs/init.png (the README shows it).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.support.lab import (
    KERNEL_REPLY_TIMEOUT_MS,
    doc_screenshot,
    kernel_answer,
    wait_for_widget_or_cell_error,
)

AUDITED = """import torch, widgets, explorer
from torch import nn

class Audited(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(256, 128)
        self.norm = nn.BatchNorm1d(128)          # running stats written twice
        self.raw = nn.Parameter(torch.empty(4, 8))  # never written

torch.manual_seed(0)
model = explorer.deferred_init(Audited)
explorer.materialize_module(model.proj)
ui = widgets.ExplorerWidget(model)
ui"""
NOTEBOOK_NAME, NOTEBOOK_CELLS = "audited.ipynb", [AUDITED]  # what `notebook_page` opens


@pytest.mark.browser
@pytest.mark.slow
def test_init_tab_counts_flags_and_draws_a_histogram(notebook_page: Page) -> None:
    page = notebook_page
    try:
        wait_for_widget_or_cell_error(page, page.locator(".de-tabs"))
        page.locator(".de-tabs .lm-TabBar-tab", has_text=re.compile(r"^\s*Init\s*$")).click()
        flags = page.locator(".de-init-flags .de-init-flag")
        expect(flags).to_have_count(2, timeout=KERNEL_REPLY_TIMEOUT_MS)
        expect(page.locator(".de-init-flag[data-flag='uninitialized']")).to_have_attribute("data-count", "1")
        expect(page.locator(".de-init-flag[data-flag='overwritten']")).to_have_attribute("data-count", "3")
        expect(page.locator(".de-init-defects")).to_have_text("defects: 1")
        expect(page.locator(".de-init-table .de-table-row")).to_have_count(8)
        page.locator('.de-init-classes .de-table-row[data-key="Linear"]').click()
        rows = page.locator(".de-init-table .de-table-row")
        expect(rows).to_have_count(2, timeout=KERNEL_REPLY_TIMEOUT_MS)
        page.locator('.de-init-table .de-table-row[data-key="proj.weight"]').click()
        histogram = page.locator(".de-init-histogram-box svg.de-init-histogram")
        expect(histogram).to_be_visible(timeout=KERNEL_REPLY_TIMEOUT_MS)
        expect(histogram.locator("rect.de-init-bar")).to_have_count(40)
        expect(histogram.locator("polyline.de-init-density")).to_have_count(1)
        expect(histogram).to_contain_text("proj.weight: uniform(-0.0625, 0.0625)")
        answer = kernel_answer(
            page,
            'print("init:", ui.init_tab.classes.selected, ui.init_tab.table.selected, ui.init_tab.table.row_keys)',
            "init:",
        )
        assert answer == "init: Linear proj.weight ['proj.weight', 'proj.bias']"
        # the flagged rows of another class are marked (blue-grey: waste, written twice); the histogram stays
        page.locator('.de-init-classes .de-table-row[data-key="BatchNorm1d"]').click()
        expect(rows).to_have_count(5, timeout=KERNEL_REPLY_TIMEOUT_MS)
        running_mean = page.locator('.de-init-table .de-table-row[data-key="norm.running_mean"]')
        expect(running_mean).to_have_css("border-left-color", "rgb(141, 160, 203)")
        expect(running_mean).to_contain_text("overwritten")
        expect(histogram).to_be_visible()
    finally:
        tab = page.locator(".de-init-tab")
        if tab.count():
            tab.first.scroll_into_view_if_needed()
        page.screenshot(path=str(doc_screenshot("init.png")))
