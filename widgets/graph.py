"""Graph tab: the op graph of the selection as SVG, with pan/zoom, a depth control, a closure toggle,
a direction choice (left-right / top-down) and a breadcrumb of the focused module.

`GraphView` is the anywidget (`graph.js`): it shows `svg` and sets `clicked` to the graphviz node
name (the SVG `<title>`: `module:<path>`, `cluster_module:<path>`, `tensor:<name>`, `op:<g>:<i>`)
of whatever the user clicks. `GraphTab` decides what to draw (`explorer.render.op_layout`) and renders
only while the tab is visible, because Graphviz layout is the slowest thing the explorer does. A
click on a folded "Class ×N" node unfolds those N modules (`unfold`); the view opens at a scale
where node labels are at least `min_label_px` pixels high, and its fit button shows everything.
"""

from __future__ import annotations

import html
import re
from typing import Callable

import anywidget
import ipywidgets as w
import traitlets
from torch import nn

import explorer
from explorer.naming import depth_of, parent_of
from explorer.render.styles import FOLDED

# Folded nodes carry their style as an SVG class (explorer/render/dot.py); the title is the node name.
# Graphviz writes "-" in a class as "&#45;".
_FOLDED_NODE = re.compile(r'<g id="[^"]*" class="node ' + "(?:-|&#45;)".join(
    re.escape(part) for part in ("de-style-" + FOLDED.replace(" ", "-")).split("-")) + r'">\s*<title>([^<]*)</title>')

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
    min_label_px = traitlets.Int(9).tag(sync=True)  # the first view's scale keeps node labels this high


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
        self.rankdir = w.ToggleButtons(options=[("left → right", "LR"), ("top → down", "TB")], value="LR",
                                       tooltips=["ops flow left to right", "ops flow top to bottom"],
                                       style={"button_width": "90px"})
        self.rankdir.add_class("de-graph-rankdir")
        self.breadcrumb = w.HBox([], layout=w.Layout(flex_flow="row wrap"))
        self.breadcrumb.add_class("de-graph-breadcrumb")
        self.on_crumb: Callable[[str], None] | None = None  # the explorer selects the clicked module
        self.unfolded: set[str] = set()  # modules whose "Class ×N" children are drawn one by one
        self.folded: set[str] = set()  # node names drawn as "Class ×N" in the current drawing
        self.status = w.Label("")
        self.status.add_class("de-graph-status")
        self.view = GraphView()
        self.view.add_class("de-graph")
        self.active = False
        self.focus: str | None = None
        self.tensor: str | None = None
        self.rendered: tuple | None = None  # (op_graph keyword arguments, closure toggle) of `view.svg`
        for control in (self.depth, self.closure, self.rankdir):
            control.observe(lambda _: self._maybe_render(), names="value")
        super().__init__([w.HBox([self.depth, self.closure, self.rankdir], layout=w.Layout(flex_flow="row wrap")),
                          self.breadcrumb, self.status, self.view])
        self.add_class("de-graph-tab")

    def update(self, focus: str | None, tensor: str | None, *, stale: bool = False) -> None:
        """Draw around module `focus` (None: everything), with `tensor` as the closure target.

        `stale` forces a re-render (states changed after materializing)."""
        if focus != self.focus or not self.breadcrumb.children:
            self._draw_breadcrumb(focus)
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
        shared: dict = {"depth": depth}
        if self.unfolded:
            shared["unfold"] = sorted(self.unfolded)
        if self.rankdir.value != "LR":
            shared["rankdir"] = self.rankdir.value
        if self.closure.value and self.tensor:
            return {"closure_of": self.tensor, **shared}
        return {"focus": self.focus or None, **shared}

    def is_folded(self, node: str) -> bool:
        """Whether `node` (a graphviz node name) is drawn as "Class ×N" in the current drawing."""
        return node in self.folded

    def unfold(self, node: str) -> None:
        """Draw the N modules a folded node stands for one by one (its parent's repeats unfold)."""
        self.unfolded.add(parent_of(node.removeprefix("module:")))
        self._maybe_render()

    def _draw_breadcrumb(self, focus: str | None) -> None:
        parts = focus.split(".") if focus else []
        paths = [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]
        buttons = []
        for path in paths:
            button = w.Button(description=(path.rpartition(".")[2] or "(root)"), tooltip=path or "(root)",
                              layout=w.Layout(width="auto"))
            button.add_class("de-graph-crumb")
            button.on_click(lambda _, path=path: self.on_crumb(path) if self.on_crumb else None)
            buttons.append(button)
        old = self.breadcrumb.children
        self.breadcrumb.children = buttons
        for button in old:  # a Button owns a Layout and a ButtonStyle model: close all three
            button.layout.close()
            button.style.close()
            button.close()

    def _maybe_render(self) -> None:
        if not self.active:
            return
        arguments = self.graph_arguments()
        if (str(arguments), self.closure.value) == self.rendered:
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
            self.folded = set()
            self.status.value = f"graph failed: {type(error).__name__}: {error}"
        else:
            self.folded = {html.unescape(name) for name in _FOLDED_NODE.findall(svg)}
            self.view.svg = svg
            folds = f"; click a \"×N\" node to unfold it" if self.folded else ""
            self.status.value = f"{where}, depth {arguments['depth']}{folds}"
        self.rendered = (str(arguments), self.closure.value)
