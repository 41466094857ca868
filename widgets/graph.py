"""Graph tab: the op graph of the selection as SVG, with pan/zoom, a depth control, a closure toggle,
a direction choice (left-right / top-down), a breadcrumb of the focused module, and a switch between
what the constructor did ("construction") and what forward computes ("forward",
`explorer.forward_graph` on fake inputs of the shapes typed in the inputs box, which mirrors the
Memory tab's dry-run inputs once `follow` linked them).

`GraphView` is the anywidget (`graph.js`): it shows `svg` and sets `clicked` to the graphviz node
name (the SVG `<title>`: `module:<path>`, `cluster_module:<path>`, `tensor:<name>`, `op:<g>:<i>`)
of whatever the user clicks. `GraphTab` decides what to draw (`explorer.render.op_layout`) and renders
only while the tab is visible, because Graphviz layout is the slowest thing the explorer does. A
click on a folded "Class ×N" node unfolds those N modules (`unfold`); the view opens at a scale
where node labels are at least `min_label_px` pixels high, and its fit button shows everything.

A forward opens on the model's outline (`explorer.render.forward_view.FORWARD_FIRST_VIEW`: top-level
modules folded, repeated blocks as one "Class ×N", laid out top to bottom, fitted to the view):
the "outline" toggle, on until the depth slider is moved; it draws the whole model (a selected
module is drawn by depth, as in construction). Each kind keeps its own direction (construction
left to right, forward top to bottom until changed).

In forward mode a click on an op (`op:forward:<i>`) shows that op in the status line; search lights
up the forward ops whose name matches; the export bar exports the forward drawing; a "forward
colour" choice paints modules by their FLOPs or activation bytes instead of the explorer's overlay.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, Literal, get_args

import anywidget
import ipywidgets as w
import torch
import traitlets
from torch import nn

import explorer
from explorer.analysis.dry_run import shape_input_dtype
from explorer.naming import depth_of, dtype_name, format_bytes, parent_of
from explorer.render.dot import to_digraph
from explorer.render.forward_view import FORWARD_FIRST_VIEW, format_flops
from explorer.render.styles import FOLDED

from .front_end import source
from .memory_tab import parse_shapes
from .overlays import HEAT, NONE

DEFAULT_DEPTH = 2  # module levels drawn below the focus before collapsing into summary nodes
GraphKind = Literal["construction", "forward"]
GRAPH_KINDS: tuple[str, ...] = get_args(GraphKind)
ForwardColour = Literal["", "flops", "activation_bytes"]  # "": the explorer's overlay
INPUT_DTYPES = ("int64", "float32", "bfloat16", "float16")  # as the Memory tab's dry run offers
FORWARD_OP = "op:forward:"


def parse_click(name: str) -> tuple[str, str]:
    """A clicked node name → (kind, key) via `explorer.render.node_kind`; a cluster `<title>`
    (`cluster_module:<path>`) reads as the module it draws."""
    from explorer import render  # imports the submodule if `explorer/__init__` did not

    return render.node_kind(name.removeprefix("cluster_"))


class GraphView(anywidget.AnyWidget):
    """SVG with pan/zoom; `clicked` is the name of the last node or cluster clicked ("" after it is handled)."""

    _esm = source("graph.js")
    _css = source("style.css")

    svg = traitlets.Unicode("", help="The diagram drawn, as Graphviz SVG text").tag(sync=True)
    clicked = traitlets.Unicode(
        "", help='The last node or cluster clicked ("" after it is handled); the browser writes it'
    ).tag(sync=True)
    selected = traitlets.Unicode("", help="The node name drawn highlighted (the open tensor)").tag(sync=True)
    highlighted = traitlets.List(
        traitlets.Unicode(), help="Node names the search matched, drawn marked (no cluster_ prefix)"
    ).tag(sync=True)
    aliases = traitlets.List(traitlets.Unicode(), help="Node names sharing the open tensor's storage").tag(sync=True)
    module_colours = traitlets.Dict(help="Module path → overlay colour").tag(sync=True)
    min_label_px = traitlets.Int(9, help="Node label height in pixels that the first view's scale keeps").tag(sync=True)
    first_view = traitlets.Unicode(
        "readable", help='How a new drawing opens: "readable" (labels of min_label_px, from the top left) or "fit"'
    ).tag(sync=True)


def heat_colours(values: dict[str, int]) -> dict[str, str]:
    """Module path → a colour of `overlays.HEAT`, log scale between the smallest and largest value
    above zero (zero: the "no bytes" grey), as the explorer's bytes overlay paints."""
    nonzero = [v for v in values.values() if v > 0]
    if not nonzero:
        return {path: NONE for path in values}
    low, high = math.log(min(nonzero)), math.log(max(nonzero))
    span = high - low

    def colour(value: int) -> str:
        if value <= 0:
            return NONE
        step = len(HEAT) - 1 if span == 0 else int((math.log(value) - low) / span * len(HEAT))
        return HEAT[min(step, len(HEAT) - 1)]

    return {path: colour(value) for path, value in values.items()}


def forward_inputs(text: str, dtype: str) -> list[torch.Tensor]:
    """The inputs box's shapes ("1x128, 1x128") as tensors of `dtype`, never filled: forward_graph
    reads their metadata only. ValueError names a bad part (see `memory_tab.parse_shapes`)."""
    shapes = parse_shapes(text)
    if not shapes:
        raise ValueError("type the shapes of forward's inputs (e.g. 1x16) to draw the forward")
    return [torch.empty(shape, dtype=getattr(torch, dtype)) for shape in shapes]


def describe_forward_op(forward: explorer.ForwardGraph, index: int) -> str:
    """One line for the status bar: "op 12: mm in model.layers.0.mlp.up_proj (Linear) · [16, 32]
    float32, [32, 64] float32 → [16, 64] float32 · 65.5 kFLOP · creates 4.0 KiB"."""
    row = forward.ops.iloc[index]
    inputs = ", ".join(f"{list(s)} {d}" for s, d in zip(row["input_shapes"], row["input_dtypes"]))
    outputs = ", ".join(f"{list(s)} {d}" for s, d in zip(row["output_shapes"], row["output_dtypes"]))
    return (
        f"op {index}: {row['op']} in {row['module'] or '(root)'} ({row['class']}) · {inputs or 'no tensors'} → "
        f"{outputs or 'no tensors'} · {format_flops(int(row['flops']))} · creates {format_bytes(int(row['bytes']))}"
    )


class GraphTab(w.VBox):
    """Kind switch, depth slider, closure toggle, direction, forward inputs and status above a `GraphView`."""

    def __init__(self, module: nn.Module, max_depth: int) -> None:
        self.module = module
        self.depth = w.IntSlider(
            value=min(DEFAULT_DEPTH, max(max_depth, 1)),
            min=0,
            max=max(max_depth, 1),
            description="depth",
            tooltip="module levels drawn below the focus",
        )
        self.depth.add_class("de-graph-depth")
        self.closure = w.ToggleButton(
            value=False,
            description="closure",
            icon="sitemap",
            tooltip="draw only what materializing the selected tensor replays",
        )
        self.closure.add_class("de-graph-closure")
        self.rankdir = w.ToggleButtons(
            options=[("left → right", "LR"), ("top → down", "TB")],
            value="LR",
            tooltips=["ops flow left to right", "ops flow top to bottom"],
            style={"button_width": "90px"},
        )
        self.rankdir.add_class("de-graph-rankdir")
        self.kind = w.ToggleButtons(
            options=list(GRAPH_KINDS),
            value="construction",
            tooltips=["what the constructor recorded", "what forward computes, on fake inputs"],
            style={"button_width": "100px"},
        )
        self.kind.add_class("de-graph-kind")
        self._rankdirs = {"construction": "LR", "forward": str(FORWARD_FIRST_VIEW["rankdir"])}  # per kind
        self._shown_kind = "construction"
        self._settling = False  # a control change sets others: render once, after
        self._build_forward_controls()
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
        self.forward: explorer.ForwardGraph | None = None  # the forward drawn in forward mode
        self._forward_key: tuple | None = None  # (inputs text, dtype) `forward` was recorded for
        self._overlay_colours: dict | None = None  # the explorer's colours, while forward colours replace them
        self._search: tuple[str, bool] = ("", False)
        self.rendered: tuple | None = None  # (op_graph arguments, closure toggle, kind, inputs) of `view.svg`
        self.kind.observe(lambda _: self._kind_changed(), names="value")
        self.depth.observe(lambda _: self._depth_moved(), names="value")
        for control in (self.depth, self.closure, self.rankdir, self.kind, self.inputs, self.input_dtype, self.outline):
            control.observe(lambda _: self._maybe_render(), names="value")
        self.forward_colour.observe(lambda _: self._paint_forward(), names="value")
        self.view.observe(self._on_click, names="clicked")
        controls = w.HBox([self.kind, self.depth, self.closure, self.rankdir], layout=w.Layout(flex_flow="row wrap"))
        super().__init__([controls, self.forward_controls, self.breadcrumb, self.status, self.view])
        self.add_class("de-graph-tab")

    def _build_forward_controls(self) -> None:
        self.inputs = w.Text(
            placeholder="forward inputs, e.g. 1x128",
            description="inputs",
            tooltip="shapes of forward's tensor arguments (the Memory tab's dry-run inputs)",
        )
        self.inputs.add_class("de-graph-inputs")
        self.input_dtype = w.Dropdown(
            options=list(INPUT_DTYPES), value="int64", description="dtype", layout=w.Layout(width="180px")
        )
        self.input_dtype.add_class("de-graph-input-dtype")
        self.forward_colour = w.Dropdown(
            options=[("explorer overlay", ""), ("FLOPs", "flops"), ("activation bytes", "activation_bytes")],
            value="",
            description="colour",
            layout=w.Layout(width="260px"),
        )
        self.forward_colour.add_class("de-graph-forward-colour")
        self.outline = w.ToggleButton(
            value=bool(FORWARD_FIRST_VIEW["outline"]),
            description="outline",
            icon="list",
            tooltip="the whole model's outline: top-level modules folded, repeated blocks drawn once (off: by depth)",
        )
        self.outline.add_class("de-graph-outline")
        self.forward_controls = w.HBox(
            [self.inputs, self.input_dtype, self.forward_colour, self.outline],
            layout=w.Layout(flex_flow="row wrap", display="none"),
        )
        self.forward_controls.add_class("de-graph-forward-controls")

    def follow(self, memory_tab: Any, search_box: Any) -> None:
        """Share the Memory tab's dry-run inputs (both boxes stay equal) and light up forward ops
        matching the search box.

        Called once by the explorer; each argument is used through its public traits only
        (`shapes`, `input_dtype`; `query`, `regex`)."""
        w.link((memory_tab.shapes, "value"), (self.inputs, "value"))
        w.link((memory_tab.input_dtype, "value"), (self.input_dtype, "value"))
        search_box.observe(lambda _: self.search(search_box.query, search_box.regex), names=["query", "regex"])
        # The explorer sends its own matches after (or before) the box changes: keep ours added.
        self.view.observe(lambda _: self._highlight_forward(), names="highlighted")

    def update(self, focus: str | None, tensor: str | None, *, stale: bool = False) -> None:
        """Draw around module `focus` (None: everything), with `tensor` as the closure target.

        `stale` forces a re-render (states changed after materializing): the forward is recorded again."""
        if focus != self.focus or not self.breadcrumb.children:
            self._draw_breadcrumb(focus)
        self.focus, self.tensor = focus, tensor
        self.view.selected = f"tensor:{tensor}" if tensor else ""
        if stale:
            self.rendered = None
            self._forward_key = None
        self._maybe_render()

    def set_active(self, active: bool) -> None:
        """The tab became visible (render now if needed) or hidden (defer rendering)."""
        self.active = active
        self._maybe_render()

    def graph_arguments(self) -> dict:
        """The keyword arguments of `explorer.op_graph` for the current focus and controls.

        With the closure toggle on and a tensor open, the drawing is that tensor's closure alone
        (`op_graph` takes `focus=` or `closure_of=`, not both); the depth still counts from the focus.
        A forward drawing has no closures: the toggle is off there. A forward of the whole module with
        the outline toggle on is drawn as its outline (`outline=True`) instead of by depth.
        """
        outline = self.kind.value == "forward" and self.outline.value and not self.focus
        shared: dict = {"outline": True} if outline else {"depth": depth_of(self.focus or "") + self.depth.value}
        if self.unfolded:
            shared["unfold"] = sorted(self.unfolded)
        if self.rankdir.value != "LR":
            shared["rankdir"] = self.rankdir.value
        if self.closure.value and self.tensor and self.kind.value == "construction":
            return {"closure_of": self.tensor, **shared}
        return {"focus": self.focus or None, **shared}

    def forward_graph(self) -> explorer.ForwardGraph:
        """The forward for the typed inputs, recorded once per inputs (and again after materializing).

        Raises ValueError for unreadable shapes and `explorer.ForwardGraphError` when forward fails."""
        key = (self.inputs.value, self.input_dtype.value)
        if self.forward is None or key != self._forward_key:
            self.forward = None
            self.forward = explorer.forward_graph(self.module, *forward_inputs(*key))
            self._forward_key = key
        return self.forward

    def subject(self) -> nn.Module | explorer.ForwardGraph:
        """What `op_graph` draws: the module (construction) or its forward graph."""
        return self.forward_graph() if self.kind.value == "forward" else self.module

    def export_forward(self, format: str) -> tuple[str, bytes]:
        """(file name, bytes) of the forward drawing in `format` (svg, png, html), as the export bar saves it."""
        from explorer.render import export as diagrams

        arguments = self.graph_arguments()
        digraph = explorer.op_graph(self.forward_graph(), **arguments)
        stem, where = type(self.module).__name__, arguments.get("focus") or "all"
        name = f"{stem}-{where}-forward.{format}"
        if format == "svg":
            return name, diagrams.to_svg(digraph).encode()
        if format == "png":
            return name, diagrams.to_png(digraph)
        return name, diagrams.to_html(digraph, title=f"{stem} forward: {where}").encode()

    def search(self, pattern: str, regex: bool = False) -> list[str]:
        """Forward op nodes whose op name matches `pattern` (substring, or regular expression with
        `regex`, any case), kept among the view's highlights in forward mode; returns them."""
        self._search = (pattern, regex)
        return self._highlight_forward()

    def _forward_matches(self) -> list[str]:
        pattern, regex = self._search
        if self.kind.value != "forward" or self.forward is None or not pattern.strip():
            return []
        names = self.forward.ops["op"]
        try:
            hits = names.str.contains(pattern, regex=regex, case=False)
        except re.error:  # the explorer's search box reports the bad expression
            return []
        return [f"{FORWARD_OP}{i}" for i in self.forward.ops["index"][hits]]

    def _highlight_forward(self) -> list[str]:
        matches = self._forward_matches()
        wanted = [name for name in self.view.highlighted if not name.startswith(FORWARD_OP)] + matches
        if wanted != list(self.view.highlighted):
            self.view.highlighted = wanted
        return matches

    def is_folded(self, node: str) -> bool:
        """Whether `node` (a graphviz node name) is drawn as "Class ×N" in the current drawing."""
        return node in self.folded

    def unfold(self, node: str) -> None:
        """Draw the N modules a folded node stands for one by one (its parent's repeats unfold)."""
        self.unfolded.add(parent_of(node.removeprefix("module:")))
        self._maybe_render()

    def _depth_moved(self) -> None:
        if self.kind.value == "forward":  # the user asked for a depth: the forward is drawn by it
            self.outline.value = False

    def _kind_changed(self) -> None:
        forward = self.kind.value == "forward"
        self.forward_controls.layout.display = None if forward else "none"
        self.closure.disabled = forward
        self._settling = True  # the kind's own observer renders once, after these
        try:
            self._rankdirs[self._shown_kind] = self.rankdir.value
            self._shown_kind = self.kind.value
            self.rankdir.value = self._rankdirs[self.kind.value]
            if forward and not self.inputs.value and shape_input_dtype(self.module) == torch.int64:
                self.inputs.value = "1x16"  # a token model: a short sequence to start from
        finally:
            self._settling = False
        self._paint_forward()

    def _on_click(self, change: dict) -> None:
        name = change["new"]
        if name.startswith(FORWARD_OP) and self.forward is not None:
            self.status.value = describe_forward_op(self.forward, int(name[len(FORWARD_OP) :]))
            self.view.selected = name

    def _paint_forward(self) -> None:
        """Module colours by the forward's FLOPs or activation bytes, or the explorer's overlay back."""
        column: ForwardColour = self.forward_colour.value if self.kind.value == "forward" else ""
        if column and self.forward is not None:
            if self._overlay_colours is None:
                self._overlay_colours = dict(self.view.module_colours)
            modules = self.forward.modules
            self.view.module_colours = heat_colours(dict(zip(modules["name"], (int(v) for v in modules[column]))))
        elif self._overlay_colours is not None:
            self.view.module_colours, self._overlay_colours = self._overlay_colours, None

    def _draw_breadcrumb(self, focus: str | None) -> None:
        parts = focus.split(".") if focus else []
        paths = [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]
        buttons = []
        for path in paths:
            button = w.Button(
                description=(path.rpartition(".")[2] or "(root)"),
                tooltip=path or "(root)",
                layout=w.Layout(width="auto"),
            )
            button.add_class("de-graph-crumb")
            button.on_click(lambda _, path=path: self.on_crumb(path) if self.on_crumb else None)
            buttons.append(button)
        old = self.breadcrumb.children
        self.breadcrumb.children = buttons
        for button in old:  # a Button owns a Layout and a ButtonStyle model: close all three
            button.layout.close()
            button.style.close()
            button.close()

    def _render_key(self, arguments: dict) -> tuple:
        inputs = (self.inputs.value, self.input_dtype.value) if self.kind.value == "forward" else None
        return str(arguments), self.closure.value, self.kind.value, inputs

    def _maybe_render(self) -> None:
        if not self.active or self._settling:
            return
        arguments = self.graph_arguments()
        if self._render_key(arguments) == self.rendered:
            return
        self.render(arguments)

    def render(self, arguments: dict) -> None:
        """Lay out `explorer.op_graph(subject, **arguments)` and show it; failures go to the status line."""
        where = arguments.get("focus") or "whole module"
        if "closure_of" in arguments:
            where = f"closure of {arguments['closure_of']}"
        elif self.closure.value and self.kind.value == "construction":
            where += " (closure: open a tensor first)"
        try:
            layout_arguments = {key: value for key, value in arguments.items() if key != "rankdir"}
            diagram = explorer.render.op_layout(self.subject(), **layout_arguments)
            digraph = to_digraph(diagram, name="op_graph")
            digraph.graph_attr["rankdir"] = arguments.get("rankdir", "LR")
            svg = digraph.pipe(format="svg").decode()
        except Exception as error:  # shown to the user; the widget stays usable
            self.view.svg = ""
            self.folded = set()
            self.status.value = f"graph failed: {type(error).__name__}: {error}"
        else:
            self.folded = {node.name for node in diagram.nodes if node.style == FOLDED}  # the "×N" nodes drawn
            self.view.first_view = "fit" if arguments.get("outline") else "readable"  # before the drawing
            self.view.svg = svg
            folds = '; click a "×N" node to unfold it' if self.folded else ""
            how = "outline" if arguments.get("outline") else f"depth {arguments['depth']}"
            self.status.value = f"{self._forward_facts()}{where}, {how}{folds}"
            self._paint_forward()
            self.search(*self._search)
        self.rendered = self._render_key(arguments)

    def _forward_facts(self) -> str:
        if self.kind.value != "forward" or self.forward is None:
            return ""
        tensors = self.forward.graph.tensors
        inputs = ", ".join(
            f"{list(tensors[tid].shape)} {dtype_name(tensors[tid].dtype)}" for tid in self.forward.inputs.values()
        )
        return f"forward of {inputs}: {len(self.forward.graph.ops)} ops, {format_flops(self.forward.flops)} — "
