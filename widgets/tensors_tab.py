"""Tensors tab: the tensors table of the selected modules, filterable and sortable.

Filters (name search, dtype, device, state) and the module scope narrow `inspect(module).tensors`;
the `DataTable` sorts and draws it. Clicking a row sets `table.selected` to the tensor's name.
"""

from __future__ import annotations

from typing import Collection

import ipywidgets as w
import pandas as pd

from .formatting import bytes_text
from .states import STATE_COLOURS
from .table import DataTable

ALL = "all"
COLUMNS = ["name", "kind", "shape", "dtype", "device", "bytes", "state", "tied_with", "closure_ops"]


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
        self.name_filter = w.Text(placeholder="filter by name", description="name",
                                  continuous_update=True, layout=w.Layout(width="260px"))
        self.dtype_filter = w.Dropdown(options=[ALL], description="dtype", layout=w.Layout(width="180px"))
        self.device_filter = w.Dropdown(options=[ALL], description="device", layout=w.Layout(width="180px"))
        self.state_filter = w.Dropdown(options=[ALL], description="state", layout=w.Layout(width="200px"))
        for control in (self.name_filter, self.dtype_filter, self.device_filter, self.state_filter):
            control.add_class("de-tensors-filter")
            control.observe(lambda _: self._draw(), names="value")
        self.table = DataTable()
        self.table.add_class("de-tensors-table")
        self._tensors = pd.DataFrame(columns=COLUMNS + ["module"])
        self._scope: Collection[str] | None = None
        super().__init__([w.HBox([self.name_filter, self.dtype_filter, self.device_filter, self.state_filter]),
                          self.table])
        self.add_class("de-tensors-tab")

    def update(self, tensors: pd.DataFrame, scope: Collection[str] | None) -> None:
        """Show `tensors` (an inspection's tensors table) restricted to modules in `scope`."""
        self._tensors, self._scope = tensors, scope
        with self.hold_trait_notifications():
            for control, column in ((self.dtype_filter, "dtype"), (self.device_filter, "device"),
                                    (self.state_filter, "state")):
                options = _options(tensors[column])
                if list(control.options) != options:
                    keep = control.value if control.value in options else ALL
                    control.unobserve_all("value")
                    control.options = options
                    control.value = keep
                    control.observe(lambda _: self._draw(), names="value")
        self._draw()

    def rows(self) -> pd.DataFrame:
        """The tensors table rows passing the scope and the filters (before sorting)."""
        return filter_tensors(scoped(self._tensors, self._scope), name=self.name_filter.value,
                              dtype=self.dtype_filter.value, device=self.device_filter.value,
                              state=self.state_filter.value)

    def _draw(self) -> None:
        self.table.show(self.rows(), COLUMNS, key="name", formats={"bytes": bytes_text},
                        colour=STATE_COLOURS, colour_by="state")
