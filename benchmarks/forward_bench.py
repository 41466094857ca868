"""Forward graph benchmark: `forward_graph` plus the depth-2 SVG on the Llama-70B architecture (deferred).

The model is built (deferred_init) before the clock starts. Each repetition, in the same child,
records the forward from scratch on input (1, 128) (`explorer.forward_graph`), decides the drawing
(`op_graph(..., depth=2)`: 80 identical layers fold into one "LlamaDecoderLayer ×80" node) and lays it
out with Graphviz (`to_svg`). Targets (issue 24): ≤ 10 s per repetition (median), RSS growth ≤ 1 GB
(peak during the repetitions minus RSS after the build). Baseline, for scale: `dry_run` on the same
model and input, in a fresh child, interleaved with the forward-graph child (INFO row).

Browser comparison (issue 24: "the Graph tab's forward view of 7B is readable no later than
torchvista shows its 7B page"), two fresh children interleaved, model built before the clock:
- `explorer_forward_page`: the deferred Llama-2-7B architecture; clock from `forward_graph(model,
  (1, 128))` through `op_graph(depth=2)` and `to_svg` to the moment the Graph tab's own front end
  (widgets/graph.js with widgets/style.css, in a page of its own with a stand-in for the widget
  model, in headless Chromium) reports node labels ≥ 9 px on screen;
- `torchvista_page`: the same architecture on the meta device; clock from
  `torchvista.trace_model(model, ids, export_format="html")` (recursion limit raised: the default
  fails at 7B) to the first node of its exported page drawn in the same Chromium.
Our page runs outside JupyterLab (no kernel round trip), as torchvista's exported page does.
"""

from __future__ import annotations

import gc
import shutil
import statistics
import time
from pathlib import Path

from cases import RssSampler, llama_config, rss_bytes
from harness import ROOT, ChildError, Report, Row, log, run_child, seconds, verdict

TOPIC = "forward"
TARGET_S = 10.0
RSS_TARGET = 10**9
INPUT = (1, 128)


def _deferred_llama(config: str):  # noqa: ANN202
    import torch
    from transformers import LlamaForCausalLM

    import explorer

    torch.manual_seed(0)
    return explorer.deferred_init(LlamaForCausalLM, llama_config(config))


def forward_graph_svg(config: str = "llama-70b", reps: int = 3) -> dict:
    """Child: seconds per (forward_graph + op_graph(depth=2) + to_svg), and the RSS it grows by."""
    import explorer
    from explorer.render import to_svg

    model = _deferred_llama(config)
    gc.collect()
    before = rss_bytes()
    times, records, ops, svg_bytes = [], [], 0, 0
    with RssSampler() as sampler:
        for _ in range(reps):
            started = time.perf_counter()
            forward = explorer.forward_graph(model, INPUT)
            recorded = time.perf_counter()
            svg = to_svg(explorer.op_graph(forward, depth=2))
            times.append(time.perf_counter() - started)
            records.append(recorded - started)
            ops, svg_bytes, folded = len(forward.graph.ops), len(svg), "LlamaDecoderLayer ×" in svg
            del forward, svg
    return {"times": times, "records": records, "rss_growth": sampler.peak - before, "ops": ops,
            "svg_bytes": svg_bytes, "folded": folded}


def dry_run_time(config: str = "llama-70b", reps: int = 3) -> dict:
    """Child: seconds per `dry_run` on the same model and input (the baseline for scale)."""
    import explorer

    model = _deferred_llama(config)
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        explorer.dry_run(model, INPUT)
        times.append(time.perf_counter() - started)
    return {"times": times}


_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>{css}</style></head>
<body style="width:1200px"><div id="view"></div><script>
{esm}
const state = {{svg: {svg}, selected: "", highlighted: [], aliases: [], module_colours: {{}}, min_label_px: 9}};
const model = {{get: key => state[key], set: () => {{}}, save_changes: () => {{}}, on: () => {{}}}};
render({{model, el: document.getElementById("view")}});
</script></body></html>"""


def _page_seconds(path: str, ready: str) -> float:
    """Seconds from opening `path` in headless Chromium until the JS condition `ready` holds."""
    from playwright.sync_api import sync_playwright

    from tests.support.lab import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            started = time.perf_counter()
            page.goto(f"file://{path}")
            page.wait_for_function(ready, timeout=600_000, polling=20)
            return time.perf_counter() - started
        finally:
            browser.close()


def explorer_forward_page(config: str = "llama-7b") -> dict:
    """Child: forward graph + SVG, then the Graph tab's front end in Chromium until labels are ≥ 9 px."""
    import json
    import tempfile

    import explorer
    from explorer.render import to_svg
    from widgets.front_end import source

    model = _deferred_llama(config)
    started = time.perf_counter()
    svg = to_svg(explorer.op_graph(explorer.forward_graph(model, INPUT), depth=2))
    python = time.perf_counter() - started
    esm = source("graph.js").replace("export default { render };", "")
    page = _PAGE.format(css=source("style.css"), esm=esm, svg=json.dumps(svg))
    with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False, dir=ROOT / "build") as file:
        file.write(page)
    try:
        browser = _page_seconds(file.name, "(() => { const r = document.querySelector('.de-graph-root');"
                                           " return r && parseFloat(r.dataset.labelPx) >= 9; })()")
    finally:
        Path(file.name).unlink()
    return {"python": python, "browser": browser, "seconds": python + browser}


def torchvista_page(config: str = "llama-7b") -> dict:
    """Child: torchvista's trace and HTML export, then its page in Chromium until a node is drawn."""
    import sys
    import tempfile

    import torch
    from transformers import LlamaForCausalLM

    try:
        from torchvista import trace_model
    except ImportError as error:
        raise RuntimeError("torchvista is not installed: pip install torchvista==0.2.13 (bench extra)") from error

    sys.setrecursionlimit(100_000)  # torchvista's graph walk recurses once per node
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(config)).eval()
    ids = torch.zeros(INPUT, dtype=torch.long, device="meta")
    path = Path(tempfile.mkdtemp(dir=ROOT / "build")) / "torchvista.html"
    try:
        started = time.perf_counter()
        trace_model(model, ids, export_format="html", export_path=str(path))
        python = time.perf_counter() - started
        browser = _page_seconds(str(path), "document.querySelector('svg g[class*=\"node_\"]') !== null")
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
    return {"python": python, "browser": browser, "seconds": python + browser}


CASES = {"forward_graph_svg": forward_graph_svg, "dry_run_time": dry_run_time,
         "explorer_forward_page": explorer_forward_page, "torchvista_page": torchvista_page}


def bench(report: Report, quick: bool, timeout: float) -> None:
    config = "quick-70b" if quick else "llama-70b"
    reps = 3
    name = f"forward graph + SVG (depth 2) on {config}, input {list(INPUT)} (deferred; build not timed)"
    runs: dict[str, list[dict]] = {"forward_graph_svg": [], "dry_run_time": []}
    try:
        for round_ in range(2):  # fresh children, interleaved, rotated
            order = list(runs) if round_ % 2 == 0 else list(reversed(runs))
            for case in order:
                runs[case].append(run_child(case, max(timeout, 600), config=config, reps=reps))
    except ChildError as error:
        report.error(name, f"≤ {TARGET_S:.0f} s, RSS growth ≤ 1 GB", error)
        return
    times = [t for run in runs["forward_graph_svg"] for t in run["times"]]
    records = [t for run in runs["forward_graph_svg"] for t in run["records"]]
    baseline = [t for run in runs["dry_run_time"] for t in run["times"]]
    median, base = statistics.median(times), statistics.median(baseline)
    growth = max(run["rss_growth"] for run in runs["forward_graph_svg"])
    last = runs["forward_graph_svg"][-1]
    report.add(Row(name, f"{median:.2f} s", f"dry_run {base:.2f} s", f"{median / base:.2f}×",
                   f"≤ {TARGET_S:.0f} s", verdict(median <= TARGET_S and last["folded"])))
    report.add(Row(f"forward graph + SVG on {config}: RSS growth", f"{growth / 1e6:.0f} MB", "—", "—",
                   "≤ 1 GB", verdict(growth <= RSS_TARGET)))
    report.notes.append(
        f"forward graph {config}: {last['ops']} ops, SVG {last['svg_bytes'] / 1e3:.0f} kB, layers folded: "
        f"{last['folded']}; s per repetition: {seconds(times)} (recording alone: {seconds(records)}); "
        f"dry_run s: {seconds(baseline)}")
    log(f"forward graph {config}: median {median:.2f} s, RSS growth {growth / 1e6:.0f} MB")
    _bench_browser(report, "quick-7b" if quick else "llama-7b", timeout)


def _bench_browser(report: Report, config: str, timeout: float) -> None:
    """Ours readable vs torchvista's page shown, fresh children interleaved and rotated, medians."""
    name = f"{config} forward in the browser: Graph tab readable (labels ≥ 9 px) vs torchvista page shown"
    runs: dict[str, list[dict]] = {"explorer_forward_page": [], "torchvista_page": []}
    try:
        for round_ in range(3):
            order = list(runs) if round_ % 2 == 0 else list(reversed(runs))
            for case in order:
                runs[case].append(run_child(case, max(timeout, 900), config=config))
    except ChildError as error:
        report.error(name, "≤ 1× torchvista", error)
        return
    ours = statistics.median(r["seconds"] for r in runs["explorer_forward_page"])
    peer = statistics.median(r["seconds"] for r in runs["torchvista_page"])
    report.add(Row(name, f"{ours:.2f} s", f"torchvista {peer:.2f} s", f"{ours / peer:.2f}×", "≤ 1×",
                   verdict(ours <= peer)))
    parts = {case: ", ".join(f"{r['python']:.2f} + {r['browser']:.2f}" for r in results)
             for case, results in runs.items()}
    report.notes.append(f"browser {config} (python + browser s per run): ours {parts['explorer_forward_page']}; "
                        f"torchvista {parts['torchvista_page']}")
