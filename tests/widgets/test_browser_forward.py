"""The Graph tab's forward view in JupyterLab in Chromium: a 7B Llama's forward, unfolded and clicked;
a 24-layer Qwen2's forward opening on the model's outline.

Opens a notebook written here (the Llama-2-7B architecture under deferred init), types the dry-run
inputs in the Memory tab, switches the Graph tab to "forward", checks the first view is the outline
with the 32 layers drawn once as "LlamaDecoderLayer ×32", unfolds them by clicking, turns the
outline off (drawn by depth, at a readable scale), clicks lm_head's matrix product and reads it
back from the status line and the kernel, then clicks a layer to focus the forward on it. The
screenshot is docs/forward.png under `make screenshots` (the README shows it).

The second test adds a Qwen2-0.5B-shaped explorer in a new cell and checks, at 1500 × 1100 with
the file browser open, that the forward's first paint shows the embedding, "Qwen2DecoderLayer ×24"
and lm_head inside the graph's visible box.
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
    run_new_cell,
    wait_for_widget_or_cell_error,
)

QWEN2_05B = """import transformers, widgets
cfg = transformers.Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
qwen = widgets.explore(transformers.Qwen2ForCausalLM, cfg)
qwen"""
# Each named node's box, and the graph viewport's (the visible part of the drawing), in the last explorer.
BOXES = """(names) => {
  const graph = [...document.querySelectorAll(".de-explorer")].pop().querySelector(".de-graph-viewport");
  const box = (element) => { const r = element.getBoundingClientRect();
                              return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; };
  const nodes = {};
  for (const node of graph.querySelectorAll("g.node")) {
    const title = node.querySelector(":scope > title").textContent.trim();
    if (names.includes(title)) nodes[title] = box(node);
  }
  return {viewport: box(graph), nodes};
}"""
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
        expect(status).to_contain_text("— whole module, outline", timeout=KERNEL_REPLY_TIMEOUT_MS)
        folded = graph_node(page, "module:model.layers.0")
        expect(folded).to_contain_text("LlamaDecoderLayer ×32")
        expect(folded).to_contain_text("each: ")
        expect(page.locator(".de-graph g.node > title", has_text=re.compile(r"^op:forward:"))).to_have_count(0)

        folded.dispatch_event("click")  # "×32": draw the 32 layers one by one
        last_layer = page.locator(".de-graph g.node > title", has_text=re.compile(r"^module:model\.layers\.31$"))
        expect(last_layer).to_have_count(1, timeout=KERNEL_REPLY_TIMEOUT_MS)
        page.locator(".de-graph-outline").click()  # outline off: drawn by depth, ops and all
        expect(status).to_contain_text("— whole module, depth 2", timeout=KERNEL_REPLY_TIMEOUT_MS)
        root = page.locator(".de-graph-root")
        expect(root).to_have_attribute("data-label-px", re.compile(r"^\d"), timeout=KERNEL_REPLY_TIMEOUT_MS)
        assert float(root.get_attribute("data-label-px")) >= 9.0  # a drawing by depth opens readable

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


@pytest.mark.browser
@pytest.mark.slow
def test_a_24_layer_forward_opens_on_the_models_outline_fitted_to_the_view(notebook_page: Page) -> None:
    page = notebook_page
    page.set_viewport_size({"width": 1500, "height": 1100})
    wait_for_widget_or_cell_error(page, page.locator(".de-tree-node"))
    page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id="filebrowser"]').click()
    expect(page.locator(".jp-FileBrowser")).to_be_visible()
    run_new_cell(page, QWEN2_05B)
    explorers = page.locator(".de-explorer")
    expect(explorers).to_have_count(2, timeout=KERNEL_REPLY_TIMEOUT_MS)
    qwen = explorers.last
    qwen.locator(".de-tabs .lm-TabBar-tab", has_text=re.compile(r"^\s*Graph\s*$")).click()
    qwen.locator(".de-graph-kind button", has_text="forward").click()
    status = qwen.locator(".de-graph-status")
    expect(status).to_contain_text("forward of [1, 16] int64: ", timeout=KERNEL_REPLY_TIMEOUT_MS)
    expect(status).to_contain_text("— whole module, outline")
    folded = qwen.locator(".de-graph g.node", has=page.locator('xpath=./*[local-name()="title" and '
                                                                'normalize-space()="module:model.layers.0"]'))
    expect(folded).to_contain_text("Qwen2DecoderLayer ×24")
    qwen.locator(".de-graph-viewport").evaluate("element => element.scrollIntoView({block: 'center'})")
    page.wait_for_timeout(500)  # the sidebar's relayout and the scroll, then the view's refit
    wanted = ["module:model.embed_tokens", "module:model.layers.0", "module:model.norm", "module:lm_head"]
    boxes = page.evaluate(BOXES, wanted)
    view = boxes["viewport"]
    assert sorted(boxes["nodes"]) == sorted(wanted), boxes
    for name, box in boxes["nodes"].items():  # the model's shape, all on the first paint, no scrolling
        assert view["left"] <= box["left"] and box["right"] <= view["right"], (name, box, view)
        assert view["top"] <= box["top"] and box["bottom"] <= view["bottom"], (name, box, view)
    assert 0 <= view["top"] and view["bottom"] <= 1100 and view["right"] <= 1500, view  # the view is on screen
    embedding, block, head = (boxes["nodes"][name] for name in ("module:model.embed_tokens",
                                                                "module:model.layers.0", "module:lm_head"))
    assert embedding["bottom"] <= block["top"] and block["bottom"] <= head["top"]  # top to bottom
