"""The Memory tab's Parallel layouts panel in JupyterLab in Chromium: which layout fits on 4 GPUs?

Opens a notebook written here (a small Llama under deferred init: hidden 64, 4 heads, 2 key-value
heads, 6 layers), opens the Memory tab, fills the panel as a person does (4 GPUs of 2 MiB, inputs
2x16, FSDP 1 and 4, TP 1, 2 and 4, PP 1, no checkpointing), clicks "Plan layouts", reads the
table (FSDP 4 fits; DP 2 × TP 2 and DP 4 are over budget; TP 4 cannot run with 2 key-value heads),
clicks the first row and reads its bar, its peak by module and its torchtitan export from the page,
then asks the kernel what the panel computed. The screenshot is docs/plan.png under `make screenshots`.
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

PLAN_TIMEOUT_MS = 2 * KERNEL_REPLY_TIMEOUT_MS  # fake steps per measured layout on a loaded 2-core machine

SMALL_LLAMA = """import transformers, widgets
config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
ui = widgets.explore(transformers.LlamaForCausalLM, config)
ui"""
NOTEBOOK_NAME, NOTEBOOK_CELLS = "plan.ipynb", [SMALL_LLAMA]  # what `notebook_page` opens
FIELDS = {"gpus": "4", "memory": "2MiB", "shapes": "2x16", "fsdp": "1, 4", "tp": "1, 2, 4", "pp": "1", "ac": "none"}


@pytest.mark.browser
@pytest.mark.slow
def test_parallel_layouts_panel_plans_a_small_llama_on_4_gpus(notebook_page: Page) -> None:
    page = notebook_page
    panel = page.locator(".de-parallel-panel")
    try:
        wait_for_widget_or_cell_error(page, page.locator(".de-tree-node"))
        page.locator(".de-tabs .lm-TabBar-tab", has_text=re.compile(r"^\s*Memory\s*$")).click()
        for name, text in FIELDS.items():
            field = panel.locator(f".de-parallel-{name} input")
            field.fill(text)
            field.press("Enter")
        button = panel.locator(".de-parallel-button")
        button.click()
        expect(button).to_be_disabled()  # busy while the kernel plans; the status line says so
        expect(panel.locator(".de-parallel-status")).to_have_text(re.compile(r"^planning: "))
        expect(panel.locator(".de-parallel-status")).to_have_text(
            "1 of 4 layouts fit on 4 × 2.0 MiB; 2 over budget, 1 cannot run (see problems)", timeout=PLAN_TIMEOUT_MS
        )
        rows = panel.locator(".de-parallel-table .de-table-row")
        expect(rows).to_have_count(4)
        expect(rows.first).to_contain_text("FSDP 4 · TP 1 · PP 1 · AC none · mb 2 × 1")
        expect(rows.last).to_contain_text("2 key-value heads are not divisible by TP 4")  # an invalid layout says why
        rows.first.click()
        expect(panel.locator(".de-parallel-layout")).to_have_text(
            "FSDP 4 · TP 1 · PP 1 · AC none · mb 2 × 1: fits on 4 × 2.0 MiB"
        )
        segments = panel.locator(".de-parallel-bars .train-bar-segment")
        expect(segments.first).to_be_visible()
        assert segments.first.get_attribute("data-category") == "sharded_parameters"
        expect(panel.locator(".de-parallel-budget-line")).to_have_count(1)
        parts = panel.locator(".de-parallel-modules tr[data-part]")  # the peak by module, the largest first
        expect(parts.first).to_be_visible()
        assert parts.first.get_attribute("data-part") == "model.layers"
        titan = panel.locator(".de-parallel-torchtitan textarea")
        expect(titan).to_have_value(re.compile(r"data_parallel_shard_degree = 4\n"))
        answer = kernel_answer(
            page,
            "from explorer.analysis.layout_export import to_torchtitan\n"
            "p = ui.memory_tab.plan_panel; best = p.last_plan.best()\n"
            'print("plan:", best.layout.label(), p.torchtitan.value == to_torchtitan(best.layout), '
            "len(p.last_plan.results))",
            "plan:",
        )
        assert answer == "plan: FSDP 4 · TP 1 · PP 1 · AC none · mb 2 × 1 True 4"
    finally:
        panel.first.evaluate("element => element.scrollIntoView({block: 'start'})") if panel.count() else None
        page.screenshot(path=str(doc_screenshot("plan.png")))
