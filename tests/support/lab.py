"""Driving Jupyter in Debian's Chromium for the browser tests: a private server, Run All, new cells.

Chromium comes from Debian (`make test` installs it); Playwright cannot download browsers here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import nbformat
import pytest
from playwright.sync_api import Locator, Page

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
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


@contextlib.contextmanager
def jupyter_server(root: Path, home: Path, app: str = "lab") -> Iterator[tuple[str, str]]:
    """JupyterLab (`app="lab"`) or Notebook 7 (`app="notebook"`) serving the folder `root`; yields
    (base URL, token).

    Its own config, data and runtime directories (under `home`) keep the user's Jupyter settings,
    workspaces and running servers out of the test; the announcements pop-up is disabled because
    it covers the page. PYTHONPATH puts this repository first so the kernel imports this
    checkout's explorer and widgets.
    """
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
    port, token = free_port(), secrets.token_hex(16)
    log = home / "jupyter-lab.log"
    command = [
        sys.executable, "-m", "jupyter", app, "--allow-root", "--no-browser",
        "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
    ] + (["--LabApp.extension_manager=readonly", "--LabApp.news_url=None"] if app == "lab" else [])  # fmt: skip
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command, cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_until_serving(process, f"http://127.0.0.1:{port}/api/status?token={token}", log)
        yield f"http://127.0.0.1:{port}", token
    finally:
        _stop(process)


def wait_for_notebook_kernel(page: Page) -> None:
    """Wait until the open notebook's kernel is connected and idle.

    The toolbar's execution indicator reads "idle" before any kernel exists ("No Kernel |
    Initializing" in the status bar); running then opens a kernel picker. The status bar's
    "(ipykernel) | Idle" appears only once the kernel is connected.
    """
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=NOTEBOOK_RUN_TIMEOUT_MS)
    idle = page.locator(".jp-StatusBar-Widget", has_text=re.compile(r"\(ipykernel\) \| Idle"))
    kernel_picker = page.locator(".jp-Dialog", has_text="Select Kernel")
    idle.or_(kernel_picker).first.wait_for(timeout=NOTEBOOK_RUN_TIMEOUT_MS)
    if kernel_picker.count():  # a second notebook in one server may ask which kernel to start
        kernel_picker.locator(".jp-mod-accept").click()
        idle.wait_for(timeout=NOTEBOOK_RUN_TIMEOUT_MS)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=NOTEBOOK_RUN_TIMEOUT_MS)


def run_all_cells(page: Page) -> None:
    """Run ▸ Run All Cells from the menu bar, once the kernel is connected and idle."""
    wait_for_notebook_kernel(page)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


def wait_for_widget_or_cell_error(page: Page, widget_part: Locator) -> None:
    """Wait until `widget_part` shows; fail at once with the traceback if a cell raised instead."""
    cell_error = page.locator(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
        has_text=re.compile(r"Traceback|Error"),
    )
    widget_part.first.or_(cell_error.first).wait_for(timeout=NOTEBOOK_RUN_TIMEOUT_MS)
    if cell_error.count():
        pytest.fail(f"a notebook cell raised before the widget appeared:\n{cell_error.first.inner_text()}")


def graph_node(page: Page, name: str) -> Locator:
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


def run_new_cell(page: Page, code: str) -> None:
    """Add a cell below the last one, type `code` into it and run it, as a person would."""
    page.evaluate("document.activeElement && document.activeElement.blur()")  # e.g. the widget's search box
    page.keyboard.press("Escape")
    page.locator(".jp-Notebook .jp-Cell").last.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")


def write_notebook(path: Path, cells: list[str]) -> Path:
    """A notebook of code cells at `path` (for a test to open and run)."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(notebook, path)
    return path


def kernel_answer(page: Page, code: str, marker: str) -> str:
    """Run `code` in a new cell; return the text of the output that contains `marker`.

    Outputs already on the page may contain the marker too (a failure banner's "RuntimeError:"
    holds "error:", matched without case): the answer is the first match beyond those, waited for."""
    answers = page.locator(".jp-OutputArea-output", has_text=marker)
    already = answers.count()
    run_new_cell(page, code)
    answer = answers.nth(already)
    answer.wait_for(timeout=KERNEL_REPLY_TIMEOUT_MS)
    return answer.inner_text().strip()


def wait_for_idle_kernel(base: str, token: str, timeout_s: float = NOTEBOOK_RUN_TIMEOUT_MS / 1000) -> None:
    """Wait until the server reports a kernel session whose kernel is idle (asked through Jupyter's
    REST API, so it works whatever the page looks like: Notebook 7 has no status bar)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=2) as response:
                sessions = json.loads(response.read())
            if any(s.get("kernel", {}).get("execution_state") == "idle" for s in sessions):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            pass
        time.sleep(0.3)
    pytest.fail(f"no idle kernel within {timeout_s:.0f} s")


def run_all_cells_notebook7(page: Page, base: str, token: str) -> None:
    """Notebook 7's Run ▸ Run All Cells, once its kernel is up and idle."""
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=NOTEBOOK_RUN_TIMEOUT_MS)
    wait_for_idle_kernel(base, token)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


def doc_screenshot(name: str) -> Path:
    """Where a browser test saves the screenshot a doc page shows: build/screenshots/ in `make test`
    (the tree stays as checked out), docs/ under `make screenshots` (EXPLORER_DOC_SCREENSHOTS=1)."""
    folder = REPO / "docs" if os.environ.get("EXPLORER_DOC_SCREENSHOTS") == "1" else REPO / "build" / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name
