"""Notebook explorer responsiveness on a Llama-2-7B architecture (benchmark, not a test).

    .venv/bin/python benchmarks/widget_cases.py [--reps 5]

Measures, after building the model under `deferred_init` (not timed):
- first paint: `ExplorerWidget(model)` plus the first state sync — every widget's state serialized
  to JSON as the kernel would send it to the browser (target ≤ 1.5 s);
- tree click: `widget.select("model.layers.3")`, including the JSON of every state update it sends
  (target ≤ 0.5 s);
- the same click with the Graph tab open (Graphviz layout of the layer's op graph included), when
  the engine has `explorer.op_graph` (information, no target).
The comm layer is replaced by one that `json.dumps` each message, so serialization is counted;
the browser's own drawing is not (it runs in the browser, after the kernel has answered).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LLAMA_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=32, vocab_size=32000)
FIRST_PAINT_TARGET_S, SELECT_TARGET_S = 1.5, 0.5


class _SerializingComm:
    """Stands in for the kernel's comm: serializes what would go to the browser, counts bytes."""

    sent_bytes = 0

    @classmethod
    def install(cls) -> None:
        import comm

        class Comm(comm.DummyComm):
            def publish_msg(self, msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None,
                            **keys: Any) -> None:
                cls.sent_bytes += len(json.dumps({"msg_type": msg_type, "data": data, "metadata": metadata}))

        comm.create_comm = Comm


def widget_timings(reps: int = 5) -> dict:
    """Seconds for first paint and for a tree click, `reps` times each on one deferred 7B model."""
    _SerializingComm.install()
    import transformers

    import explorer
    import widgets

    model = explorer.deferred_init(transformers.LlamaForCausalLM, transformers.LlamaConfig(**LLAMA_7B))
    widgets.ExplorerWidget(explorer.deferred_init(lambda: __import__("torch").nn.Linear(2, 2)))  # warm-up
    first_paint, select, paint_bytes, select_bytes, graph_select = [], [], [], [], []
    for _ in range(reps):
        gc.collect()
        _SerializingComm.sent_bytes = 0
        start = time.perf_counter()
        ui = widgets.ExplorerWidget(model)
        first_paint.append(time.perf_counter() - start)
        paint_bytes.append(_SerializingComm.sent_bytes)
        _SerializingComm.sent_bytes = 0
        start = time.perf_counter()
        ui.select("model.layers.3")
        select.append(time.perf_counter() - start)
        select_bytes.append(_SerializingComm.sent_bytes)
        assert len(ui.tensors_tab.rows()) == 9, "layer 3 holds 9 tensors"
        if hasattr(explorer, "op_graph"):
            ui.select("model.layers.2")
            ui.tabs.selected_index = ui.tabs.children.index(ui.graph_tab)
            start = time.perf_counter()
            ui.select("model.layers.3")
            graph_select.append(time.perf_counter() - start)
            assert ui.graph_tab.status.value == "model.layers.3, depth 5", ui.graph_tab.status.value
    return {"first_paint": first_paint, "select": select, "paint_bytes": paint_bytes, "select_bytes": select_bytes,
            "graph_select": graph_select}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    result = widget_timings(parser.parse_args().reps)
    for key, target in (("first_paint", FIRST_PAINT_TARGET_S), ("select", SELECT_TARGET_S)):
        median = statistics.median(result[key])
        verdict = "PASS" if median <= target else "FAIL"
        runs = ", ".join(f"{value:.3f}" for value in result[key])
        print(f"{key}: median {median:.3f} s (target ≤ {target} s) {verdict}; runs {runs}; "
              f"{statistics.median(result[key.replace('first_paint', 'paint') + '_bytes']) / 1024:.0f} KiB sent")
    if result["graph_select"]:
        runs = ", ".join(f"{value:.3f}" for value in result["graph_select"])
        print(f"select with the Graph tab open: median {statistics.median(result['graph_select']):.3f} s "
              f"(info); runs {runs}")
    else:
        print("select with the Graph tab open: not measured (this engine has no explorer.op_graph yet)")


LLAMA_70B = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                 num_key_value_heads=8, vocab_size=32000)


def scale_timings(reps: int = 5) -> dict:
    """Seconds for the explorer's search and overlay switch on a Llama-2-70B architecture, kernel
    side (the JSON of every state update included, as in `widget_timings`).

    search: typing a module path ("layers.17.mlp.down_proj"), a regex over 80 layers, a dtype; the
    first search of a fresh explorer builds the text index and is reported apart. overlay: switching
    the tree and graph colours to bytes, dtype, device and back to state.
    """
    _SerializingComm.install()
    import transformers

    import explorer
    import widgets

    model = explorer.deferred_init(transformers.LlamaForCausalLM, transformers.LlamaConfig(**LLAMA_70B))
    queries = [("layers.17.mlp.down_proj", False), (r"layers\.\d*7\.self_attn\.(q|k)_proj$", True), ("float32", False)]
    first_search, search, overlay = [], [], []
    sizes = {}
    for _ in range(reps):
        gc.collect()
        ui = widgets.ExplorerWidget(model)
        sizes = {"modules": len(ui.inspection.modules), "tensors": len(ui.inspection.tensors),
                 "ops": len(ui.inspection.ops)}
        for index, (pattern, regex) in enumerate(queries):
            start = time.perf_counter()
            result = ui.search(pattern, regex=regex)
            (first_search if index == 0 else search).append(time.perf_counter() - start)
            assert not result.empty, pattern
        ui.search("")
        for mode in ("bytes", "dtype", "device", "state"):
            start = time.perf_counter()
            ui.set_overlay(mode)
            overlay.append(time.perf_counter() - start)
        ui.close()
    return {"first_search": first_search, "search": search, "overlay": overlay, **sizes}


CASES = {"widget_timings": widget_timings, "scale_timings": scale_timings}


if __name__ == "__main__":
    main()

