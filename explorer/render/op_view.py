"""The op diagram's decisions: which ops and tensors to draw, where, and what to fold or cut.

Steps, each over plain data:
1. scope: every op, or the ops a focused module's tensors need (their closures), or one tensor's
   closure, exactly as `InitGraph.closure_of` gives it;
2. placement: each op and tensor goes in its module's cluster, or, when that module is deeper than
   the collapse level, into one summary node for its ancestor at that level + 1 (or, with
   `outline`, into the node of its first module the outline does not open: see `folding`);
3. folding: sibling summaries of the same class with the same contents (op sequence, tensors,
   submodule structure, states) become one "Class ×N" node;
4. edges: an op reading a tensor gets an edge from the latest drawn op that produced or wrote that
   tensor's storage before it (so in-place chains read left to right); a named tensor gets one from
   the latest drawn op that produced or wrote it (with `marks_feed_readers`, a forward's parameter
   or input that no drawn op wrote gets edges to its readers instead);
5. cap: nodes in chronological order (a tensor right after the op that last wrote it); beyond
   `max_nodes`, the rest become one "N more ops/tensors not shown" node.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Literal, NamedTuple

from ..graph import InitGraph
from ..naming import depth_of, parent_of
from .diagram import Diagram, DiagramCluster, DiagramEdge, DiagramNode
from .folding import Collapse, Outline, Summary, collapse_level, collapsed_into, fold_siblings, outline_of, summary_node
from .labels import describe_mark, edge_label, op_node_of
from .names import ERROR_NODE, MORE_NODE, module_node, op_node
from .scene import Scene, TensorMark
from .scope import Scope, select_scope
from .styles import ERROR, MORE, OP_LEGEND


@dataclass(frozen=True)
class OpViewOptions:
    """What `op_graph` was asked for; see `explorer.render.op_graph` for the meaning of each."""

    depth: int | None = None
    focus: str | None = None
    closure_of: str | None = None
    max_nodes: int | None = 400
    edge_labels: bool = True
    fold_repeats: bool = True
    legend: bool = True
    unfold: frozenset[str] = frozenset()
    # Tensor nodes no drawn op produced (a forward's parameters and inputs) feed the ops that read
    # them: each is drawn just before its first reader, with an edge to every reader.
    marks_feed_readers: bool = False
    # The model's outline instead of a depth: top-level modules as nodes, repeated blocks as one
    # "Class ×N", own ops of opened modules folded (`folding.outline_of`).
    outline: bool = False


# -- 4. edges (steps 1 to 3 live in scope.py and folding.py) ----------------------------------------
def _latest_source(graph: InitGraph, drawn: set[int], tid: int, before: int) -> int | None:
    """The latest drawn op before `before` that produced tensor `tid` or wrote its storage."""
    info = graph.tensors[tid]
    best = info.producer if info.producer in drawn and info.producer < before else None
    writers = graph.writers.get(info.storage, ())
    for position in range(bisect.bisect_left(writers, before) - 1, -1, -1):
        writer = writers[position]
        if best is not None and writer <= best:
            break
        if writer in drawn:
            return writer
    return best


# -- the whole view ---------------------------------------------------------------------------------
def op_diagram(scene: Scene, options: OpViewOptions) -> Diagram:
    """Decide everything `op_graph` draws (see the module docstring for the steps)."""
    if options.max_nodes is not None and options.max_nodes < 1:
        raise ValueError(f"op_graph: max_nodes must be >= 1 or None, got {options.max_nodes}")
    scope = select_scope(scene, options.focus, options.closure_of)
    if options.outline and options.depth is not None:
        raise ValueError("op_graph: give depth= or outline=True, not both")
    level: Collapse = (
        outline_of(scene, scope.ops, options.focus)
        if options.outline
        else collapse_level(scene, options.depth, options.focus)
    )
    order = _chronological_order(scene, scope, options.marks_feed_readers)
    placement = _placement(scene, order.elements, level, options.fold_repeats, options.unfold)
    naming = _node_names(order.elements, placement)
    edges = _edges(scene, scope, order.anchors, naming, options.marks_feed_readers)

    kept = naming.names if options.max_nodes is None else naming.names[: options.max_nodes]
    diagram = Diagram(_title(scene, scope, options), legend=OP_LEGEND if options.legend else ())
    diagram.omitted = len(naming.names) - len(kept)
    _add_nodes(diagram, scene, kept, naming.builders, placement.summaries)
    _add_edges(diagram, scene, edges, set(kept), options.edge_labels)
    if scene.error is not None:
        _add_error(diagram, scene)
    if scene.has_modules:
        diagram.clusters = _clusters(scene, diagram.nodes)
    return diagram


Element = tuple[int, int] | TensorMark  # (graph, op index) or a named tensor


class ChronologicalOrder(NamedTuple):
    elements: list[Element]
    anchors: dict[int, int | None]  # id(mark) → the drawn op that last wrote it (None: drawn first)


def _first_readers(scene: Scene, scope: Scope) -> dict[tuple[int, int], tuple[int, int]]:
    """(graph, tensor id) → (graph, op index) of the first drawn op taking it as input."""
    first: dict[tuple[int, int], tuple[int, int]] = {}
    for graph, indices in scope.ops.items():
        for index in indices:
            for tid in scene.graphs[graph].ops[index].inputs:
                first.setdefault((graph, tid), (graph, index))
    return first


def _chronological_order(scene: Scene, scope: Scope, marks_feed_readers: bool = False) -> ChronologicalOrder:
    """Ops in order, each named tensor right after the drawn op that last wrote it (or, with
    `marks_feed_readers`, a tensor no drawn op wrote just before its first reader)."""
    readers = _first_readers(scene, scope) if marks_feed_readers else {}
    before: dict[tuple[int, int], list[TensorMark]] = {}
    anchors: dict[int, int | None] = {}
    after: dict[tuple[int, int], list[TensorMark]] = {}
    first: list[TensorMark] = []
    for mark in scope.marks:
        anchor: int | None = None
        reader: tuple[int, int] | None = None
        if mark.graph is not None and mark.tensor_id is not None:  # a recorded tensor (a real one has neither)
            drawn = scope.op_sets.get(mark.graph, set())
            anchor = _latest_source(scene.graphs[mark.graph], drawn, mark.tensor_id, len(scene.graphs[mark.graph].ops))
            if anchor is not None:
                after.setdefault((mark.graph, anchor), []).append(mark)
            else:
                reader = readers.get((mark.graph, mark.tensor_id))
        anchors[id(mark)] = anchor
        if reader is not None:
            before.setdefault(reader, []).append(mark)
        elif anchor is None:
            first.append(mark)
    order: list[Element] = list(first)
    for graph, indices in scope.ops.items():
        for index in indices:
            order.extend(before.get((graph, index), ()))
            order.append((graph, index))
            order.extend(after.get((graph, index), ()))
    return ChronologicalOrder(order, anchors)


class Placement(NamedTuple):
    hidden_in: list[str | None]  # per element: the collapsed module it is drawn inside, or None
    summaries: dict[str, Summary]  # collapsed module path → what it hides
    drawn_by: dict[str, str]  # collapsed module path → the path whose node stands for it (folds)


def _placement(
    scene: Scene, order: list[Element], level: Collapse, fold_repeats: bool, unfold: frozenset[str] = frozenset()
) -> Placement:
    """Which elements disappear into a collapsed module's summary node, and which repeats fold."""
    summaries: dict[str, Summary] = {}
    hidden_in: list[str | None] = []
    for element in order:
        if isinstance(element, TensorMark):
            anchor = collapsed_into(element.module, level)
            if anchor is not None:
                summaries.setdefault(anchor, Summary(anchor)).marks.append(element)
        else:
            anchor = collapsed_into(scene.owner(*element), level, own=True)
            if anchor is not None:
                own = isinstance(level, Outline) and anchor in level.opened
                summaries.setdefault(anchor, Summary(anchor, own=own)).ops.append(element)
        hidden_in.append(anchor)
    drawn_by = fold_siblings(scene, summaries, level, unfold) if fold_repeats else {p: p for p in summaries}
    return Placement(hidden_in, summaries, drawn_by)


# What a node is drawn from: a collapsed module's summary, a named tensor, or an op (graph, index).
NodeBuilder = (
    tuple[Literal["summary"], str] | tuple[Literal["mark"], TensorMark] | tuple[Literal["op"], tuple[int, int]]
)


class NodeNames(NamedTuple):
    names: list[str]  # in drawing order, each once
    builders: dict[str, NodeBuilder]  # name → what its node is built from
    of_op: dict[tuple[int, int], str]
    of_mark: dict[int, str]  # id(mark) → node name


def _node_names(order: list[Element], placement: Placement) -> NodeNames:
    """Node names first; the nodes themselves are built only for what survives the cap."""
    names: list[str] = []
    builders: dict[str, NodeBuilder] = {}
    name_of_op: dict[tuple[int, int], str] = {}
    name_of_mark: dict[int, str] = {}
    builder: NodeBuilder
    for element, anchor in zip(order, placement.hidden_in):
        if anchor is not None:
            drawn = placement.drawn_by[anchor]
            name, builder = module_node(drawn), ("summary", drawn)
        elif isinstance(element, TensorMark):
            name, builder = element.node, ("mark", element)
        else:
            name, builder = op_node(*element), ("op", element)
        if name not in builders:
            builders[name] = builder
            names.append(name)
        if isinstance(element, TensorMark):
            name_of_mark[id(element)] = name
        else:
            name_of_op[element] = name
    return NodeNames(names, builders, name_of_op, name_of_mark)


def _edges(
    scene: Scene, scope: Scope, anchors: dict[int, int | None], naming: NodeNames, marks_feed_readers: bool = False
) -> dict[tuple[str, str], tuple[int, int]]:
    """(tail, head) → (graph, tensor id) of the first tensor seen flowing along it."""
    edges: dict[tuple[str, str], tuple[int, int]] = {}
    feeding = {
        (mark.graph, mark.tensor_id): naming.of_mark[id(mark)]
        for mark in scope.marks
        if marks_feed_readers and anchors[id(mark)] is None
    }
    for graph, indices in scope.ops.items():
        recorded, drawn = scene.graphs[graph], scope.op_sets[graph]
        for index in indices:
            head = naming.of_op[(graph, index)]
            for tid in dict.fromkeys(recorded.ops[index].inputs):
                source = _latest_source(recorded, drawn, tid, index)
                tail = naming.of_op[(graph, source)] if source is not None else feeding.get((graph, tid))
                if tail is not None and tail != head:
                    edges.setdefault((tail, head), (graph, tid))
    for mark in scope.marks:
        anchor = anchors[id(mark)]
        if anchor is not None and mark.graph is not None and mark.tensor_id is not None:  # anchored: recorded
            tail, head = naming.of_op[(mark.graph, anchor)], naming.of_mark[id(mark)]
            if tail != head:
                edges.setdefault((tail, head), (mark.graph, mark.tensor_id))
    return edges


def _add_nodes(
    diagram: Diagram,
    scene: Scene,
    kept: list[str],
    builders: dict[str, NodeBuilder],
    summaries: dict[str, Summary],
) -> None:
    """The nodes that survive the cap, then the "N more" node if anything was cut."""
    for name in kept:
        builder = builders[name]
        if builder[0] == "summary":
            diagram.nodes.append(summary_node(scene, summaries[builder[1]]))
        elif builder[0] == "mark":
            mark = builder[1]
            diagram.nodes.append(DiagramNode(name, mark.state, mark.name, describe_mark(mark), mark.module))
        else:
            key = builder[1]
            diagram.nodes.append(op_node_of(scene, key[0], key[1], scene.owner(*key)))
    if diagram.omitted:
        diagram.nodes.append(
            DiagramNode(
                MORE_NODE,
                MORE,
                f"{diagram.omitted} more ops/tensors not shown",
                ["raise max_nodes, collapse (depth=) or focus to see them"],
            )
        )


def _add_edges(
    diagram: Diagram, scene: Scene, edges: dict[tuple[str, str], tuple[int, int]], shown: set[str], edge_labels: bool
) -> None:
    """Edges between shown nodes; where the drawing is cut, dashed edges to or from "N more"."""
    for (tail, head), (graph, tid) in edges.items():
        if tail in shown and head in shown:
            label = edge_label(scene.graphs[graph], tid) if edge_labels else ""
            diagram.edges.append(DiagramEdge(tail, head, label))
    if diagram.omitted:
        cut = {
            (tail if tail in shown else MORE_NODE, head if head in shown else MORE_NODE)
            for tail, head in edges
            if tail not in shown or head not in shown
        }
        diagram.edges.extend(DiagramEdge(t, h, dashed=True) for t, h in sorted(cut) if t != h)


def _add_error(diagram: Diagram, scene: Scene) -> None:
    """The failure as a node, after the last recorded op drawn."""
    assert scene.error is not None  # op_diagram calls this only for a failed recording
    message = scene.error.strip().splitlines()
    last = next((node.name for node in reversed(diagram.nodes) if node.name.startswith("op:")), None)
    diagram.nodes.append(DiagramNode(ERROR_NODE, ERROR, "construction failed here", message[:6]))
    if last is not None:
        diagram.edges.append(DiagramEdge(last, ERROR_NODE, dashed=True))


def _clusters(scene: Scene, nodes: list[DiagramNode]) -> dict[str, DiagramCluster]:
    used: set[str] = set()
    for node in nodes:
        path = node.cluster
        while path is not None and path not in used:
            used.add(path)
            path = parent_of(path) if path else None
    clusters: dict[str, DiagramCluster] = {}
    for path in sorted(used, key=lambda p: (depth_of(p), p)):
        cls = scene.module_classes.get(path, "?")
        title, subtitle = (path, cls) if path else (cls, "")
        clusters[path] = DiagramCluster(path, title, subtitle, parent_of(path) if path else None)
    return clusters


def _title(scene: Scene, scope: Scope, options: OpViewOptions) -> str:
    ops = sum(len(indices) for indices in scope.ops.values())
    parts = [f"{scene.root_class}: {ops} ops, {len(scope.marks)} tensors"]
    if scope.description:
        parts.append(scope.description)
    if options.depth is not None and scene.has_modules:
        parts.append(f"modules below depth {options.depth} collapsed")
    if options.outline and scene.has_modules:
        parts.append("outline: modules folded, repeated blocks drawn once")
    if scene.error is not None:
        parts.append("construction failed: recorded up to the failing op")
    return "; ".join(parts)
