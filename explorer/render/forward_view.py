"""The forward diagram: `op_view`'s decisions on a forward scene, then forward's own labels.

`op_diagram` decides what is drawn (placement in module clusters, collapsing below `depth`, "Class
×N" folding, the node cap) exactly as for construction; this file then renames the op nodes into
the forward namespace (`op:forward:<i>`, so they never collide with construction ops in searches
and clicks), and writes the forward's facts into labels: FLOPs on op nodes, FLOPs and activation
bytes (bytes of the storages the ops created) per module on clusters and collapsed modules, the
forward's totals in the title, and the forward legend.

`FORWARD_FIRST_VIEW` is how a forward is first shown (the Graph tab's default): the model's outline
(`op_graph(..., outline=True)`: top-level modules as nodes, repeated blocks as one "Class ×N", the
ops a model runs outside its submodules folded into one node) laid out top to bottom, so the
model's shape (embedding → N × block → norm → head) is the first thing on screen.
"""

from __future__ import annotations

from dataclasses import replace

from ..analysis.forward_graph import ForwardGraph
from ..naming import dtype_name, format_bytes
from .diagram import Diagram, DiagramNode
from .forward_scene import forward_scene
from .names import forward_op_node, node_kind
from .op_view import OpViewOptions, op_diagram
from .styles import FOLDED, FORWARD_LEGEND, SUMMARY

FORWARD_FIRST_VIEW: dict[str, object] = {"outline": True, "rankdir": "TB"}  # op_graph keywords
_FLOP_UNITS = ("", "k", "M", "G", "T", "P", "E")


def format_flops(count: int) -> str:
    """999 → "999 FLOP", 1500 → "1.5 kFLOP", 3 * 10**12 → "3.0 TFLOP" (decimal units)."""
    value, unit = float(count), 0
    while value >= 1000 and unit < len(_FLOP_UNITS) - 1:
        value, unit = value / 1000, unit + 1
    return f"{count} FLOP" if unit == 0 else f"{value:.1f} {_FLOP_UNITS[unit]}FLOP"


def module_facts(forward: ForwardGraph, path: str, times: int = 1) -> str:
    """ "126 ops · 295.0 kFLOP · act 58.1 KiB" for module `path`'s subtree (× `times`)."""
    ops, flops, created = forward.module_totals(path)
    return f"{ops * times} ops · {format_flops(flops * times)} · act {format_bytes(created * times)}"


def forward_layout(forward: ForwardGraph, options: OpViewOptions) -> Diagram:
    """What `op_graph(forward_graph)` draws, as plain data (see the module docstring)."""
    diagram = op_diagram(forward_scene(forward), replace(options, marks_feed_readers=True))
    renamed = {node.name: _forward_name(node.name) for node in diagram.nodes}
    for node in diagram.nodes:
        node.name = renamed[node.name]
        if node.name.startswith("op:forward:"):
            _label_op(forward, node)
        elif node.style in (SUMMARY, FOLDED):
            _label_module(forward, node)
    for edge in diagram.edges:
        edge.tail, edge.head = renamed.get(edge.tail, edge.tail), renamed.get(edge.head, edge.head)
    for cluster in diagram.clusters.values():
        facts = module_facts(forward, cluster.path)
        cluster.subtitle = f"{cluster.subtitle} · {facts}" if cluster.subtitle else facts
    diagram.title = _title(forward, diagram.title)
    diagram.legend = FORWARD_LEGEND if diagram.legend else ()
    return diagram


def _forward_name(name: str) -> str:
    kind, key = node_kind(name)
    return forward_op_node(int(key.rpartition(":")[2])) if kind == "op" else name


def _label_op(forward: ForwardGraph, node: DiagramNode) -> None:
    index = int(node.name.rpartition(":")[2])
    row = forward.ops.iloc[index]
    node.lines = [format_flops(int(row["flops"]))] if row["flops"] else []
    inputs = ", ".join(f"{list(s)} {d}" for s, d in zip(row["input_shapes"], row["input_dtypes"]))
    outputs = ", ".join(f"{list(s)} {d}" for s, d in zip(row["output_shapes"], row["output_dtypes"]))
    node.tooltip = (
        f"{row['aten']} in {row['module'] or '(root)'} ({row['class']})\n"
        f"inputs: {inputs or 'none'}\noutputs: {outputs or 'none'}\n"
        f"{format_flops(int(row['flops']))} · creates {format_bytes(int(row['bytes']))}"
    )


def own_facts(forward: ForwardGraph, path: str) -> str:
    """ "4 ops · 0 FLOP · act 192 B" for the ops module `path` ran itself (not its submodules)."""
    rows = forward.ops[forward.ops["module"] == path]
    return f"{len(rows)} ops · {format_flops(int(rows['flops'].sum()))} · act {format_bytes(int(rows['bytes'].sum()))}"


def _label_module(forward: ForwardGraph, node: DiagramNode) -> None:
    path = node.name.removeprefix("module:")
    if node.cluster == path:  # an outline's node for a module's own ops, drawn inside its box
        node.lines = [node.lines[0], own_facts(forward, path)]
    elif node.style == FOLDED:  # "Class ×N": N identical modules, the first one's totals N times
        times = int(node.title.rpartition("×")[2])
        node.lines = [
            node.lines[0],
            f"each: {module_facts(forward, path)}",
            f"total: {module_facts(forward, path, times)}",
        ]
    else:
        node.lines = [node.lines[0], module_facts(forward, path)]


def _title(forward: ForwardGraph, title: str) -> str:
    _, _, rest = title.partition("; ")
    inputs = ", ".join(
        f"{name} {list(forward.graph.tensors[tid].shape)} {dtype_name(forward.graph.tensors[tid].dtype)}"
        for name, tid in forward.inputs.items()
    )
    head = (
        f"{forward.root_class} forward ({inputs or 'no tensor inputs'}): {len(forward.graph.ops)} ops, "
        f"{format_flops(forward.flops)}, activations {format_bytes(int(forward.ops['bytes'].sum()))}"
    )
    return f"{head}; {rest}" if rest else head
