"""Tensors tab: the tensors table of the selected modules, filterable and sortable.

Filters (name search, dtype, device, state), the module scope and the explorer's search (a set of
names) narrow `inspect(module).tensors`; the `DataTable` sorts and draws it. The core metadata
columns show by default; the column chooser adds or removes any other column of the table.
Clicking a row sets `table.selected` to the tensor's name.
"""

from __future__ import annotations

from collections.abc import Collection

import ipywidgets as w
import pandas as pd

from .formatting import bytes_text
from .states import STATE_COLOURS
from .table import DataTable

ALL = "all"
# The core metadata, in reading order; the chooser offers every column of the tensors table.
# `alias_group` (every other name on the storage: views, ties, `.data` aliases) is the alias/tie
# group; `tied_with` (the same tensor object) is its subset and optional.
COLUMNS = ["name", "shape", "stride", "storage_offset", "dtype", "device", "state", "alias_group", "bytes"]
LABELS = {
    "storage_offset": "offset",
    "alias_group": "alias/tie group",
    "tied_with": "tied with",
    "offset": "file offset",
    "disk_dtype": "dtype on disk",
}
OPTIONAL_COLUMNS = [
    "tied_with",
    "kind",
    "module",
    "numel",
    "contiguous",
    "requires_grad",
    "is_view",
    "storage_id",
    "closure_ops",
    "producer",
    "last_write",
    "source",
    "graph",
    "tensor_id",
    "file",
    "key",
    "offset",
    "disk_dtype",
]  # checkpoint provenance of "disk" tensors


def scoped(frame: pd.DataFrame, scope: Collection[str] | None) -> pd.DataFrame:
    """Rows whose `module` is in `scope` (None: every row)."""
    return frame if scope is None else frame[frame["module"].isin(scope)]


def filter_tensors(
    frame: pd.DataFrame, *, name: str = "", dtype: str = ALL, device: str = ALL, state: str = ALL
) -> pd.DataFrame:
    """Rows whose name contains `name` (case-insensitive) and whose dtype/device/state match."""
    mask = pd.Series(True, index=frame.index)
    if name:
        mask &= frame["name"].str.contains(name, case=False, regex=False)
    for column, wanted in (("dtype", dtype), ("device", device), ("state", state)):
        if wanted != ALL:
            mask &= frame[column] == wanted
    return frame[mask]


def _options(values: pd.Series) -> list[str]:
    return [ALL, *sorted(set(values.tolist()))]


class TensorsTab(w.VBox):
    """Filter controls above a `DataTable` of tensors; `update` sets the data and the scope."""

    def __init__(self) -> None:
        self.name_filter = w.Text(
            placeholder="filter by name", description="name", continuous_update=True, layout=w.Layout(width="260px")
        )
        self.dtype_filter = w.Dropdown(options=[ALL], description="dtype", layout=w.Layout(width="180px"))
        self.device_filter = w.Dropdown(options=[ALL], description="device", layout=w.Layout(width="180px"))
        self.state_filter = w.Dropdown(options=[ALL], description="state", layout=w.Layout(width="200px"))
        for control in (self.name_filter, self.dtype_filter, self.device_filter, self.state_filter):
            control.add_class("de-tensors-filter")
            control.observe(self._on_filter, names="value")
        self.columns = w.TagsInput(
            value=list(COLUMNS),
            allowed_tags=COLUMNS + OPTIONAL_COLUMNS,
            allow_duplicates=False,
            layout=w.Layout(width="auto"),
        )
        self.columns.add_class("de-column-chooser")
        self.columns.observe(lambda _: self._draw(), names="value")
        self.table = DataTable()
        self.table.add_class("de-tensors-table")
        # Off at first: every row then reads with its own layer index, wherever the table is scrolled.
        self.group_toggle = w.Checkbox(
            value=False, description="group by module", indent=False, layout=w.Layout(width="auto")
        )
        self.group_toggle.add_class("de-tensors-group")
        w.link((self.group_toggle, "value"), (self.table, "group_rows"))
        self._tensors = pd.DataFrame(columns=COLUMNS + OPTIONAL_COLUMNS)
        self._scope: Collection[str] | None = None
        self._search: set[str] | None = None
        super().__init__(
            [
                w.HBox(
                    [self.name_filter, self.dtype_filter, self.device_filter, self.state_filter],
                    layout=w.Layout(flex_flow="row wrap"),
                ),
                w.HBox([w.Label("columns"), self.columns, self.group_toggle]),
                self.table,
            ]
        )
        self.add_class("de-tensors-tab")

    def _on_filter(self, change: object) -> None:
        self._draw()

    def update(self, tensors: pd.DataFrame, scope: Collection[str] | None) -> None:
        """Show `tensors` (an inspection's tensors table) restricted to modules in `scope`."""
        self._tensors, self._scope = tensors, scope
        with self.hold_trait_notifications():
            for control, column in (
                (self.dtype_filter, "dtype"),
                (self.device_filter, "device"),
                (self.state_filter, "state"),
            ):
                options = _options(tensors[column])
                if list(control.options) != options:
                    keep = control.value if control.value in options else ALL
                    # only our observer: unobserve_all would also drop the widget's own value → index sync
                    control.unobserve(self._on_filter, names="value")
                    control.options = options
                    control.value = keep
                    control.observe(self._on_filter, names="value")
        self._draw()

    def set_search(self, names: Collection[str] | None) -> None:
        """Keep only the tensors named in `names` (the explorer's search matches); None: no search."""
        self._search = set(names) if names is not None else None
        self._draw()

    def rows(self) -> pd.DataFrame:
        """The tensors table rows passing the scope, the search and the filters (before sorting)."""
        rows = scoped(self._tensors, self._scope)
        if self._search is not None:
            rows = rows[rows["name"].isin(self._search)]
        return filter_tensors(
            rows,
            name=self.name_filter.value,
            dtype=self.dtype_filter.value,
            device=self.device_filter.value,
            state=self.state_filter.value,
        )

    def _draw(self) -> None:
        columns = [c for c in self.columns.value if c in self._tensors.columns] or ["name"]
        self.table.show(
            self.rows(),
            columns,
            key="name",
            formats={"bytes": bytes_text},
            colour=STATE_COLOURS,
            colour_by="state",
            labels=LABELS,
            paths=("name", "alias_group", "tied_with"),  # lists of names: shortened, first name kept
        )
