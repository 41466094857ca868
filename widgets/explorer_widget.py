"""`ExplorerWidget`: a toolbar (search, overlay, tree toggle), the module tree, the four tabs, a
tensor details pane and the materialize bar.

Composition only: it keeps one `explorer.inspect` snapshot of the module, turns the tree's checked
set into a scope for the tabs, sends search matches, overlay colours and the open tensor's storage
sharers to every view, routes graph clicks back to the tree and the details pane, and takes a
fresh snapshot after each materialization.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as w
from torch import nn

import explorer
from explorer.inspection import SearchError, SearchResult
from explorer.record.failure import FailureReport, failure_report

from .details import TensorDetails
from .export_bar import ExportBar
from .failure_banner import FailureBanner
from .formatting import cell_text
from .graph import GraphTab, parse_click
from .init_tab import InitTab
from .materialize_bar import MaterializeBar
from .materialize_preview import MaterializePreview, preview
from .memory_tab import MemoryTab
from .ops_tab import OpsTab
from .overlays import OVERLAY_MODES, Overlay, overlay
from .search_box import SearchBox
from .tensors_tab import TensorsTab
from .tree import ModuleTree

TAB_TITLES = ("Tensors", "Ops", "Graph", "Memory", "Init")
GRAPH_TAB = TAB_TITLES.index("Graph")
OPS_TAB = TAB_TITLES.index("Ops")
TENSORS_TAB = TAB_TITLES.index("Tensors")
INIT_TAB = TAB_TITLES.index("Init")


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
        self.details = TensorDetails(module)
        self.init_tab = InitTab(module)
        self.tabs = w.Tab(
            children=[self.tensors_tab, self.ops_tab, self.graph_tab, self.memory_tab, self.init_tab],
            titles=list(TAB_TITLES),
        )
        self.tabs.add_class("de-tabs")
        self.bar = MaterializeBar(module, self.selected_modules, self.refresh, preview=self.materialize_preview)
        self.bar.show_held(self.inspection.storages)
        self.summary = w.Label("")
        self.summary.add_class("de-summary")
        self.search_box = SearchBox(self.step_match)
        self.search_box.add_class("de-search-box")
        self.search_result = SearchResult("", False)
        self.match_index = -1  # the match Enter last jumped to
        self.overlay_mode = w.Dropdown(
            options=list(OVERLAY_MODES), value="state", description="colour by", layout=w.Layout(width="200px")
        )
        self.overlay_mode.add_class("de-overlay")
        self.legend = w.HTML("")
        self.legend.add_class("de-overlay-legend")
        self.overlay: Overlay | None = None
        self.tree_toggle = w.ToggleButton(
            value=True,
            description="tree",
            icon="sitemap",
            tooltip="show or hide the module tree",
            layout=w.Layout(width="80px"),
        )
        self.tree_toggle.add_class("de-tree-toggle-button")
        self.export_bar = ExportBar(self.export_data)
        self.export_bar.add_class("de-export-bar")
        self.tensor: str | None = None  # the tensor the details pane shows
        # Views are redrawn from the kernel thread (clicks) and the materialize thread (refresh).
        self._views_lock = threading.RLock()

        self.tree.observe(lambda _: self._update_views(), names="checked")
        self.tensors_tab.table.observe(self._on_row_selected, names="selected")
        self.memory_tab.table.observe(self._on_memory_row, names="selected")
        self.graph_tab.view.observe(self._on_graph_click, names="clicked")
        self.graph_tab.on_crumb = self.select
        self.tabs.observe(lambda change: self.graph_tab.set_active(change["new"] == GRAPH_TAB), names="selected_index")
        self.tabs.observe(lambda change: self.init_tab.set_active(change["new"] == INIT_TAB), names="selected_index")
        self.search_box.observe(
            lambda _: self.search(self.search_box.query, regex=self.search_box.regex), names=["query", "regex"]
        )
        self.overlay_mode.observe(lambda change: self.set_overlay(change["new"]), names="value")
        self.tree_toggle.observe(self._toggle_tree, names="value")
        self.graph_tab.follow(self.memory_tab, self.search_box)  # forward view: shared inputs, search
        self.tree_box = w.VBox([self.tree], layout=w.Layout(flex="0 0 auto"))
        self.tree_box.add_class("de-tree-box")
        main = w.VBox([self.tabs, self.details], layout=w.Layout(flex="1 1 auto", min_width="0"))
        banner = [FailureBanner(self.failure)] if self.failure is not None else []
        toolbar = w.HBox(
            [self.search_box, self.overlay_mode, self.legend, self.tree_toggle, self.export_bar],
            layout=w.Layout(flex_flow="row wrap", align_items="center"),
        )
        toolbar.add_class("de-toolbar")
        super().__init__([*banner, self.summary, toolbar, w.HBox([self.tree_box, main]), self.bar])
        self.add_class("de-explorer")
        if self.failure is not None:
            self.bar.disable("construction failed: fix the constructor and build again to materialize")
        self.set_overlay("state")
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
        """Open the details pane on tensor `name`, mark its row and graph node, and light up every
        name sharing its storage (views, ties, `.data` aliases) in the tree, the table and the graph."""
        self.details.show(self.inspection.tensors, self.inspection.storages, name)
        self.tensor = name
        if self.tensors_tab.table.selected != name:
            self.tensors_tab.table.selected = name
        self._mark_sharers()
        self.graph_tab.update(self.tree.selection.focus(self.tree.checked), name)

    @property
    def sharers(self) -> list[str]:
        """Names on the open tensor's storage (itself included); empty when no tensor is open."""
        return list(self.details.sharers)

    def _mark_sharers(self) -> None:
        names = self.details.sharers if self.tensor is not None else []
        tensors = self.inspection.tensors
        owners = tensors.loc[tensors["name"].isin(names), "module"].tolist()
        with self.tree.hold_sync():
            for owner in owners:
                self.tree.reveal(owner)
            self.tree.aliases = list(dict.fromkeys(owners))
        self.tensors_tab.table.highlighted = list(names)
        self.graph_tab.view.aliases = [f"tensor:{name}" for name in names]

    # -- search --------------------------------------------------------------------------------------
    def search(self, pattern: str, *, regex: bool = False) -> SearchResult:
        """Find `pattern` (substring, or regular expression with `regex`) in module paths and classes,
        tensor names, shapes, strides, dtypes, devices and op names: the tree expands to the matches
        and marks them, the Tensors and Ops tabs keep only matching rows, graph nodes light up. An
        empty pattern clears the search. A bad regular expression is reported in the search box."""
        with self.search_box.hold_sync():
            if self.search_box.query != pattern:
                self.search_box.query = pattern
            if self.search_box.regex != regex:
                self.search_box.regex = regex
        try:
            result = self.inspection.search(pattern, regex=regex)
        except SearchError as error:
            self.search_box.counts, self.search_box.error = str(error), True
            return self.search_result
        self.search_result, self.match_index = result, -1
        active = bool(pattern.strip())
        matched_modules = list(
            dict.fromkeys(
                result.modules
                + self.inspection.tensors.loc[self.inspection.tensors["name"].isin(result.tensors), "module"].tolist()
            )
        )
        with self._views_lock:
            with self.tree.hold_sync():
                if active:
                    self.tree.expand(result.reveal)
                self.tree.matches = matched_modules if active else []
            self.tensors_tab.set_search(result.tensors if active else None)
            self.ops_tab.set_search(result.ops if active else None)
            self.graph_tab.view.highlighted = (
                (
                    [f"module:{m}" for m in result.modules]
                    + [f"tensor:{t}" for t in result.tensors]
                    + [f"op:{o}" for o in result.ops]
                )
                if active
                else []
            )
        self.search_box.counts, self.search_box.error = (result.counts_text() if active else ""), False
        return result

    def step_match(self, step: int = 1) -> tuple[str, str] | None:
        """Go to the next (`step=1`, Enter) or previous (-1, Shift+Enter) match: a module is selected,
        a tensor opened in the details pane, an op picked in the Ops tab. Returns (kind, key)."""
        targets = self.search_result.targets()
        if not targets:
            return None
        self.match_index = (self.match_index + step) % len(targets)
        kind, key = targets[self.match_index]
        if kind == "module":
            self.select(key)
        elif kind == "tensor":
            self.tree.reveal(self._module_of(key))
            self.tabs.selected_index = TENSORS_TAB
            self.show_tensor(key)
        else:
            self.tabs.selected_index = OPS_TAB
            self.ops_tab.table.selected = key
        self.search_box.counts = (
            f"{self.search_result.counts_text()} — {self.match_index + 1} of {len(targets)}: {key or '(root)'}"
        )
        return kind, key

    def _module_of(self, tensor: str) -> str:
        tensors = self.inspection.tensors
        return str(tensors.loc[tensors["name"] == tensor, "module"].iloc[0])

    # -- overlay -------------------------------------------------------------------------------------
    def set_overlay(self, mode: str) -> Overlay:
        """Colour the tree and the graph's modules by `mode` ("state", "bytes", "dtype", "device")."""
        result = overlay(self.inspection.modules, mode)
        self.overlay = result
        if self.overlay_mode.value != mode:
            self.overlay_mode.value = mode  # observed: comes back here once, cheaply
        self.tree.colours = result.colours
        self.graph_tab.view.module_colours = result.colours
        self.legend.value = "".join(
            f'<span class="de-overlay-legend-item" data-label="{html.escape(label)}">'
            f'<span class="de-overlay-legend-swatch" style="background:{colour}"></span>{html.escape(label)}</span>'
            for label, colour in result.legend
        )
        return result

    # -- export --------------------------------------------------------------------------------------
    def export(self, target: str, format: str) -> Path | None:
        """Save the current diagram ("graph": svg, png, html) or the current tab's table ("table":
        csv, parquet) beside the notebook (`export_bar.folder`), as the export buttons do."""
        return self.export_bar.export(target, format)

    def export_data(self, target: str, format: str) -> tuple[str, bytes]:
        """(file name, bytes) of the current diagram or table in `format`."""
        from explorer.render import export as diagrams

        stem = self.inspection.root_class
        if target == "graph" and self.graph_tab.kind.value == "forward":
            return self.graph_tab.export_forward(format)
        if target == "graph":
            arguments = self.graph_tab.graph_arguments()
            digraph = explorer.op_graph(self.module, **arguments)
            where = arguments.get("focus") or arguments.get("closure_of") or "all"
            name = f"{stem}-{where}-graph.{format}"
            if format == "svg":
                return name, diagrams.to_svg(digraph).encode()
            if format == "png":
                return name, diagrams.to_png(digraph)
            return name, diagrams.to_html(digraph, title=f"{stem}: {where}").encode()
        tab = TAB_TITLES[self.tabs.selected_index or 0]
        table = {"Tensors": self.tensors_tab.table, "Ops": self.ops_tab.table, "Memory": self.memory_tab.table}.get(
            tab, self.tensors_tab.table
        )
        frame = table.current_frame()
        name = f"{stem}-{tab.lower() if tab != 'Graph' else 'tensors'}.{format}"
        if format == "csv":
            return name, frame.to_csv(index=False).encode()
        flat = frame.apply(lambda column: column.map(cell_text) if column.dtype == object else column)
        return name, flat.to_parquet(index=False)

    def _toggle_tree(self, change: dict) -> None:
        self.tree_box.layout.display = None if change["new"] else "none"

    # -- materialization ---------------------------------------------------------------------------
    def materialize_selected(self, wait: bool = False) -> Any:
        """Materialize the selected modules' own tensors (background thread unless `wait`)."""
        return self.bar.materialize_selected(wait=wait)

    def materialize_all(self, wait: bool = False) -> Any:
        """Materialize the whole module (background thread unless `wait`)."""
        return self.bar.materialize_all(wait=wait)

    def release_selected(self) -> None:
        """Release the selected modules' own materialized tensors: fake again, memory returned."""
        self.bar.release_selected()

    def materialize_preview(self, what: str = "selection", device: str | None = None) -> MaterializePreview:
        """What materializing the selection (`what="selection"`) or the "whole module" on `device`
        (default: the bar's) would do: tensors, bytes, checkpoint files read, whether it fits, time."""
        scope = set(self.tree.checked) if what == "selection" else None
        return preview(
            self.inspection.tensors,
            scope,
            what=what,
            device=device or self.bar.device.value,
            throughput=self.bar.throughput,
            reads=self.inspection.reads,
        )

    def cancel(self) -> None:
        """Cancel a running materialization; the module keeps its previous state."""
        self.bar.cancel()

    def refresh(self) -> None:
        """Re-inspect the module and redraw every view (states, colours, tables, graph)."""
        with self._views_lock:
            self.inspection = explorer.inspect(self.module)
            self.tree.update(self.inspection.modules)
            self.bar.show_held(self.inspection.storages)
            self._update_views(stale=True)
            if self.init_tab.audited:  # an audit shown is kept current; an unopened tab stays lazy
                self.init_tab.refresh()
            if self.tensor is not None and self.tensor not in set(self.inspection.tensors["name"]):
                self.tensor = None  # gone with its module (surgery in a deferred block): the pane closes
                self.details.hide()
            if self.tensor is not None:
                self.details.show(self.inspection.tensors, self.inspection.storages, self.tensor)
            self.set_overlay(self.overlay_mode.value)
            if self.search_box.query:
                self.search(self.search_box.query, regex=self.search_box.regex)

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
            f" — selected: {len(checked)} modules" if checked else " — nothing selected: showing everything"
        )
        self.tensors_tab.update(inspection.tensors, scope)
        self.ops_tab.update(inspection.ops, scope)
        self.memory_tab.update(inspection.tensors, inspection.modules, inspection.storages, scope, roots)
        self.graph_tab.update(self.tree.selection.focus(checked), self.tensor, stale=stale)
        if self.bar.preview_of is not None:  # absent while __init__ builds the views
            self.bar.update_preview("selection" if checked else "whole module")

    def _on_row_selected(self, change: dict) -> None:
        if change["new"] and change["new"] != self.tensor:
            self.show_tensor(change["new"])

    def _on_graph_click(self, change: dict) -> None:
        name = change["new"]
        if not name:
            return
        try:
            kind, key = parse_click(name)
            if kind == "module" and self.graph_tab.is_folded(name):  # "Class ×N": draw the N modules
                self.graph_tab.unfold(name)
                return
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
