"""Node names of the diagrams: the graphviz ids, which the SVG keeps as `<title>` text.

The notebook widget maps a click back to Python by parsing these, so the scheme is the contract:

- `op:<graph index>:<op index>`        one recorded op;
- `op:forward:<op index>`              one op of a forward graph (`explorer.forward_graph`);
- `tensor:<qualified name>`            a named parameter/buffer (the first name of a tied group);
- `tensor:#<graph index>:<tensor id>`  a recorded tensor the module does not hold by name;
- `tensor:#forward:<tensor id>`        a forward graph's input (a tensor argument of forward);
- `module:<module path>`               a collapsed module (the root is `module:`);
- `cluster_module:<module path>`       the cluster (subgraph) drawing one module;
- `more:`, `legend:`, `error:`         the "N more" node, the legend, the failure of a partial graph.
"""

from __future__ import annotations

OP, TENSOR, MODULE, CLUSTER, MORE, LEGEND, ERROR = "op", "tensor", "module", "cluster", "more", "legend", "error"
_CLUSTER_PREFIX = "cluster_module:"
_KINDS = frozenset({OP, TENSOR, MODULE, MORE, LEGEND, ERROR})

MORE_NODE, LEGEND_NODE, ERROR_NODE = "more:", "legend:", "error:"


def op_node(graph: int, index: int) -> str:
    return f"op:{graph}:{index}"


def tensor_node(name: str) -> str:
    return f"tensor:{name}"


def unnamed_tensor_node(graph: int, tensor_id: int) -> str:
    return f"tensor:#{graph}:{tensor_id}"


def forward_op_node(index: int) -> str:
    return f"op:forward:{index}"


def forward_input_node(tensor_id: int) -> str:
    return f"tensor:#forward:{tensor_id}"


def module_node(path: str) -> str:
    return f"module:{path}"


def cluster_name(path: str) -> str:
    return _CLUSTER_PREFIX + path


def node_kind(name: str) -> tuple[str, str]:
    """Split a node (or cluster) name into (kind, key).

    >>> node_kind("tensor:layers.0.weight"), node_kind("op:0:12"), node_kind("module:")
    (('tensor', 'layers.0.weight'), ('op', '0:12'), ('module', ''))

    Clusters give ("cluster", module path); unnamed tensors keep their `#` ("tensor", "#0:5").
    Raises ValueError for a name that no diagram of this package produces.
    """
    if name.startswith(_CLUSTER_PREFIX):
        return CLUSTER, name[len(_CLUSTER_PREFIX) :]
    kind, colon, key = name.partition(":")
    if not colon or kind not in _KINDS:
        raise ValueError(f"{name!r} is not a diagram node name (expected op:, tensor:, module:, cluster_module:...)")
    return kind, key
