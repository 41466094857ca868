"""End to end in a real browser: JupyterLab (and Notebook 7) runs the quickstart notebook, a person
clicks the widget.

What a user does, driven by Playwright in Debian's Chromium: open notebooks/quickstart.ipynb in
JupyterLab or in Notebook 7, Run All Cells from the menu, pick the `classifier` module in the explorer widget's
tree, open the Graph tab and click the `classifier.weight` node, press "Materialize selected",
then ask the kernel in a new cell what it saw: which modules are still deferred, what the widget
has selected and which tensor it opened. The kernel's answer (not the widget's own text) is the
assertion. A screenshot of what the person saw goes to build/screenshots/quickstart.png
(quickstart-notebook7.png for Notebook 7).
The CSS classes used are the ones `widgets/__init__.py` documents as stable.

Chromium comes from Debian (`make test` installs it); Playwright cannot download browsers here.
"""

from __future__ import annotations

import re
import shutil
from typing import Iterator

import pytest
from playwright.sync_api import Page, expect

from tests.support.lab import (
    KERNEL_REPLY_TIMEOUT_MS,
    REPO,
    graph_node,
    jupyter_server,
    run_all_cells,
    run_all_cells_notebook7,
    run_new_cell,
    wait_for_widget_or_cell_error,
)

NOTEBOOK = REPO / "notebooks" / "quickstart.ipynb"
SCREENSHOT = REPO / "build" / "screenshots" / "quickstart.png"


@pytest.fixture(scope="module", params=["lab", "notebook"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """JupyterLab or Notebook 7 serving a copy of the quickstart notebook; yields (app, base URL, token)."""
    root, home = tmp_path_factory.mktemp(f"{request.param}-root"), tmp_path_factory.mktemp(f"{request.param}-home")
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    with jupyter_server(root, home, app=request.param) as (base, token):
        yield request.param, base, token


@pytest.mark.browser
@pytest.mark.slow
def test_tree_pick_graph_click_and_materialize_reach_the_kernel(server: tuple[str, str, str], page: Page) -> None:
    app, base, token = server
    screenshot = SCREENSHOT if app == "lab" else SCREENSHOT.with_name("quickstart-notebook7.png")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    try:
        if app == "lab":
            page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}")
            run_all_cells(page)
        else:
            page.goto(f"{base}/notebooks/{NOTEBOOK.name}?token={token}")
            run_all_cells_notebook7(page, base, token)

        # The notebook's own cells assert that `classifier` is still fake when the widget appears.
        wait_for_widget_or_cell_error(page, page.locator(".de-tree-node"))
        classifier = page.locator('.de-tree-node[data-path="classifier"]')
        classifier.locator(".de-tree-label").click()
        # The kernel answers a label click by checking that subtree.
        expect(classifier.locator(".de-tree-checkbox")).to_be_checked(timeout=KERNEL_REPLY_TIMEOUT_MS)

        page.locator(".de-tabs .lm-TabBar-tab", has_text=re.compile(r"^\s*Graph\s*$")).click()
        weight_node = graph_node(page, "tensor:classifier.weight")
        weight_node.click()
        expect(weight_node).to_have_class(re.compile(r"\bde-graph-selected\b"), timeout=KERNEL_REPLY_TIMEOUT_MS)

        page.locator(".de-materialize-selected").click()

        # The widget materializes on a worker thread: wait for it (30 s at most), then report.
        run_new_cell(
            page,
            "import time; deadline = time.monotonic() + 30\n"
            "while explorer.is_deferred(model.classifier) and time.monotonic() < deadline: time.sleep(0.1)\n"
            'print("classifier deferred:", explorer.is_deferred(model.classifier),'
            ' "| embed deferred:", explorer.is_deferred(model.embed),'
            ' "| selection:", explorer_widget.selection, "| open tensor:", explorer_widget.tensor)',
        )
        answer = page.locator(".jp-OutputArea-output", has_text="classifier deferred:")
        answer.wait_for(timeout=KERNEL_REPLY_TIMEOUT_MS)
        assert answer.inner_text().strip() == (
            "classifier deferred: False | embed deferred: True"
            " | selection: ['classifier'] | open tensor: classifier.weight"
        )
        # the bar showed the generator jump as the step before the replay
        expect(page.locator(".de-step")).to_contain_text(re.compile(r"step 1 — generator jump: .* jumps? over [\d,]+ draws"))
        expect(page.locator(".de-step")).to_contain_text("step 2 — replay: running")
    finally:
        explorer_view = page.locator(".de-explorer")
        if explorer_view.count():  # show the widget from its top, the kernel's answer below it
            explorer_view.first.evaluate("element => element.scrollIntoView({block: 'start'})")
        page.screenshot(path=str(screenshot))
