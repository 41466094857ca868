"""First paint from "Run All" in a fresh kernel, split into its parts, ours and theirs (issue 33).

JupyterLab in Debian's Chromium (the browser tests' driver, tests/support/lab.py) opens a
two-cell notebook like the quickstart's, with the issue's case: the first cell imports torch,
explorer, widgets and transformers; the second runs `widgets.explore(transformers.Qwen2ForCausalLM,
<Qwen2-0.5B config>)`. Each rep has its own server, browser and kernel. The clock starts when Run
All is clicked, the new kernel connected and idle (its start is outside the window; the notes give
page load + kernel start), and stops when the module tree's rows are visible.

The cells stamp `time.time()` between their steps into a file; the driver's clock is `time.time()`
on the same machine, so the window splits into parts, each ours, theirs, or both:

- Run All → the first cell runs (JupyterLab sends it, the kernel takes it): theirs
- `import torch`: theirs; `import explorer` beyond torch: ours; `import widgets` beyond explorer: ours
- `import transformers`, then its Qwen2 modules and config (loaded lazily on first use): theirs
- between the cells (the kernel finishes one, takes the next): theirs
- `widgets.explore` (deferred_init, inspection, widget construction): ours
- the rest, kernel done → tree visible: both. Jupyter carries the widgets' state and mounts their
  views (ipywidgets, anywidget); the widgets and the tree's drawing are ours.

explorer is imported before transformers, so what both load (torch._dynamo, sympy) counts as ours.
The kernel imports this checkout's explorer and widgets, not the run's snapshot of explorer/.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, NamedTuple

from harness import ROOT, ChildError, Report, Row, log, run_child

TOPIC = "paint"
_REPS = 3

Owner = Literal["ours", "theirs", "both"]
# The kernel's stamps, in the order the cells take them; each part ends at its stamp.
_IMPORTS = """import time
_stamps = {"cell 1": time.time()}
import torch
_stamps["torch"] = time.time()
import explorer
_stamps["explorer"] = time.time()
import widgets
_stamps["widgets"] = time.time()
import transformers
_stamps["transformers"] = time.time()"""
_EXPLORE = """_stamps["cell 2"] = time.time()
cfg = transformers.Qwen2Config(  # Qwen2-0.5B
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
    tie_word_embeddings=True)
model_class = transformers.Qwen2ForCausalLM  # loads transformers' Qwen2 modules
_stamps["qwen2 modules"] = time.time()
ui = widgets.explore(model_class, cfg)
_stamps["explore"] = time.time()
open({path!r}, "w").write(__import__("json").dumps(_stamps))
ui"""
# (part, the stamp it ends at, whose): the first starts at the click, the last ends at the tree.
_PARTS: tuple[tuple[str, str, Owner], ...] = (
    ("Run All → first cell running (JupyterLab, kernel)", "cell 1", "theirs"),
    ("`import torch`", "torch", "theirs"),
    ("`import explorer` beyond torch", "explorer", "ours"),
    ("`import widgets` beyond explorer", "widgets", "ours"),
    ("`import transformers`", "transformers", "theirs"),
    ("between the cells (kernel)", "cell 2", "theirs"),
    ("transformers' Qwen2 modules and config (lazy)", "qwen2 modules", "theirs"),
    ("`widgets.explore` (deferred_init, inspection, widget construction)", "explore", "ours"),
    ("kernel done → tree visible (state sync, views mounted, drawing)", "", "both"),
)


class PaintRun(NamedTuple):
    """One Run All: seconds before the clock (page load + kernel start), and each part's seconds."""

    kernel_start: float
    parts: dict[str, float]


def run_all_first_paint(reps: int = _REPS) -> dict:
    """`reps` Run Alls, each with its own Jupyter server, Chromium and kernel: {"runs": [PaintRun]}."""
    sys.path.insert(0, str(ROOT))
    from playwright.sync_api import sync_playwright

    runs = []
    with sync_playwright() as playwright:
        for _ in range(reps):
            with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as home:
                runs.append(_run_all(playwright, Path(root), Path(home))._asdict())
    return {"runs": runs}


def _run_all(playwright: Any, root: Path, home: Path) -> PaintRun:
    """Open the notebook in a new server and browser, wait for its kernel, Run All, time the parts."""
    from tests.support.lab import (
        CHROMIUM,
        CHROMIUM_ARGS,
        jupyter_server,
        run_all_cells,
        wait_for_notebook_kernel,
        wait_for_widget_or_cell_error,
        write_notebook,
    )

    stamps = root / "stamps.json"
    write_notebook(root / "paint.ipynb", [_IMPORTS, _EXPLORE.format(path=str(stamps))])
    with jupyter_server(root, home) as (base, token):
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        opened = time.time()
        page.goto(f"{base}/lab/tree/paint.ipynb?reset&token={token}")
        wait_for_notebook_kernel(page)
        start = time.time()
        run_all_cells(page)  # its own wait for the kernel returns at once
        wait_for_widget_or_cell_error(page, page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".de-tree-node"))
        painted = time.time()
        browser.close()
    kernel = json.loads(stamps.read_text())
    ends = [kernel[stamp] for _, stamp, _ in _PARTS[:-1]] + [painted]
    starts = [start, *ends[:-1]]
    return PaintRun(start - opened, {part: end - begin for (part, _, _), begin, end in zip(_PARTS, starts, ends)})


CASES = {"run_all_first_paint": run_all_first_paint}


def bench(report: Report, quick: bool, timeout: float) -> None:
    name = "first paint from Run All, fresh kernel, JupyterLab in Chromium (Qwen2-0.5B `widgets.explore`)"
    reps = 1 if quick else _REPS
    log(f"  {reps} Run All(s) of the Qwen2-0.5B notebook, each with its own server, browser and kernel")
    try:
        runs = [PaintRun(**run) for run in run_child("run_all_first_paint", timeout, reps=reps)["runs"]]
    except ChildError as error:
        report.error(name, "info", error)
        return
    totals = [sum(run.parts.values()) for run in runs]
    median = sorted(zip(totals, range(len(runs))))[len(runs) // 2][1]  # the run whose parts are shown
    total, parts = totals[median], runs[median].parts
    owner = {part: whose for part, _, whose in _PARTS}
    ours = _ours(runs[median], owner)
    report.add(Row(name, f"{total:.2f} s", f"ours {ours:.2f} s", f"{ours / total:.0%} ours", "info", "INFO"))
    for part, seconds in parts.items():
        report.add(Row(f"↳ {part}", f"{seconds:.2f} s", owner[part], f"{seconds / total:.0%}", "info", "INFO"))
    report.notes.append(
        f"first paint from Run All: the parts are the median run's of {len(runs)} (totals "
        f"{', '.join(f'{t:.2f}' for t in totals)} s; ours {', '.join(f'{_ours(r, owner):.2f}' for r in runs)} s); "
        f"before the clock, page load + kernel start {statistics.median(r.kernel_start for r in runs):.2f} s"
    )


def _ours(run: PaintRun, owner: dict[str, Owner]) -> float:
    return sum(seconds for part, seconds in run.parts.items() if owner[part] == "ours")
