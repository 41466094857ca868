"""How each kind of node looks: one table, read by the DOT writer and by the legend.

Op styles follow `explorer.inspection.op_kind`; tensor styles follow the census states (a fake has
no storage yet: dashed, violet when a checkpoint read feeds it; a materialized tensor came from
replay: green; a real one was never fake). Checkpoint reads get their own op style.
"""

from __future__ import annotations

from ..inspection.census import DISK, FAKE, MATERIALIZED, REAL, REMOTE
from ..inspection.ops import COMPUTE, DATA, EXTERNAL_INPUT, FACTORY, INPLACE, RANDOM, VIEW

SUMMARY, FOLDED, MORE, ERROR = "module", "repeated modules", "more", "error"
CHECKPOINT_READ = "checkpoint read"  # explorer::read_safetensors / read_torch / read_dcp, drawn apart
MODULE_FAKE, MODULE_PARTLY, MODULE_MATERIALIZED, MODULE_REAL, MODULE_EMPTY = (
    "module: fake",
    "module: partly",
    "module: materialized",
    "module: real",
    "module: no tensors",
)
MODULE_DISK = "module: disk"
FORWARD_INPUT = "forward input"  # a tensor argument of forward (forward graphs)

_OP = {"shape": "box", "style": "rounded,filled"}
_TENSOR = {"shape": "ellipse"}

# style key → graphviz node attributes (the description is the legend's text)
STYLES: dict[str, dict[str, str]] = {
    FACTORY: {**_OP, "fillcolor": "#cfe2ff", "color": "#3d6eb4"},
    RANDOM: {**_OP, "fillcolor": "#ffd8a8", "color": "#c56b00"},
    INPLACE: {**_OP, "fillcolor": "#f8c9c4", "color": "#b02a1e"},
    VIEW: {"shape": "box", "style": "rounded,dashed,filled", "fillcolor": "#f1f3f5", "color": "#868e96"},
    COMPUTE: {**_OP, "fillcolor": "#ffffff", "color": "#495057"},
    DATA: {**_OP, "shape": "hexagon", "fillcolor": "#e5dbff", "color": "#6741d9"},
    EXTERNAL_INPUT: {**_OP, "fillcolor": "#fff3bf", "color": "#a08000", "peripheries": "2"},
    CHECKPOINT_READ: {**_OP, "shape": "cylinder", "style": "filled", "fillcolor": "#e5dbff", "color": "#7048e8"},
    FAKE: {**_TENSOR, "style": "dashed,filled", "fillcolor": "#ffffff", "color": "#495057"},
    DISK: {**_TENSOR, "style": "dashed,filled", "fillcolor": "#f3f0ff", "color": "#7048e8"},
    REMOTE: {**_TENSOR, "style": "dotted,filled", "fillcolor": "#e3fafc", "color": "#0c8599"},
    MATERIALIZED: {**_TENSOR, "style": "filled", "fillcolor": "#b2f2bb", "color": "#2b8a3e"},
    REAL: {**_TENSOR, "style": "filled", "fillcolor": "#dee2e6", "color": "#495057"},
    SUMMARY: {"shape": "box3d", "style": "filled", "fillcolor": "#e7f5ff", "color": "#1864ab"},
    FOLDED: {"shape": "box3d", "style": "filled", "fillcolor": "#d0ebff", "color": "#1864ab", "peripheries": "2"},
    MORE: {"shape": "note", "style": "filled", "fillcolor": "#fff9db", "color": "#868e96"},
    FORWARD_INPUT: {"shape": "cds", "style": "filled", "fillcolor": "#fff3bf", "color": "#a08000"},
    ERROR: {"shape": "octagon", "style": "filled", "fillcolor": "#ffc9c9", "color": "#c92a2a"},
    # module tree nodes, by how much of the subtree's memory exists
    MODULE_FAKE: {"shape": "box", "style": "rounded,dashed,filled", "fillcolor": "#ffffff", "color": "#1864ab"},
    MODULE_DISK: {"shape": "box", "style": "rounded,dashed,filled", "fillcolor": "#f3f0ff", "color": "#7048e8"},
    MODULE_PARTLY: {"shape": "box", "style": "rounded,filled", "fillcolor": "#ebfbee", "color": "#2b8a3e"},
    MODULE_MATERIALIZED: {"shape": "box", "style": "rounded,filled", "fillcolor": "#b2f2bb", "color": "#2b8a3e"},
    MODULE_REAL: {"shape": "box", "style": "rounded,filled", "fillcolor": "#dee2e6", "color": "#495057"},
    MODULE_EMPTY: {"shape": "box", "style": "rounded", "fillcolor": "#ffffff", "color": "#adb5bd"},
}

OP_LEGEND: tuple[tuple[str, str], ...] = (
    (FACTORY, "factory op (new storage)"),
    (RANDOM, "random op"),
    (INPLACE, "in-place op"),
    (VIEW, "view / alias op"),
    (COMPUTE, "compute op"),
    (DATA, "value read (.item())"),
    (EXTERNAL_INPUT, "reads an external tensor"),
    (CHECKPOINT_READ, "checkpoint read (file, key)"),
    (FAKE, "fake tensor"),
    (DISK, "fake tensor, values on disk"),
    (MATERIALIZED, "materialized tensor"),
    (REAL, "real tensor"),
    (SUMMARY, "collapsed module"),
    (FOLDED, "repeated identical modules"),
)

FORWARD_LEGEND: tuple[tuple[str, str], ...] = (
    (COMPUTE, "compute op"),
    (VIEW, "view / alias op"),
    (INPLACE, "in-place op"),
    (FACTORY, "factory op (new tensor)"),
    (RANDOM, "random op"),
    (FORWARD_INPUT, "forward input"),
    (FAKE, "parameter: fake"),
    (DISK, "parameter: fake, values on disk"),
    (MATERIALIZED, "parameter: materialized"),
    (REAL, "parameter: real"),
    (SUMMARY, "collapsed module"),
    (FOLDED, "repeated identical modules"),
)

MODULE_LEGEND: tuple[tuple[str, str], ...] = (
    (MODULE_FAKE, "all fake"),
    (MODULE_DISK, "all fake, values on disk"),
    (MODULE_PARTLY, "partly materialized"),
    (MODULE_MATERIALIZED, "materialized"),
    (MODULE_REAL, "real (eager)"),
    (MODULE_EMPTY, "no tensors"),
)

GRAPH_ATTRS = {
    "rankdir": "LR",
    "fontname": "Helvetica",
    "fontsize": "11",
    "labelloc": "t",
    "nodesep": "0.15",
    "ranksep": "0.3",
}
NODE_ATTRS = {"fontname": "Helvetica", "fontsize": "10", "margin": "0.08,0.03", "height": "0.3"}
EDGE_ATTRS = {"fontname": "Helvetica", "fontsize": "8", "color": "#495057", "arrowsize": "0.6"}
CLUSTER_ATTRS = {"style": "rounded,filled", "color": "#adb5bd", "fillcolor": "#f8f9fa11", "fontsize": "10"}
