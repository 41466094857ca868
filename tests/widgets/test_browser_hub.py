"""A Hub model in JupyterLab in Chromium: "remote" in the tree, the preview's bytes per host, one layer
materialized with its bytes fetched.

The kernel opens the local Hub's Llama (tests/support/hub_server.py, served from this test process)
by its repo id: the notebook's first cell points HF_ENDPOINT and HF_HOME at the server and a fresh
folder. The bytes the server sent are the assertion, beside what the page and the kernel say. The
screenshot is build/screenshots/hub.png.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from tests.support.hub_server import LLAMA_REPO
from tests.support.lab import (
    KERNEL_REPLY_TIMEOUT_MS,
    REPO,
    jupyter_server,
    kernel_answer,
    run_all_cells,
    wait_for_widget_or_cell_error,
    write_notebook,
)

NOTEBOOK_NAME = "hub.ipynb"
LAYER_BYTES = 25_694_208  # layer 3 of the Llama, bf16 in its shard
SCREENSHOT = REPO / "build" / "screenshots" / "hub.png"


@pytest.fixture(scope="module")
def hub_lab(hub_server, llama_checkpoint, tmp_path_factory) -> Iterator[tuple[str, str, str]]:
    """JupyterLab serving a notebook that opens the local Hub's Llama; yields (base URL, token, host)."""
    hub_server.add_repo(LLAMA_REPO, llama_checkpoint)
    root, home = tmp_path_factory.mktemp("hub-root"), tmp_path_factory.mktemp("hub-home")
    hf_home = tmp_path_factory.mktemp("hub-hf-home")
    setup = (
        "import os\n"
        f"os.environ.update(HF_ENDPOINT={hub_server.endpoint!r}, HF_HOME={str(hf_home)!r}, "
        "HF_HUB_DISABLE_IMPLICIT_TOKEN='1')\n"
        "for name in ('HF_TOKEN', 'EXPLORER_HUB_CACHE', 'HF_HUB_OFFLINE'): os.environ.pop(name, None)"
    )
    explore = (
        "import transformers, explorer, widgets\n"
        f"ui = widgets.explore(transformers.LlamaForCausalLM.from_pretrained, {LLAMA_REPO!r})\n"
        "ui"
    )
    write_notebook(root / NOTEBOOK_NAME, [setup, explore])
    with jupyter_server(root, home) as (base, token):
        yield base, token, hub_server.endpoint.removeprefix("http://")


@pytest.mark.browser
@pytest.mark.slow
def test_a_hub_layer_shows_remote_then_fetches_its_bytes(hub_lab, hub_server, page: Page) -> None:
    base, token, host = hub_lab
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    try:
        page.goto(f"{base}/lab/tree/{NOTEBOOK_NAME}?reset&token={token}")
        run_all_cells(page)
        wait_for_widget_or_cell_error(page, page.locator(".de-tree-node"))
        expect(page.locator('.de-tree-node[data-path=""] .de-tree-state')).to_have_text("remote")
        for path in ("model", "model.layers"):
            toggle = page.locator(f'.de-tree-node[data-path="{path}"] .de-tree-toggle')
            if toggle.inner_text().strip() != "▾":
                toggle.click()
                expect(toggle).to_have_text("▾", timeout=KERNEL_REPLY_TIMEOUT_MS)
        layer = page.locator('.de-tree-node[data-path="model.layers.3"]')
        expect(layer.locator(".de-tree-state")).to_have_text("remote")
        layer.locator(".de-tree-label").click()
        expect(layer.locator(".de-tree-checkbox")).to_be_checked(timeout=KERNEL_REPLY_TIMEOUT_MS)
        expect(page.locator(".de-preview")).to_contain_text(
            f"fetches {LAYER_BYTES:,} B (24.5 MiB) from {host}, 0 B cached", timeout=KERNEL_REPLY_TIMEOUT_MS)
        before = hub_server.bytes_served(".safetensors")
        page.locator(".de-materialize-selected").click()
        expect(page.locator(".de-fetch")).to_have_text(
            re.compile(rf"fetched 24\.5 MiB / 24\.5 MiB from {re.escape(host)} at [\d.]+ \w+/s"),
            timeout=KERNEL_REPLY_TIMEOUT_MS)
        expect(layer.locator(".de-tree-state")).to_have_text("materialized", timeout=KERNEL_REPLY_TIMEOUT_MS)
        answer = kernel_answer(
            page, 'print("hub:", explorer.is_deferred(ui.module.model.layers[3]), ui.bar.fetched_bytes)', "hub:")
        assert answer == f"hub: False {LAYER_BYTES}"
        assert hub_server.bytes_served(".safetensors") - before == LAYER_BYTES
    finally:
        page.screenshot(path=str(SCREENSHOT))
