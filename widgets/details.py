"""Details pane: everything the inspection knows about one tensor, as field / value rows, then the
names sharing its storage (views, ties, `.data` aliases) with a strip of the bytes each covers."""

from __future__ import annotations

import html

import ipywidgets as w
import pandas as pd

from explorer.inspection.aliasing import storage_views

from .formatting import bytes_text, cell_text, exact_bytes_text
from .table import DataTable

SHARER_COLUMNS = ["name", "shape", "stride", "storage_offset", "dtype", "bytes_range"]

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


def storage_strip_html(views: pd.DataFrame, storage_bytes: int, selected: str) -> str:
    """One bar per name over the storage's full width, covering the bytes that name reaches."""
    bars = []
    for row in views.itertuples(index=False):
        left = 100 * row.start_byte / storage_bytes if storage_bytes else 0
        width = 100 * (row.end_byte - row.start_byte) / storage_bytes if storage_bytes else 0
        mark = " de-storage-bar-selected" if row.name == selected else ""
        bars.append(
            f'<div class="de-storage-bar{mark}" data-name="{html.escape(row.name)}" '
            f'data-start="{row.start_byte}" data-end="{row.end_byte}">'
            f'<span class="de-storage-bar-label">{html.escape(row.name)} · bytes {row.start_byte:,}–{row.end_byte:,}'
            '</span><div class="de-storage-bar-track">'
            f'<div class="de-storage-bar-fill" style="left:{left:.3f}%;width:{max(width, 0.5):.3f}%"></div>'
            "</div></div>"
        )
    head = f'<div class="de-storage-strip-title">storage: {exact_bytes_text(storage_bytes)}, {len(views)} names</div>'
    return head + "".join(bars)


class TensorDetails(w.VBox):
    """A title, a field/value table and the storage sharers (table and strip); hidden until a
    tensor is shown. `sharers` lists the names on the shown tensor's storage."""

    def __init__(self) -> None:
        self.title = w.Label("")
        self.title.add_class("de-details-title")
        self.table = DataTable(sortable=False, captioned=False)
        self.table.add_class("de-details-table")
        self.sharers_table = DataTable(sortable=False, captioned=False)
        self.sharers_table.add_class("de-sharers-table")
        self.strip = w.HTML("")
        self.strip.add_class("de-storage-strip")
        self.values: dict[str, str] = {}
        self.sharers: list[str] = []
        super().__init__([self.title, self.table, w.Label("names on this storage"), self.sharers_table, self.strip],
                         layout=w.Layout(display="none"))
        self.add_class("de-details")

    def show(self, tensors: pd.DataFrame, storages: pd.DataFrame, name: str) -> None:
        """Fill the pane for tensor `name` (of the given inspection tables) and unhide it."""
        self.values = tensor_details(tensors, storages, name)
        self.title.value = name
        frame = pd.DataFrame({"field": list(self.values), "value": list(self.values.values())})
        self.table.show(frame, ["field", "value"], key="field", formats={})
        views, storage_bytes = storage_views(tensors, storages, name)
        self.sharers = views["name"].tolist()
        ranges = [f"{start:,}–{end:,} ({bytes_text(end - start)})" for start, end in zip(views["start_byte"], views["end_byte"])]
        self.sharers_table.show(views.assign(bytes_range=ranges), SHARER_COLUMNS, key="name", formats={})
        self.sharers_table.selected = name
        self.strip.value = storage_strip_html(views, storage_bytes, name)
        self.layout.display = None

    def hide(self) -> None:
        self.values = {}
        self.sharers = []
        self.title.value = ""
        self.layout.display = "none"
