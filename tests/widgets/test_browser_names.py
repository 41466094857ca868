"""Names in JupyterLab in Chromium: a 24-layer Qwen2's tensors table, with the file browser open at
1500 px, shows every row's layer index (table.js shortens a narrow name cell by short_path.js and
keeps the whole name in the cell's title)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.support.lab import KERNEL_REPLY_TIMEOUT_MS, wait_for_widget_or_cell_error

QWEN2 = """import transformers, widgets
cfg = transformers.Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
ui = widgets.explore(transformers.Qwen2ForCausalLM, cfg)
ui"""
NOTEBOOK_NAME, NOTEBOOK_CELLS = "qwen2.ipynb", [QWEN2]  # what `notebook_page` opens

# For each name cell of the tensors table inside the table's scroll box: its title, its text, and
# whether it shows on screen.
NAME_CELLS = """() => {
  const wrap = document.querySelector(".de-tensors-table .de-table-wrap").getBoundingClientRect();
  return [...document.querySelectorAll('.de-tensors-table td[data-column="name"]')].map((td) => {
    const box = td.getBoundingClientRect();
    return {title: td.title, text: td.textContent, width: td.clientWidth,
            visible: box.bottom > wrap.top && box.top < wrap.bottom};
  });
}"""


def indices(name: str) -> list[str]:
    return re.findall(r"(?:^|[.…])(\d+)(?=\.|$)", name)


@pytest.mark.browser
@pytest.mark.slow
def test_every_visible_row_of_a_24_layer_tensors_table_shows_its_layer_index(notebook_page: Page) -> None:
    page = notebook_page
    page.set_viewport_size({"width": 1500, "height": 1300})
    wait_for_widget_or_cell_error(page, page.locator(".de-tensors-table .de-table-row"))
    page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id="filebrowser"]').click()
    expect(page.locator(".jp-FileBrowser")).to_be_visible()
    page.wait_for_timeout(500)  # the sidebar's opening relayout, then the table's refit
    cells = page.evaluate(NAME_CELLS)
    assert len(cells) >= 24 * 12, len(cells)  # 12 tensors a layer, then embed, norm, the rotary buffer
    visible = [cell for cell in cells if cell["visible"]]
    assert visible and all(indices(cell["text"]) == indices(cell["title"]) for cell in visible), visible
    assert any(cell["text"] != cell["title"] for cell in visible), "no name was cut: the column is not narrow"
    q_proj = [cell["text"] for cell in cells if cell["title"].endswith("q_proj.weight")]
    assert len(set(q_proj)) == 24
    assert all(indices(text) == [str(i)] for i, text in enumerate(q_proj)), q_proj
    page.locator(".de-tensors-filter input").first.fill("q_proj.weight")
    rows = page.locator(".de-tensors-table .de-table-row")
    expect(rows).to_have_count(24, timeout=KERNEL_REPLY_TIMEOUT_MS)
    expect(rows.nth(17).locator('td[data-column="name"]')).to_have_attribute(
        "title", "model.layers.17.self_attn.q_proj.weight"
    )
