"""End to end in a real browser: JupyterLab runs the quickstart notebook, a person clicks the widget.

What a user does, driven by Playwright in Debian's Chromium: open notebooks/quickstart.ipynb in
JupyterLab, Run All Cells from the menu, pick the `classifier` module in the explorer widget's
tree, open the Graph tab and click the `classifier.weight` node, press "Materialize selected",
then ask the kernel in a new cell what it saw: which modules are still deferred, what the widget
has selected and which tensor it opened. The kernel's answer (not the widget's own text) is the
assertion. A screenshot of what the person saw goes to build/screenshots/quickstart.png.
The CSS classes used are the ones `widgets/__init__.py` documents as stable.

Chromium comes from Debian (`make test` installs it); Playwright cannot download browsers here.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from playwright.sync_api import Locator, Page, expect

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "quickstart.ipynb"
SCREENSHOT = REPO / "build" / "screenshots" / "quickstart.png"
CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium keeps calling hosts this closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LAB_START_TIMEOUT_S = 90
NOTEBOOK_RUN_TIMEOUT_MS = 180_000
KERNEL_REPLY_TIMEOUT_MS = 60_000


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict) -> dict:
    """pytest-playwright's launch arguments, pointed at Debian's Chromium."""
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict) -> dict:
    """A window tall enough to show the whole widget (tree, graph, details, materialize bar) at once."""
    return {**browser_context_args, "viewport": {"width": 1400, "height": 1300}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_serving(process: subprocess.Popen, status_url: str, log: Path) -> None:
    """Poll Jupyter's /api/status until it answers; fail with the server log if it dies or stalls."""
    deadline = time.monotonic() + LAB_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"jupyter lab exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(status_url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer within {LAB_START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM lets the server shut its kernels down; the process group catches any straggler."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # our own session (start_new_session): kernels the server left behind
    except ProcessLookupError:
        pass
    process.wait(timeout=10)


@pytest.fixture(scope="session")
def lab_notebook_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """JupyterLab serving a copy of the quickstart notebook; yields the notebook's URL.

    Its own config, data and runtime directories keep the user's Jupyter settings, workspaces and
    running servers out of the test; the announcements pop-up is disabled because it covers the
    page. PYTHONPATH puts this repository first so the kernel imports this checkout's explorer
    and widgets.
    """
    root, home = tmp_path_factory.mktemp("lab-root"), tmp_path_factory.mktemp("lab-home")
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    config_dir, runtime_dir, ipython_dir = home / "config", home / "runtime", home / "ipython"
    (config_dir / "labconfig").mkdir(parents=True)
    page_config = {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}
    (config_dir / "labconfig" / "page_config.json").write_text(json.dumps(page_config))
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(config_dir),
        "JUPYTER_RUNTIME_DIR": str(runtime_dir),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "IPYTHONDIR": str(ipython_dir),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    port, token = _free_port(), secrets.token_hex(16)
    log = home / "jupyter-lab.log"
    command = [
        sys.executable, "-m", "jupyter", "lab", "--allow-root", "--no-browser",
        "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--LabApp.extension_manager=readonly", "--LabApp.news_url=None",
    ]  # fmt: skip
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command, cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_until_serving(process, f"http://127.0.0.1:{port}/api/status?token={token}", log)
        yield f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK.name}?token={token}"
    finally:
        _stop(process)


def _run_all_cells(page: Page) -> None:
    """Run ▸ Run All Cells from the menu bar, once the kernel is connected and idle.

    The toolbar's execution indicator reads "idle" before any kernel exists ("No Kernel |
    Initializing" in the status bar); running then opens a kernel picker. The status bar's
    "(ipykernel) | Idle" appears only once the kernel is connected.
    """
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=NOTEBOOK_RUN_TIMEOUT_MS)
    page.locator(".jp-StatusBar-Widget", has_text=re.compile(r"\(ipykernel\) \| Idle")).wait_for(
        timeout=NOTEBOOK_RUN_TIMEOUT_MS
    )
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=NOTEBOOK_RUN_TIMEOUT_MS)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


def _wait_for_widget_or_cell_error(page: Page, widget_part: Locator) -> None:
    """Wait until `widget_part` shows; fail at once with the traceback if a cell raised instead."""
    cell_error = page.locator(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
        has_text=re.compile(r"Traceback|Error"),
    )
    widget_part.first.or_(cell_error.first).wait_for(timeout=NOTEBOOK_RUN_TIMEOUT_MS)
    if cell_error.count():
        pytest.fail(f"a notebook cell raised before the widget appeared:\n{cell_error.first.inner_text()}")


def _graph_node(page: Page, name: str) -> Locator:
    """The SVG node drawn for graphviz node `name` (its `<title>`, per the render contract).

    Matching by title, not position, finds the node again after the graph is redrawn.
    """
    nodes = page.locator(".de-graph g.node")
    nodes.first.wait_for(timeout=KERNEL_REPLY_TIMEOUT_MS)
    node = nodes.filter(has=page.locator(f'xpath=./*[local-name()="title" and normalize-space()="{name}"]'))
    if not node.count():
        titles = [title.strip() for title in nodes.locator("title").all_text_contents()]
        pytest.fail(f"the graph has no node {name!r}; its nodes: {titles[:40]}")
    return node.first


def _run_new_cell(page: Page, code: str) -> None:
    """Add a cell below the last one, type `code` into it and run it, as a person would."""
    page.keyboard.press("Escape")
    page.locator(".jp-Notebook .jp-Cell").last.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")


@pytest.mark.browser
@pytest.mark.slow
def test_tree_pick_graph_click_and_materialize_reach_the_kernel(lab_notebook_url: str, page: Page) -> None:
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    try:
        page.goto(lab_notebook_url)
        _run_all_cells(page)

        # The notebook's own cells assert that `classifier` is still fake when the widget appears.
        _wait_for_widget_or_cell_error(page, page.locator(".de-tree-node"))
        classifier = page.locator('.de-tree-node[data-path="classifier"]')
        classifier.locator(".de-tree-label").click()
        # The kernel answers a label click by checking that subtree.
        expect(classifier.locator(".de-tree-checkbox")).to_be_checked(timeout=KERNEL_REPLY_TIMEOUT_MS)

        page.locator(".de-tabs .lm-TabBar-tab", has_text=re.compile(r"^\s*Graph\s*$")).click()
        weight_node = _graph_node(page, "tensor:classifier.weight")
        weight_node.click()
        expect(weight_node).to_have_class(re.compile(r"\bde-graph-selected\b"), timeout=KERNEL_REPLY_TIMEOUT_MS)

        page.locator(".de-materialize-selected").click()

        # The widget materializes on a worker thread: wait for it (30 s at most), then report.
        _run_new_cell(
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
        page.screenshot(path=str(SCREENSHOT))
