"""`Diagram` → `graphviz.Digraph`: the only place that writes DOT statements.

The body is written line by line rather than through `Digraph.node` / `Digraph.edge`: those quote
ids their own way (`edge("op:0:12", ...)` reads as node `op`, port `0`, compass `12`, and a name
like `<b>` would pass as an HTML label). Here every id goes through `escape.dot_id` and every label
is an HTML-like label built from `escape.html_text`.
"""

from __future__ import annotations

import graphviz

from .diagram import Diagram, DiagramCluster, DiagramNode
from .escape import dot_id, esc_string, html_text
from .names import LEGEND_NODE, cluster_name
from .styles import CLUSTER_ATTRS, EDGE_ATTRS, GRAPH_ATTRS, NODE_ATTRS, STYLES


def _attributes(attributes: dict[str, str]) -> str:
    return " ".join(f"{key}={dot_id(value)}" for key, value in attributes.items())


def _label(title: str, lines: list[str], small: bool = True) -> str:
    parts = [f"<b>{html_text(title)}</b>"] if title else []
    for line in lines:
        text = html_text(line)
        parts.append(f'<font point-size="8">{text}</font>' if small else text)
    return "<" + "<br/>".join(parts) + ">"


def _node_statement(node: DiagramNode) -> str:
    # The style as an SVG class ("node de-style-repeated-modules"): viewers can find folded nodes.
    css_class = "de-style-" + node.style.replace(" ", "-")
    statement = (
        f"{dot_id(node.name)} [label={_label(node.title, node.lines)} {_attributes(STYLES[node.style])}"
        f" class={esc_string(css_class)}"
    )
    if node.tooltip:
        statement += f" tooltip={esc_string(node.tooltip)}"
    return statement + "]"


def _legend_statement(legend: tuple[tuple[str, str], ...]) -> str:
    rows = ['<tr><td colspan="2"><b>legend</b></td></tr>']
    for style, text in legend:
        attributes = STYLES[style]
        rows.append(
            f'<tr><td bgcolor="{attributes["fillcolor"]}" color="{attributes["color"]}" width="18"> </td>'
            f'<td align="left">{html_text(text)}</td></tr>'
        )
    table = '<table border="0" cellborder="1" cellspacing="2" cellpadding="2">' + "".join(rows) + "</table>"
    return f'{dot_id(LEGEND_NODE)} [shape=plaintext fontsize="8" label=<{table}>]'


def to_digraph(diagram: Diagram, name: str = "diagram") -> graphviz.Digraph:
    """The graphviz graph drawing `diagram`: one subgraph `cluster_module:<path>` per cluster."""
    by_cluster: dict[str | None, list[DiagramNode]] = {}
    for node in diagram.nodes:
        by_cluster.setdefault(node.cluster, []).append(node)
    children: dict[str | None, list[DiagramCluster]] = {}
    for cluster in diagram.clusters.values():
        children.setdefault(cluster.parent, []).append(cluster)

    body: list[str] = []
    if diagram.title:
        body.append(f"\tlabel={_label(diagram.title, [], small=False)}\n")

    def emit(scope: str | None, indent: str) -> None:
        for node in by_cluster.get(scope, ()):
            body.append(f"{indent}{_node_statement(node)}\n")
        for cluster in children.get(scope, ()):
            body.append(f"{indent}subgraph {dot_id(cluster_name(cluster.path))} {{\n")
            inner = indent + "\t"
            body.append(
                f"{inner}graph [{_attributes(CLUSTER_ATTRS)} "
                f"label={_label(cluster.title, [cluster.subtitle] if cluster.subtitle else [])}]\n"
            )
            emit(cluster.path, inner)
            body.append(f"{indent}}}\n")

    emit(None, "\t")
    for edge in diagram.edges:
        attributes = []
        if edge.label:
            attributes.append(f"label={_label('', [edge.label])}")
        if edge.dashed:
            attributes.append("style=dashed")
        suffix = f" [{' '.join(attributes)}]" if attributes else ""
        body.append(f"\t{dot_id(edge.tail)} -> {dot_id(edge.head)}{suffix}\n")
    if diagram.legend:
        body.append(f"\t{_legend_statement(diagram.legend)}\n")
    return graphviz.Digraph(name=name, graph_attr=GRAPH_ATTRS, node_attr=NODE_ATTRS, edge_attr=EDGE_ATTRS, body=body)
