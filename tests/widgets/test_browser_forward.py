"""The Graph tab's forward view in JupyterLab in Chromium: a 7B Llama's forward, unfolded and clicked.

Opens a notebook written here (the Llama-2-7B architecture under deferred init), types the dry-run
inputs in the Memory tab, switches the Graph tab to "forward", checks the 32 layers are drawn once
as "LlamaDecoderLayer ×32" at a readable scale, unfolds them by clicking, clicks lm_head's matrix
product and reads it back from the status line and the kernel, then clicks a layer to focus the
forward on it. The screenshot is docs/forward.png under `make screenshots` (the README shows it).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.support.lab import (
    KERNEL_REPLY_TIMEOUT_MS,
    doc_screenshot,
    graph_node,
    kernel_answer,
    wait_for_widget_or_cell_error,
)

LLAMA_7B = """import transformers, widgets
config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
ui = widgets.explore(transformers.LlamaForCausalLM, config)
ui"""
NOTEBOOK_NAME, NOTEBOOK_CELLS = "forward.ipynb", [LLAMA_7B]  # what `notebook_page` opens


def open_tab(page: Page, title: str) -> None:
    page.locator(".de-tabs .lm-TabBar-tab", has_text=re.compile(rf"^\s*{title}\s*$")).click()


@pytest.mark.browser
@pytest.mark.slow
def test_forward_view_unfolds_layers_and_reports_a_clicked_op(notebook_page: Page) -> None:
    page = notebook_page
    try:
        wait_for_widget_or_cell_error(page, page.locator(".de-tree-node"))
        open_tab(page, "Memory")
        page.locator(".de-memory-tab input[type=text]").first.fill("1x128")  # the dry-run inputs
        open_tab(page, "Graph")
        expect(page.locator(".de-graph-inputs input")).to_have_value("1x128", timeout=KERNEL_REPLY_TIMEOUT_MS)
        page.locator(".de-graph-kind button", has_text="forward").click()
        status = page.locator(".de-graph-status")
        expect(status).to_contain_text("forward of [1, 128] int64: ", timeout=KERNEL_REPLY_TIMEOUT_MS)
        folded = graph_node(page, "module:model.layers.0")
        expect(folded).to_contain_text("LlamaDecoderLayer ×32")
        expect(folded).to_contain_text("each: ")
        root = page.locator(".de-graph-root")
        expect(root).to_have_attribute("data-label-px", re.compile(r"^\d"), timeout=KERNEL_REPLY_TIMEOUT_MS)
        assert float(root.get_attribute("data-label-px")) >= 9.0  # the first view can be read

        folded.dispatch_event("click")  # "×32": draw the 32 layers one by one
        last_layer = page.locator(".de-graph g.node > title", has_text=re.compile(r"^module:model\.layers\.31$"))
        expect(last_layer).to_have_count(1, timeout=KERNEL_REPLY_TIMEOUT_MS)

        # lm_head's matrix product: the only `mm` drawn at depth 2 (the layers' are inside their nodes)
        product = page.locator(".de-graph g.node", has_text=re.compile(r"\b\d+: mm\b"))
        expect(product).to_have_count(1)
        product.dispatch_event("click")
        expect(status).to_have_text(
            re.compile(
                r"^op \d+: mm in lm_head \(Linear\) · \[128, 4096\] float32, \[4096, 32000\] float32 → "
                r"\[128, 32000\] float32 · 33\.6 GFLOP · creates 15\.6 MiB$"
            ),
            timeout=KERNEL_REPLY_TIMEOUT_MS,
        )
        expect(product).to_have_class(re.compile(r"\bde-graph-selected\b"), timeout=KERNEL_REPLY_TIMEOUT_MS)

        answer = kernel_answer(
            page,
            'g = ui.graph_tab; f = g.forward; i = int(g.view.selected.rpartition(":")[2]); '
            'print("forward:", g.kind.value, sorted(g.unfolded), f.owners[i], f.ops["flops"][i])',
            "forward:",
        )
        assert answer == f"forward: forward ['model.layers'] lm_head {2 * 128 * 4096 * 32000}"

        graph_node(page, "module:model.layers.1").dispatch_event("click")  # a layer: the forward focuses on it
        expect(status).to_contain_text("— model.layers.1, depth 5", timeout=KERNEL_REPLY_TIMEOUT_MS)
        expect(page.locator(".de-graph-crumb")).to_have_text(["(root)", "model", "layers", "1"])
        q_proj = graph_node(page, "tensor:model.layers.1.self_attn.q_proj.weight")
        expect(q_proj).to_contain_text("[4096, 4096] float32")
    finally:
        view = page.locator(".de-explorer")
        if view.count():
            view.first.evaluate("element => element.scrollIntoView({block: 'start'})")
        page.screenshot(path=str(doc_screenshot("forward.png")))
