"""deferred-explorer notebook UI: explore a module built under `explorer.deferred_init`.

    %load_ext widgets          # the notebook extension: %%deferred, %deferred_status, rich display
    %%deferred                 # a cell whose modules and tensors are all deferred
    model = LlamaForCausalLM(config)

    import widgets
    ui = widgets.explore(transformers.LlamaForCausalLM, config)   # deferred_init + widget
    ui                                                            # display it
    ui = widgets.ExplorerWidget(model)                            # any module: deferred, partial, eager

Works wherever ipywidgets 8 and anywidget render (JupyterLab, Notebook 7, VS Code).

Layout: a module tree (left) with checkboxes (a parent selects its subtree), expand/collapse and
per node class, parameter count, bytes, device and state (fake / disk / remote / partly / materialized); tabs
Tensors / Ops / Graph / Memory following the selection; a details pane for the tensor opened from
the tensors table or the graph; the materialize bar at the bottom.

Stable CSS classes (for end-to-end tests and styling):

- `de-explorer`: the whole widget; `de-summary`: its one-line summary.
- tree: `de-tree`; each row `de-tree-node` (attributes `data-path`, `data-state`; the last
  selected row adds `de-tree-node-active`), holding `de-tree-toggle` (▸/▾), `de-tree-checkbox`
  (an `<input type=checkbox>`, indeterminate when partly selected), `de-tree-label` (click: select
  this subtree only), `de-tree-class`, `de-tree-params`, `de-tree-bytes`, `de-tree-device`,
  `de-tree-state` (also `de-state-<fake|disk|remote|partly|materialized|empty>`).
- tabs: `de-tabs`; `de-tensors-tab`, `de-ops-tab`, `de-graph-tab`, `de-memory-tab`.
- tables: `de-tensors-table`, `de-ops-table`, `de-memory-table`, `de-details-table`, each drawn as
  `table.de-table` with `th.de-table-header` (`data-column`; click: sort), `tr.de-table-row`
  (`data-key`: the tensor name, "<graph>:<index>" for ops, the module path in the memory table;
  click: select the row — opens the details pane for a tensor, drills into a module in the
  memory table; `de-table-row-selected`), `td.de-table-cell`, and `de-table-caption`.
- filters: `de-tensors-filter` (name text, dtype, device, state), `de-ops-filter` (kind).
- details pane: `de-details`, title `de-details-title`.
- toolbar: `de-toolbar`, holding the search box `de-search` (`de-search-input`, `de-search-regex`,
  `de-search-counts`, plus `de-search-error` on a bad pattern), the overlay dropdown `de-overlay`
  with its legend `de-overlay-legend` (`de-overlay-legend-item`, `data-label`), the tree toggle
  `de-tree-toggle-button` and the export bar `de-export` (`de-export-button`, `data-target`
  graph/table, `data-format`; `de-export-status`).
- tree extras: `de-tree-swatch` (the overlay colour), `de-tree-match` (a search match),
  `de-tree-alias` (holds a name on the open tensor's storage); tables: `de-table-row-highlighted`
  (a name on the open tensor's storage); graph: `de-graph-highlighted` (search match),
  `de-graph-alias` (storage sharer).
- details pane extras: `de-sharers-table`, the storage strip `de-storage-strip` with one
  `de-storage-bar` per name (`data-name`, `data-start`, `data-end` in bytes).
- compare widget: `de-compare`, `de-compare-summary`, tables `de-compare-modules`,
  `de-compare-tensors`, `de-compare-changes`; against a checkpoint path, `de-compare-checkpoint`
  (the check's HTML: `de-rich-checkpoint-check`, `data-ok`, table `de-rich-checkpoint-problems`).
- failure banner (a constructor that failed under deferred_init): `de-failure`, holding
  `de-failure-headline`, `tr.de-failure-field` (`data-field`: op, module_chain, source, code,
  reason), `de-failure-text`, `de-failure-traceback-toggle` and `de-failure-traceback`.
- graph: `de-graph` (the SVG view; inside it `de-graph-viewport`, `de-graph-canvas`, graphviz
  `g.node` / `g.cluster` with a `<title>` holding the node name, the open tensor's node marked
  `de-graph-selected`, mouse hints `de-graph-legend`; the colour legend is part of the SVG),
  controls `de-graph-depth`, `de-graph-closure`, `de-graph-rankdir` (left → right / top → down),
  the breadcrumb `de-graph-breadcrumb` of `de-graph-crumb` buttons, status `de-graph-status`; in
  the view `de-graph-fit`, `de-graph-readable` and `de-graph-scale`, and on `de-graph-root` the
  attributes `data-scale` and `data-label-px` (screen height of the smallest node label).
- memory: `de-memory-totals`, `de-dry-run-button`, `de-dry-run-status`, `de-dry-run-output`,
  `de-plan-button`, `de-plan-status`.
- materialize bar: `de-materialize-bar`, `de-device` and `de-rng` (dropdowns: target device, RNG
  mode eager/fast), `de-materialize-button` (both buttons; `de-materialize-selected`,
  `de-materialize-all` tell them apart), `de-cancel-button`, `de-progress`, `de-progress-text`,
  `de-status` (plus `de-status-error` after a failure), the Hub fetch line `de-fetch`, the
  preview line `de-preview` and the
  confirmation `de-confirm` (`de-confirm-text`, `de-confirm-button`, `de-confirm-cancel`).

Python mirrors of the clicks, for tests and scripts: `ui.select(path)`, `ui.tree.set_checked(path,
value)`, `ui.show_tensor(name)`, `ui.graph_tab.view.clicked = "<node name>"`, `ui.search(pattern,
regex=False)`, `ui.step_match(±1)`, `ui.set_overlay(mode)`, `ui.export(target, format)`,
`ui.materialize_selected(wait=True)`, `ui.materialize_all(wait=True)`, `ui.cancel()`.
Layout in files: selection.py (the checkbox rule), tree.py/tree.js, table.py/table.js (every
table), tensors_tab.py, details.py, ops_tab.py, graph.py/graph.js, memory_tab.py,
materialize_bar.py, explorer_widget.py (composition), formatting.py and states.py (text, colours).

ipywidgets controls carry these classes on their outer element (`.widget-button.de-...`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

import explorer

try:
    import anywidget  # noqa: F401 - imported only to fail here, with the install hint, when missing
    import ipywidgets  # noqa: F401 - as anywidget
except ImportError as error:  # the engine works without them; the notebook UI does not
    raise ImportError(
        f"the notebook explorer needs ipywidgets and anywidget ({error}); "
        "install them with `pip install deferred-explorer[widgets]`"
    ) from error

from .compare import CompareWidget, compare
from .explorer_widget import ExplorerWidget
from .extension import load_ipython_extension, unload_ipython_extension
from .materialize_bar import MaterializationCancelled
from .states import STATE_COLOURS

__all__ = [
    "STATE_COLOURS",
    "CompareWidget",
    "ExplorerWidget",
    "MaterializationCancelled",
    "compare",
    "explore",
    "load_ipython_extension",
    "unload_ipython_extension",
]


def explore(module_fn: Callable[..., nn.Module], *args: Any, **kwargs: Any) -> ExplorerWidget:
    """Build `module_fn(*args, **kwargs)` under `explorer.deferred_init` and return its explorer widget.

    Nothing is allocated: every parameter and buffer is fake until materialized from the widget.
    When the constructor fails (a `DeferredInitError`, or any exception it raises), the widget
    shows the failure in place: a red banner (op, module chain, source line, reason; the traceback
    behind a toggle) above the explorer of what was built up to the failing line. The exception is
    `ui.error`. Bad arguments to `explore` itself (a non-callable) still raise.
    """
    try:
        module = explorer.deferred_init(module_fn, *args, **kwargs)
    except Exception as error:
        if not _constructor_ran(error):
            raise
        partial = getattr(error, "partial_module", None)
        return ExplorerWidget(partial if isinstance(partial, nn.Module) else nn.Module(), error=error)
    return ExplorerWidget(module)


def _constructor_ran(error: BaseException) -> bool:
    """True when `error` came out of the constructor (deferred_init attached its partial recording)."""
    return getattr(error, "graph", None) is not None or hasattr(error, "deferred_graph")


__all__ = ["CompareWidget", "ExplorerWidget", "MaterializationCancelled", "STATE_COLOURS", "compare", "explore"]
