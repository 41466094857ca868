"""Details pane: everything the inspection knows about one tensor, as field / value rows."""

from __future__ import annotations

import ipywidgets as w
import pandas as pd

from .formatting import cell_text, exact_bytes_text
from .table import DataTable

# (field shown, column of the tensors table) in display order; "storage size" comes from storages.
FIELDS = [
    ("name", "name"), ("module", "module"), ("kind", "kind"), ("state", "state"), ("shape", "shape"),
    ("stride", "stride"), ("storage offset", "storage_offset"), ("dtype", "dtype"), ("device", "device"),
    ("numel", "numel"), ("bytes", "bytes"), ("storage size", None), ("storage id", "storage_id"),
    ("contiguous", "contiguous"), ("view", "is_view"), ("requires grad", "requires_grad"),
    ("alias group", "alias_group"), ("tied names", "tied_with"), ("producer", "producer"),
    ("last write", "last_write"), ("closure ops", "closure_ops"), ("source", "source"),
]


def tensor_details(tensors: pd.DataFrame, storages: pd.DataFrame, name: str) -> dict[str, str]:
    """Field → text for tensor `name` of an inspection. KeyError names an unknown tensor."""
    match = tensors[tensors["name"] == name]
    if match.empty:
        raise KeyError(f"no tensor named {name!r}")
    row = match.iloc[0]
    storage = storages[storages["storage_id"] == row["storage_id"]].iloc[0]
    out = {}
    for label, column in FIELDS:
        if column is None:
            out[label] = exact_bytes_text(storage["bytes"])
        elif column == "bytes":
            out[label] = exact_bytes_text(row[column])
        elif column in ("alias_group", "tied_with"):
            out[label] = cell_text(row[column]) or "none"
        else:
            out[label] = cell_text(row[column])
    return out


class TensorDetails(w.VBox):
    """A title and a two-column table; hidden until a tensor is shown."""

    def __init__(self) -> None:
        self.title = w.Label("")
        self.title.add_class("de-details-title")
        self.table = DataTable(sortable=False, captioned=False)
        self.table.add_class("de-details-table")
        self.values: dict[str, str] = {}
        super().__init__([self.title, self.table], layout=w.Layout(display="none"))
        self.add_class("de-details")

    def show(self, tensors: pd.DataFrame, storages: pd.DataFrame, name: str) -> None:
        """Fill the pane for tensor `name` (of the given inspection tables) and unhide it."""
        self.values = tensor_details(tensors, storages, name)
        self.title.value = name
        frame = pd.DataFrame({"field": list(self.values), "value": list(self.values.values())})
        self.table.show(frame, ["field", "value"], key="field", formats={})
        self.layout.display = None

    def hide(self) -> None:
        self.values = {}
        self.title.value = ""
        self.layout.display = "none"
