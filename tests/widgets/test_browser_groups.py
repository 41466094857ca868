"""Groups in JupyterLab in Chromium: a 24-layer Llama's tensors table, with the file browser open at
1500 px and "group by module" ticked, shows each module once in a header row over its tensors, which
show only the rest of their name (table.js draws the `row_groups` Python decides) and keep the
whole name in their title."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.support.lab import wait_for_widget_or_cell_error

LLAMA = """import transformers, widgets
cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=24,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
ui = widgets.explore(transformers.LlamaForCausalLM, cfg)
ui"""
NOTEBOOK_NAME, NOTEBOOK_CELLS = "llama.ipynb", [LLAMA]  # what `notebook_page` opens

# Each row of the tensors table: its key, its header's text ("" outside a group), its name cell's
# text and title, and whether it shows inside the table's scroll box.
ROWS = """() => {
  const wrap = document.querySelector(".de-tensors-table .de-table-wrap").getBoundingClientRect();
  return [...document.querySelectorAll(".de-tensors-table tr.de-table-row")].map((tr) => {
    const td = tr.querySelector('td[data-column="name"]');
    const header = tr.parentElement.querySelector("tr.de-table-group");
    const box = tr.getBoundingClientRect();
    return {key: tr.dataset.key, header: header ? header.textContent : "", text: td.textContent,
            title: td.title, visible: box.bottom > wrap.top && box.top < wrap.bottom};
  });
}"""


@pytest.mark.browser
@pytest.mark.slow
def test_a_24_layer_tensors_table_shows_each_module_once_over_its_tensors(notebook_page: Page) -> None:
    page = notebook_page
    page.set_viewport_size({"width": 1500, "height": 1300})
    wait_for_widget_or_cell_error(page, page.locator(".de-tensors-table .de-table-row"))
    page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id="filebrowser"]').click()
    expect(page.locator(".jp-FileBrowser")).to_be_visible()
    page.wait_for_timeout(500)  # the sidebar's opening relayout, then the table's refit
    headers = page.locator(".de-tensors-table tr.de-table-group")
    expect(headers).to_have_count(0)  # off at first
    page.locator(".de-tensors-group input").click()
    headers = page.locator(".de-tensors-table tr.de-table-group")
    expect(headers.filter(has_text="model.layers.3.self_attn · 4")).to_have_count(1)
    assert headers.count() == 24 * 3 + 1  # self_attn, mlp and the two norms of each layer; the rotary buffers
    rows = page.evaluate(ROWS)
    under = [row["text"] for row in rows if row["header"] == "model.layers.3.self_attn · 4"]
    assert under == ["q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"]
    visible = [row for row in rows if row["visible"]]
    assert len(visible) > 10 and all(row["title"] == row["key"] for row in visible), visible
    grouped = [row for row in visible if row["header"]]
    assert grouped and all(row["key"] == row["header"].split(" · ")[0] + "." + row["text"] for row in grouped)
    # a header row is not a row: clicking it selects nothing; a row under it selects its tensor
    headers.first.click()
    expect(page.locator(".de-tensors-table .de-table-row-selected")).to_have_count(0)
    page.locator('.de-tensors-table tr.de-table-row[data-key="model.layers.0.self_attn.k_proj.weight"]').click()
    expect(page.locator(".de-tensors-table .de-table-row-selected")).to_have_attribute(
        "data-key", "model.layers.0.self_attn.k_proj.weight"
    )
