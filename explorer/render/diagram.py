"""A diagram as plain data: what is drawn, with which style, inside which module, before any DOT.

The views (`op_view`, `module_view`) decide what to show; `dot` turns a `Diagram` into graphviz.
Keeping the decision in plain data makes it testable without parsing DOT and keeps escaping in one
place (all text here is raw; only the DOT writer escapes).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class DiagramNode:
    """One node: `name` follows `names`; `style` is a key of `styles.STYLES`."""

    name: str
    style: str
    title: str  # first line of the label, in bold
    lines: list[str] = field(default_factory=list)  # further label lines
    cluster: str | None = None  # module path of the innermost cluster holding it; None: top level
    tooltip: str = ""


@dataclass(slots=True)
class DiagramEdge:
    tail: str
    head: str
    label: str = ""
    dashed: bool = False


@dataclass(slots=True)
class DiagramCluster:
    """The box drawing one module; `parent` is the enclosing module's path (None for the outermost)."""

    path: str
    title: str
    subtitle: str
    parent: str | None


@dataclass
class Diagram:
    title: str
    nodes: list[DiagramNode] = field(default_factory=list)
    edges: list[DiagramEdge] = field(default_factory=list)
    clusters: dict[str, DiagramCluster] = field(default_factory=dict)  # path → cluster, parents first
    legend: tuple[tuple[str, str], ...] = ()  # (style, text) rows of the legend; empty: no legend
    omitted: int = 0  # nodes left out by the cap (drawn as one "N more" node)

    def node(self, name: str) -> DiagramNode:
        """The node called `name`; KeyError when it is not drawn."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def members(self, path: str) -> list[str]:
        """Names of the nodes drawn directly inside the cluster of module `path`."""
        return [node.name for node in self.nodes if node.cluster == path]
