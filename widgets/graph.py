"""Graph tab: the op graph of the selection as SVG, with pan/zoom, a depth control and a closure toggle.

`GraphView` is the anywidget (`graph.js`): it shows `svg` and sets `clicked` to the graphviz node
name (the SVG `<title>`: `module:<path>`, `cluster_module:<path>`, `tensor:<name>`, `op:<g>:<i>`)
of whatever the user clicks. `GraphTab` decides what to draw (`explorer.op_graph`) and renders only
while the tab is visible, because Graphviz layout is the slowest thing the explorer does.
"""

from __future__ import annotations

import anywidget
import ipywidgets as w
import traitlets
from torch import nn

import explorer
from explorer.naming import depth_of

from .front_end import source

DEFAULT_DEPTH = 2  # module levels drawn below the focus before collapsing into summary nodes


def parse_click(name: str) -> tuple[str, str]:
    """A clicked node name → (kind, key) via `explorer.render.node_kind`; a cluster `<title>`
    (`cluster_module:<path>`) reads as the module it draws."""
    from explorer import render  # imports the submodule if `explorer/__init__` did not

    return render.node_kind(name.removeprefix("cluster_"))


class GraphView(anywidget.AnyWidget):
    """SVG with pan/zoom; `clicked` is the name of the last node or cluster clicked ("" after it is handled)."""

    _esm = source("graph.js")
    _css = source("style.css")

    svg = traitlets.Unicode("").tag(sync=True)
    clicked = traitlets.Unicode("").tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)  # node name drawn highlighted (the open tensor)
    highlighted = traitlets.List(traitlets.Unicode()).tag(sync=True)  # search matches (node names, no cluster_)
    aliases = traitlets.List(traitlets.Unicode()).tag(sync=True)  # names sharing the open tensor's storage
    module_colours = traitlets.Dict().tag(sync=True)  # module path → overlay colour


class GraphTab(w.VBox):
    """Depth slider, closure toggle and status line above a `GraphView`."""

    def __init__(self, module: nn.Module, max_depth: int) -> None:
        self.module = module
        self.depth = w.IntSlider(value=min(DEFAULT_DEPTH, max(max_depth, 1)), min=0, max=max(max_depth, 1),
                                 description="depth", tooltip="module levels drawn below the focus")
        self.depth.add_class("de-graph-depth")
        self.closure = w.ToggleButton(value=False, description="closure", icon="sitemap",
                                      tooltip="draw only what materializing the selected tensor replays")
        self.closure.add_class("de-graph-closure")
        self.status = w.Label("")
        self.status.add_class("de-graph-status")
        self.view = GraphView()
        self.view.add_class("de-graph")
        self.active = False
        self.focus: str | None = None
        self.tensor: str | None = None
        self.rendered: tuple | None = None  # (op_graph keyword arguments, closure toggle) of `view.svg`
        for control in (self.depth, self.closure):
            control.observe(lambda _: self._maybe_render(), names="value")
        super().__init__([w.HBox([self.depth, self.closure]), self.status, self.view])
        self.add_class("de-graph-tab")

    def update(self, focus: str | None, tensor: str | None, *, stale: bool = False) -> None:
        """Draw around module `focus` (None: everything), with `tensor` as the closure target.

        `stale` forces a re-render (states changed after materializing)."""
        self.focus, self.tensor = focus, tensor
        self.view.selected = f"tensor:{tensor}" if tensor else ""
        if stale:
            self.rendered = None
        self._maybe_render()

    def set_active(self, active: bool) -> None:
        """The tab became visible (render now if needed) or hidden (defer rendering)."""
        self.active = active
        self._maybe_render()

    def graph_arguments(self) -> dict:
        """The keyword arguments of `explorer.op_graph` for the current focus and controls.

        With the closure toggle on and a tensor open, the drawing is that tensor's closure alone
        (`op_graph` takes `focus=` or `closure_of=`, not both); the depth still counts from the focus.
        """
        depth = depth_of(self.focus or "") + self.depth.value
        if self.closure.value and self.tensor:
            return {"closure_of": self.tensor, "depth": depth}
        return {"focus": self.focus or None, "depth": depth}

    def _maybe_render(self) -> None:
        if not self.active:
            return
        arguments = self.graph_arguments()
        if (arguments, self.closure.value) == self.rendered:
            return
        self.render(arguments)

    def render(self, arguments: dict) -> None:
        """Lay out `explorer.op_graph(module, **arguments)` and show it; failures go to the status line."""
        where = arguments.get("focus") or "whole module"
        if "closure_of" in arguments:
            where = f"closure of {arguments['closure_of']}"
        elif self.closure.value:
            where += " (closure: open a tensor first)"
        try:
            svg = explorer.op_graph(self.module, **arguments).pipe(format="svg").decode()
        except Exception as error:  # shown to the user; the widget stays usable
            self.view.svg = ""
            self.status.value = f"graph failed: {type(error).__name__}: {error}"
        else:
            self.view.svg = svg
            self.status.value = f"{where}, depth {arguments['depth']}"
        self.rendered = (arguments, self.closure.value)
