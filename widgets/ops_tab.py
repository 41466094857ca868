"""Ops tab: the recorded ops that build the selected modules' tensors, filterable by kind.

Reads `inspect(module).ops`; an op belongs to the selection when its `modules` (the modules
holding a tensor whose closure contains it) intersect the selected paths.
"""

from __future__ import annotations

from collections.abc import Collection

import ipywidgets as w
import pandas as pd

from explorer.inspection.ops import OP_KINDS

from .table import DataTable

ALL = "all"
COLUMNS = ["index", "op", "kind", "inputs", "outputs", "output_shapes", "modules", "source"]


def ops_of(ops: pd.DataFrame, scope: Collection[str] | None, kind: str = ALL) -> pd.DataFrame:
    """Rows of the ops table serving a module in `scope` (None: all rows), of `kind` (or all)."""
    if scope is not None:
        wanted = set(scope)
        hits = [not wanted.isdisjoint(modules) for modules in ops["modules"].tolist()]
        ops = ops[pd.Series(hits, index=ops.index, dtype=bool)]  # a plain list would pick columns when empty
    if kind != ALL:
        ops = ops[ops["kind"] == kind]
    return ops


def modules_text(paths: list[str]) -> str:
    """The `modules` cell: paths, the root module written "(root)"."""
    return ", ".join(path or "(root)" for path in paths)


class OpsTab(w.VBox):
    """A kind filter above a `DataTable` of ops; row keys are "<graph>:<index>"."""

    def __init__(self) -> None:
        self.kind_filter = w.Dropdown(
            options=[ALL, *OP_KINDS], value=ALL, description="kind", layout=w.Layout(width="220px")
        )
        self.kind_filter.add_class("de-ops-filter")
        self.kind_filter.observe(lambda _: self._draw(), names="value")
        self.table = DataTable()
        self.table.add_class("de-ops-table")
        self._ops = pd.DataFrame(columns=COLUMNS + ["graph"])
        self._scope: Collection[str] | None = None
        self._search: set[str] | None = None
        super().__init__([self.kind_filter, self.table])
        self.add_class("de-ops-tab")

    def update(self, ops: pd.DataFrame, scope: Collection[str] | None) -> None:
        """Show `ops` (an inspection's ops table) for the modules in `scope`."""
        self._ops, self._scope = ops, scope
        self._draw()

    def set_search(self, keys: Collection[str] | None) -> None:
        """Keep only the ops whose "<graph>:<index>" key is in `keys` (search matches); None: no search."""
        self._search = set(keys) if keys is not None else None
        self._draw()

    def rows(self) -> pd.DataFrame:
        """The ops rows passing the scope, the search and the kind filter (before sorting), with their `key`."""
        rows = ops_of(self._ops, self._scope, self.kind_filter.value)
        rows = rows.assign(key=rows["graph"].astype(str) + ":" + rows["index"].astype(str))
        return rows if self._search is None else rows[rows["key"].isin(self._search)]

    def _draw(self) -> None:
        self.table.show(self.rows(), COLUMNS, key="key", formats={"modules": modules_text})
