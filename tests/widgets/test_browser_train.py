"""The Memory tab's Training step panel in JupyterLab in Chromium: will a 7B Llama train on 8 GPUs?

Opens a notebook written here (the Llama-2-7B architecture under deferred init), opens the Memory
tab, fills the Training step panel as a person does (inputs 1x512, AdamW, 8 devices, activation
checkpointing, 80GB each), clicks "Run training step", reads the verdict and the stacked bar from
the page and asks the kernel what the panel computed. The screenshot is docs/train.png under `make screenshots`.
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

STEP_TIMEOUT_MS = 3 * KERNEL_REPLY_TIMEOUT_MS  # a 7B step under FSDP on a loaded 2-core machine

LLAMA_7B = """import transformers, widgets
config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
ui = widgets.explore(transformers.LlamaForCausalLM, config)
ui"""
NOTEBOOK_NAME, NOTEBOOK_CELLS = "train.ipynb", [LLAMA_7B]  # what `notebook_page` opens


@pytest.mark.browser
@pytest.mark.slow
def test_training_step_panel_says_a_7b_llama_fits_on_8_gpus(notebook_page: Page) -> None:
    page = notebook_page
    panel = page.locator(".de-train-panel")
    try:
        wait_for_widget_or_cell_error(page, page.locator(".de-tree-node"))
        page.locator(".de-tabs .lm-TabBar-tab", has_text=re.compile(r"^\s*Memory\s*$")).click()
        panel.locator(".de-train-shapes input").fill("1x512")
        panel.locator("select").last.select_option("AdamW")
        world = panel.locator(".de-train-world-size input")
        world.fill("8")
        world.press("Enter")
        panel.get_by_text("activation checkpointing").click()
        panel.locator(".de-train-budget input").fill("80GB")
        panel.locator(".de-train-budget input").press("Enter")
        panel.locator(".de-train-button").click()
        verdict = panel.locator(".de-train-verdict")
        expect(verdict).to_have_text(
            re.compile(r"^fits on 8 × 80GB \(peak \d+\.\d GiB per device\); peak in the \w+$"), timeout=STEP_TIMEOUT_MS
        )
        segments = panel.locator(".de-train-bar .train-bar-segment")
        expect(segments.first).to_be_visible()
        categories = [s.get_attribute("data-category") for s in segments.all()]
        assert categories[0] == "sharded_parameters" and "optimizer_state" in categories
        expect(panel.locator(".de-train-table .de-table-row").first).to_be_visible()
        answer = kernel_answer(
            page,
            "s = ui.memory_tab.train_panel.last_step; "
            'print("train:", s.world_size, s.optimizer, s.activation_checkpointing, '
            's.fits("80GB"), len(s.modules), round(s.peak_bytes / 2**30, 1))',
            "train:",
        )
        shown = re.search(r"peak (\d+\.\d) GiB", verdict.inner_text()).group(1)
        # the root and its 32 decoder layers are the sharded modules the table lists
        assert answer == f"train: 8 AdamW True True 33 {shown}"
    finally:
        panel.first.evaluate("element => element.scrollIntoView({block: 'start'})") if panel.count() else None
        page.screenshot(path=str(doc_screenshot("train.png")))
