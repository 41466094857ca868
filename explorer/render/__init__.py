"""Diagrams of a module's construction: graphviz graphs of recorded ops and of the module tree.

census / graph → scene (what can be drawn) → op_view / module_view (what is drawn: plain `Diagram`
data) → dot (graphviz.Digraph) → export (SVG, PNG, standalone HTML).
"""

from .api import module_graph, module_layout, op_graph, op_layout
from .diagram import Diagram, DiagramCluster, DiagramEdge, DiagramNode
from .export import save, to_html, to_png, to_svg
from .names import node_kind

__all__ = [
    "Diagram",
    "DiagramCluster",
    "DiagramEdge",
    "DiagramNode",
    "module_graph",
    "module_layout",
    "node_kind",
    "op_graph",
    "op_layout",
    "save",
    "to_html",
    "to_png",
    "to_svg",
]
