"""`ExplorerWidget`: the module tree, the four tabs, a tensor details pane and the materialize bar.

Composition only: it keeps one `explorer.inspect` snapshot of the module, turns the tree's checked
set into a scope for the tabs, routes graph clicks back to the tree and the details pane, and takes
a fresh snapshot after each materialization.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import ipywidgets as w
from torch import nn

import explorer

from explorer.record.failure import FailureReport, failure_report

from .details import TensorDetails
from .failure_banner import FailureBanner
from .graph import GraphTab, parse_click
from .materialize_bar import MaterializeBar
from .memory_tab import MemoryTab
from .ops_tab import OpsTab
from .tensors_tab import TensorsTab
from .tree import ModuleTree

TAB_TITLES = ("Tensors", "Ops", "Graph", "Memory")
GRAPH_TAB = TAB_TITLES.index("Graph")


class ExplorerWidget(w.VBox):
    """Explore `module` (deferred, partly materialized or eager): display it in a notebook.

    Python API mirrors the clicks: `select(path)`, `selection`, `show_tensor(name)`,
    `materialize_selected(wait=...)`, `materialize_all(wait=...)`, `cancel()`, `refresh()`.

    `error`: the exception of a construction that failed under `deferred_init`; `module` is then
    what it had built (`error.partial_module`). A red banner reports the failure, the views show
    the partial recording, and materializing is off.
    """

    def __init__(self, module: nn.Module, *, error: BaseException | None = None) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"ExplorerWidget expects an nn.Module, got {type(module).__name__}")
        self.module = module
        self.error = error
        self.failure: FailureReport | None = failure_report(error) if error is not None else None
        self.inspection = explorer.inspect(module)
        modules = self.inspection.modules
        self.tree = ModuleTree(modules, self.inspection.root_class)
        self.tensors_tab = TensorsTab()
        self.ops_tab = OpsTab()
        self.graph_tab = GraphTab(module, max_depth=int(modules["depth"].max()))
        self.memory_tab = MemoryTab(module)
        self.details = TensorDetails()
        self.tabs = w.Tab(children=[self.tensors_tab, self.ops_tab, self.graph_tab, self.memory_tab],
                          titles=list(TAB_TITLES))
        self.tabs.add_class("de-tabs")
        self.bar = MaterializeBar(module, self.selected_modules, self.refresh)
        self.summary = w.Label("")
        self.summary.add_class("de-summary")
        self.tensor: str | None = None  # the tensor the details pane shows
        # Views are redrawn from the kernel thread (clicks) and the materialize thread (refresh).
        self._views_lock = threading.RLock()

        self.tree.observe(lambda _: self._update_views(), names="checked")
        self.tensors_tab.table.observe(self._on_row_selected, names="selected")
        self.memory_tab.table.observe(self._on_memory_row, names="selected")
        self.graph_tab.view.observe(self._on_graph_click, names="clicked")
        self.tabs.observe(lambda change: self.graph_tab.set_active(change["new"] == GRAPH_TAB),
                          names="selected_index")
        tree_box = w.VBox([self.tree], layout=w.Layout(flex="0 0 auto"))
        main = w.VBox([self.tabs, self.details], layout=w.Layout(flex="1 1 auto", min_width="0"))
        banner = [FailureBanner(self.failure)] if self.failure is not None else []
        super().__init__([*banner, self.summary, w.HBox([tree_box, main]), self.bar])
        self.add_class("de-explorer")
        if self.failure is not None:
            self.bar.disable("construction failed: fix the constructor and build again to materialize")
        self._update_views()

    # -- selection ---------------------------------------------------------------------------------
    @property
    def selection(self) -> list[str]:
        """Checked module paths, in tree order."""
        return list(self.tree.checked)

    def select(self, path: str) -> None:
        """Select module `path` and its subtree (replacing the selection), as clicking its label does."""
        self.tree.select(path)

    def selected_modules(self) -> list[nn.Module]:
        """The checked modules (objects), for "Materialize selected"."""
        return [self.module.get_submodule(path) for path in self.tree.checked]

    def show_tensor(self, name: str) -> None:
        """Open the details pane on tensor `name` and mark its row (and graph node)."""
        self.details.show(self.inspection.tensors, self.inspection.storages, name)
        self.tensor = name
        if self.tensors_tab.table.selected != name:
            self.tensors_tab.table.selected = name
        self.graph_tab.update(self.tree.selection.focus(self.tree.checked), name)

    # -- materialization ---------------------------------------------------------------------------
    def materialize_selected(self, wait: bool = False) -> Any:
        """Materialize the selected modules' own tensors (background thread unless `wait`)."""
        return self.bar.materialize_selected(wait=wait)

    def materialize_all(self, wait: bool = False) -> Any:
        """Materialize the whole module (background thread unless `wait`)."""
        return self.bar.materialize_all(wait=wait)

    def cancel(self) -> None:
        """Cancel a running materialization; the module keeps its previous state."""
        self.bar.cancel()

    def refresh(self) -> None:
        """Re-inspect the module and redraw every view (states, colours, tables, graph)."""
        with self._views_lock:
            self.inspection = explorer.inspect(self.module)
            self.tree.update(self.inspection.modules)
            self._update_views(stale=True)
            if self.tensor is not None:
                self.details.show(self.inspection.tensors, self.inspection.storages, self.tensor)

    def close(self) -> None:
        """Close the explorer: stop a running materialization and close every widget model it made
        (children, layouts, styles), so the front-end views go and the module can be freed."""
        bar = getattr(self, "bar", None)  # absent when __init__ refused its argument (__del__ closes)
        if bar is not None:
            bar.cancel()
            bar.join()
        for widget in _widget_tree(self):
            if widget is not self:
                widget.close()
        super().close()

    # -- wiring ------------------------------------------------------------------------------------
    def _update_views(self, stale: bool = False) -> None:
        with self._views_lock:
            self._draw_views(stale)

    def _draw_views(self, stale: bool) -> None:
        inspection = self.inspection
        checked = self.tree.checked
        scope = set(checked) if checked else None
        roots = self.tree.selection.roots(checked)
        self.summary.value = inspection.summary().splitlines()[0] + (
            f" — selected: {len(checked)} modules" if checked else " — nothing selected: showing everything")
        self.tensors_tab.update(inspection.tensors, scope)
        self.ops_tab.update(inspection.ops, scope)
        self.memory_tab.update(inspection.tensors, inspection.modules, inspection.storages, scope, roots)
        self.graph_tab.update(self.tree.selection.focus(checked), self.tensor, stale=stale)

    def _on_row_selected(self, change: dict) -> None:
        if change["new"] and change["new"] != self.tensor:
            self.show_tensor(change["new"])

    def _on_graph_click(self, change: dict) -> None:
        name = change["new"]
        if not name:
            return
        try:
            kind, key = parse_click(name)
            handlers: dict[str, Callable[[str], None]] = {"module": self.select, "tensor": self._graph_tensor}
            if kind in handlers:
                handlers[kind](key)
        except KeyError as error:  # a node the tree or the tables do not know: say so, stay usable
            self.graph_tab.status.value = f"{name}: {error.args[0]}"
        finally:
            self.graph_tab.view.clicked = ""  # so clicking the same node again reports again

    def _on_memory_row(self, change: dict) -> None:
        if change["new"] != "":  # a module row: drill down into it
            self.memory_tab.table.selected = ""
            self.select(change["new"])

    def _graph_tensor(self, key: str) -> None:
        if key.startswith("#"):  # an intermediate with no name: nothing to open
            self.graph_tab.status.value = f"{key} is an intermediate tensor (not a parameter or buffer)"
            return
        self.show_tensor(key)


def _widget_tree(root: w.Widget) -> list[w.Widget]:
    """`root` and every widget reachable through its synced traits (children, layout, style...)."""
    seen: dict[int, w.Widget] = {}
    pending = [root]
    while pending:
        widget = pending.pop()
        if id(widget) in seen:
            continue
        seen[id(widget)] = widget
        for name in widget.keys:
            value = getattr(widget, name, None)
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(item, w.Widget):
                    pending.append(item)
    return list(seen.values())
