"""Details pane: everything the inspection knows about one tensor, as field / value rows, then the
names sharing its storage (views, ties, `.data` aliases) with a strip of the bytes each covers.
A 3-D tensor (fused experts: experts × rows × columns) also offers "materialize expert i": one
expert's values, made alone when its base is one random fill, a constant or a checkpoint read
(`explorer.slice_plan`), so a 30 GB fused parameter can be looked at one expert at a time."""

from __future__ import annotations

import html
from typing import cast

import ipywidgets as w
import pandas as pd
import torch
from torch import nn

from explorer import materialize_tensor, slice_plan
from explorer.inspection.aliasing import storage_views
from explorer.naming import dtype_name

from .formatting import bytes_text, cell_text, exact_bytes_text, is_missing
from .table import DataTable

SHARER_COLUMNS = ["name", "shape", "stride", "storage_offset", "dtype", "bytes_range"]

# (field shown, column of the tensors table) in display order; "storage size" comes from storages.
FIELDS = [
    ("name", "name"),
    ("module", "module"),
    ("kind", "kind"),
    ("state", "state"),
    ("shape", "shape"),
    ("stride", "stride"),
    ("storage offset", "storage_offset"),
    ("dtype", "dtype"),
    ("device", "device"),
    ("numel", "numel"),
    ("bytes", "bytes"),
    ("storage size", None),
    ("storage id", "storage_id"),
    ("contiguous", "contiguous"),
    ("view", "is_view"),
    ("requires grad", "requires_grad"),
    ("alias group", "alias_group"),
    ("tied names", "tied_with"),
    ("producer", "producer"),
    ("last write", "last_write"),
    ("closure ops", "closure_ops"),
    ("source", "source"),
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
    out.update(checkpoint_fields(row))
    return out


def checkpoint_fields(row: pd.Series) -> dict[str, str]:
    """Where a checkpoint-fed tensor's values come from: file, key, offset, dtype on disk; for a Hub
    shard (file `org/name@commit12/path`, `explorer.hub_fetch.RemoteFile.label`) also its repo,
    commit and path in the repo. Empty for a tensor no read feeds."""
    if "file" not in row or is_missing(row["file"]) or not row["file"]:
        return {}
    out = {"checkpoint file": cell_text(row["file"])}
    repo, at, rest = str(row["file"]).partition("@")
    if at and "/" in repo and "/" in rest:
        commit, _, path = rest.partition("/")
        out.update({"hub repo": repo, "hub commit": commit, "file in repo": path})
    out.update({"key": cell_text(row["key"]), "file offset": cell_text(row["offset"])})
    out["dtype on disk"] = cell_text(row["disk_dtype"])
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


def named_tensor(module: nn.Module, name: str) -> torch.Tensor | None:
    """Parameter or buffer `name` (qualified) of `module`, or None."""
    owner, _, key = name.rpartition(".")
    try:
        sub = module.get_submodule(owner) if owner else module
    except AttributeError:
        return None
    found = sub._parameters.get(key) if key in sub._parameters else sub._buffers.get(key)
    return found if isinstance(found, torch.Tensor) else None


def expert_plan_text(expert: torch.Tensor, index: int) -> str:
    """What materializing `expert` (number `index` of a 3-D tensor) will cost, before the click."""
    plan = slice_plan(expert)
    if plan.sliced:
        return f"expert {index}: {exact_bytes_text(plan.nbytes)} drawn alone ({plan.source})"
    if plan.reason:
        return f"expert {index}: makes the whole tensor ({exact_bytes_text(plan.nbytes)}): {plan.reason}"
    return f"expert {index}: {exact_bytes_text(plan.nbytes)}" if plan.nbytes else f"expert {index}: already in memory"


def expert_values_text(values: torch.Tensor, index: int) -> str:
    """A one-line summary of expert `index`'s materialized values."""
    data = values.detach()
    floating = data.float() if data.is_floating_point() else data.double()
    first = ", ".join(f"{v:.4g}" for v in floating.reshape(-1)[:4].tolist())
    return (
        f"expert {index}: {dtype_name(data.dtype)}{list(data.shape)}, mean {floating.mean().item():.4g}, "
        f"std {floating.std().item():.4g}, first [{first}, ...]"
    )


class ExpertRows(w.HBox):
    """A "materialize expert i" row for a 3-D tensor: an index box, a button, and what it costs / gave.
    `values` holds the last expert materialized (None before a click)."""

    def __init__(self) -> None:
        self.index = w.BoundedIntText(value=0, min=0, max=0, description="expert", layout=w.Layout(width="160px"))
        self.button = w.Button(description="materialize expert", icon="cube", tooltip="materialize this expert alone")
        self.status = w.Label("")
        self.tensor: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self._experts: dict[int, torch.Tensor] = {}  # one view per index: a deferred view is recorded once
        super().__init__([self.index, self.button, self.status], layout=w.Layout(display="none"))
        self.add_class("de-expert-rows")
        self.index.observe(lambda _: self._preview(), names="value")
        self.button.on_click(lambda _: self.materialize())

    def show(self, tensor: torch.Tensor | None) -> None:
        """Offer the experts of `tensor` when it is 3-D; hide otherwise."""
        self.tensor = tensor if tensor is not None and tensor.dim() == 3 and tensor.shape[0] > 0 else None
        self.values = None
        self._experts = {}
        if self.tensor is None:
            self.layout.display = "none"
            return
        self.index.max = self.tensor.shape[0] - 1
        self.index.value = min(self.index.value, self.index.max)
        self.layout.display = None
        self._preview()

    def expert(self, index: int) -> torch.Tensor:
        """Expert `index` of the shown tensor as a view (`tensor[index]`), made once per index."""
        if index not in self._experts:
            self._experts[index] = cast(torch.Tensor, self.tensor)[index]  # callers check a tensor is shown
        return self._experts[index]

    def _preview(self) -> None:
        if self.tensor is not None:
            self.status.value = expert_plan_text(self.expert(self.index.value), self.index.value)

    def materialize(self) -> torch.Tensor | None:
        """Materialize the expert in the index box; its summary (or the error) goes to `status`."""
        if self.tensor is None:
            return None
        index = self.index.value
        try:
            self.values = materialize_tensor(self.expert(index))
        except Exception as error:  # shown in the pane: the explorer stays usable
            self.values = None
            self.status.value = f"expert {index}: {type(error).__name__}: {error}"
            return None
        self.status.value = expert_values_text(self.values, index)
        return self.values


class TensorDetails(w.VBox):
    """A title, a field/value table and the storage sharers (table and strip); hidden until a
    tensor is shown. `sharers` lists the names on the shown tensor's storage. With the `module`
    the tables describe, a 3-D tensor also offers "materialize expert i" (`experts`)."""

    def __init__(self, module: nn.Module | None = None) -> None:
        self.module = module
        self.title = w.Label("")
        self.title.add_class("de-details-title")
        self.table = DataTable(sortable=False, captioned=False)
        self.table.add_class("de-details-table")
        self.sharers_table = DataTable(sortable=False, captioned=False)
        self.sharers_table.add_class("de-sharers-table")
        self.strip = w.HTML("")
        self.strip.add_class("de-storage-strip")
        self.experts = ExpertRows()
        self.values: dict[str, str] = {}
        self.sharers: list[str] = []
        super().__init__(
            [self.title, self.table, self.experts, w.Label("names on this storage"), self.sharers_table, self.strip],
            layout=w.Layout(display="none"),
        )
        self.add_class("de-details")

    def show(self, tensors: pd.DataFrame, storages: pd.DataFrame, name: str) -> None:
        """Fill the pane for tensor `name` (of the given inspection tables) and unhide it."""
        self.values = tensor_details(tensors, storages, name)
        self.title.value = name
        frame = pd.DataFrame({"field": list(self.values), "value": list(self.values.values())})
        self.table.show(frame, ["field", "value"], key="field", formats={})
        views, storage_bytes = storage_views(tensors, storages, name)
        self.sharers = views["name"].tolist()
        ranges = [
            f"{start:,}–{end:,} ({bytes_text(end - start)})"
            for start, end in zip(views["start_byte"], views["end_byte"])
        ]
        self.sharers_table.show(views.assign(bytes_range=ranges), SHARER_COLUMNS, key="name", formats={})
        self.sharers_table.selected = name
        self.strip.value = storage_strip_html(views, storage_bytes, name)
        self.experts.show(named_tensor(self.module, name) if self.module is not None else None)
        self.layout.display = None

    def hide(self) -> None:
        self.values = {}
        self.sharers = []
        self.title.value = ""
        self.experts.show(None)
        self.layout.display = "none"
