"""Resources: opening, using and closing many explorers leaves nothing behind — no graphs or
modules kept alive, no widget models left registered, no open files, threads or child processes
(graphviz's `dot` runs once per graph render)."""

from __future__ import annotations

import gc
import os
import threading
import weakref

import ipywidgets
import psutil
import torch

import widgets
from explorer.record.fake import handle_of
from tests.widgets.conftest import Net
from widgets.explorer_widget import GRAPH_TAB

ROUNDS = 12


def _collect() -> None:
    for _ in range(5):
        if gc.collect() == 0:
            return


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _registered_widgets() -> int:
    # The registry of open widget models: `_instances` since ipywidgets 8.1, `Widget._active_widgets`
    # in 8.0 (pyproject allows >=8).
    module = ipywidgets.widgets.widget
    registry = getattr(module, "_instances", None)
    return len(registry if registry is not None else module.Widget._active_widgets)


def _child_processes() -> set[int]:
    return {process.pid for process in psutil.Process().children(recursive=True)}


def _use_and_close(seed: int, graphs: list[weakref.ref], modules: list[weakref.ref]) -> None:
    """Everything a person does with one explorer, then closing it."""
    torch.manual_seed(seed)
    ui = widgets.explore(Net)
    graphs.append(weakref.ref(handle_of(ui.module.embed.weight).graph))
    modules.append(weakref.ref(ui.module))
    ui.tabs.selected_index = GRAPH_TAB  # renders the SVG through `dot`
    ui.select("blocks.0")
    ui.show_tensor("blocks.0.attn.weight")
    ui.materialize_selected()  # background thread, as the button does
    ui.bar.join()
    ui.materialize_all(wait=True)
    assert "materialized" in ui.bar.status.value
    ui.close()


def test_closing_explorers_releases_modules_graphs_widgets_files_threads_and_processes():
    graphs: list[weakref.ref] = []
    modules: list[weakref.ref] = []
    _use_and_close(0, graphs, modules)  # warm-up: lazy imports, caches
    _collect()
    widgets_before, fds_before, threads_before = _registered_widgets(), _open_fds(), threading.active_count()
    processes_before = _child_processes()  # other tests' servers may be running: compare, not expect none

    for seed in range(1, ROUNDS + 1):
        _use_and_close(seed, graphs, modules)
    _collect()

    assert [ref for ref in modules if ref() is not None] == []
    assert [ref for ref in graphs if ref() is not None] == []
    assert _registered_widgets() == widgets_before
    assert _open_fds() == fds_before
    assert threading.active_count() == threads_before
    assert _child_processes() == processes_before
