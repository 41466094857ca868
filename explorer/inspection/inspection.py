"""`inspect(module)`: the four tables and the summary, built from one census of the module."""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd
from torch import nn

from .census import take_census
from .diff import InspectionDiff, diff_inspections
from .modules import modules_table
from .ops import ops_table
from .reads import READ_COLUMNS, reads_table
from .search import SearchResult, TextIndex
from .storages import storages_table
from .summary import summary_text
from .tensors import tensors_table

if TYPE_CHECKING:
    import networkx

    from ..analysis.init_table import InitReport  # analysis imports this package: at runtime only when used


@dataclass(frozen=True, repr=False)
class Inspection:
    """What a module holds and how it was built, as four pandas tables taken at one moment.

    `tensors`: one row per parameter/buffer name; `modules`: one row per module path; `ops`: one
    row per recorded op; `storages`: one row per piece of memory; `reads`: one row per recorded
    checkpoint read a name needs (empty unless weights come from a checkpoint). Each table's
    builder documents its columns (`explorer.inspection.tensors_table`, ...). The tables are snapshots: materializing
    later does not update them.
    """

    root_class: str
    tensors: pd.DataFrame
    modules: pd.DataFrame
    ops: pd.DataFrame
    storages: pd.DataFrame
    reads: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=READ_COLUMNS))
    # The inspected module, weakly: `init` reads its recording on first access.
    module: weakref.ReferenceType[nn.Module] | None = field(default=None, compare=False)

    def summary(self) -> str:
        """A few lines for the terminal: sizes, fake/materialized/real bytes, dtypes, devices, ops."""
        return summary_text(self.root_class, self.tensors, self.modules, self.ops, self.storages)

    def _repr_html_(self) -> str:
        """Rich display in notebooks (the text repr stays for terminals)."""
        from ..render.rich import inspection_html  # render reads this package: imported when displayed

        return inspection_html(self)

    def __repr__(self) -> str:
        return self.summary()

    @functools.cached_property
    def text_index(self) -> TextIndex:
        """The tables as searchable text, built on the first search."""
        return TextIndex(self.tensors, self.modules, self.ops)

    def diff(self, other: Inspection) -> InspectionDiff:
        """What changed from this inspection to `other`: modules and tensors added or removed, module
        classes, and tensor metadata (shape, stride, offset, dtype, device, kind, tie group)."""
        if not isinstance(other, Inspection):
            raise TypeError(f"Inspection.diff expects another Inspection, got {type(other).__name__}")
        return diff_inspections(self.modules, self.tensors, other.modules, other.tensors)

    def to_networkx(self) -> networkx.DiGraph:  # networkx comes with torch
        """The recorded ops as a directed graph for other tools: nodes "op:<graph>:<index>" (attributes
        op, kind, source) and "tensor:<name>" or "tensor:#<graph>:<id>" for unnamed intermediates
        (shape, dtype), edges input → op → output. The names are those `explorer.op_graph` draws."""
        import networkx

        graph = networkx.DiGraph()

        def tensor_node(graph_index: int, label: str) -> str:  # "#5" is unnamed tensor 5 of that graph
            return f"tensor:#{graph_index}:{label[1:]}" if label.startswith("#") else f"tensor:{label}"

        for row in self.ops.itertuples(index=False):
            op = f"op:{row.graph}:{row.index}"
            graph.add_node(op, type="op", op=row.op, kind=row.kind, source=row.source)
            for label in row.inputs:
                graph.add_edge(tensor_node(row.graph, label), op)
            for label, shape, dtype in zip(row.outputs, row.output_shapes, row.output_dtypes):
                node = tensor_node(row.graph, label)
                graph.add_node(node, type="tensor", shape=list(shape), dtype=dtype)
                graph.add_edge(op, node)
        for _node, data in graph.nodes(data=True):
            data.setdefault("type", "tensor")  # inputs from outside the recording (module arguments)
        return graph

    def to_json(self) -> dict:
        """`to_networkx()` as node-link JSON data (`networkx.node_link_data`): for `json.dump`."""
        import networkx

        return networkx.node_link_data(self.to_networkx(), edges="links")

    @functools.cached_property
    def init(self) -> InitReport:
        """The init audit of the inspected module (`explorer.init_report`'s table, `.summary()`, HTML
        display), computed on first access from the module as it is then. Raises ReferenceError
        when the module is gone."""
        from ..analysis.init_report import init_report
        from ..analysis.init_table import InitReport

        module = self.module() if self.module is not None else None
        if module is None:
            raise ReferenceError(f"Inspection.init: the inspected {self.root_class} no longer exists")
        return InitReport(self.root_class, init_report(module))

    def search(self, pattern: str, *, regex: bool = False) -> SearchResult:
        """Modules (path, class), tensors (name, shape, stride, dtype, device) and ops (name) matching
        `pattern`: a case-insensitive substring, or a regular expression with `regex=True`
        (SearchError when it does not compile). A module's tensors and ops match with it."""
        return self.text_index.search(pattern, regex=regex)


def inspect(module: nn.Module) -> Inspection:
    """Tables describing `module`: deferred (fake), partly materialized, or ordinary eager.

    Read-only: records nothing, materializes nothing, and leaves every tensor, module and recorded
    graph as it was. Raises TypeError when `module` is not an `nn.Module`.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"explorer.inspect expects an nn.Module, got {type(module).__name__}")
    census = take_census(module)
    return Inspection(
        root_class=type(module).__name__,
        tensors=tensors_table(census),
        modules=modules_table(census),
        ops=ops_table(census),
        storages=storages_table(census),
        reads=reads_table(census),
        module=weakref.ref(module),
    )
