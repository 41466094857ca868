"""Which names share one tensor's storage, and which bytes of that storage each of them covers.

Views, tied parameters and `.data` aliases all show up as names on one storage. A strided view
touches the bytes between its first and last element; `storage_views` gives that range per name,
so a picture of the storage (a strip with one bar per name) can be drawn from it.
"""

from __future__ import annotations

import pandas as pd

VIEW_COLUMNS = ["name", "module", "kind", "shape", "stride", "storage_offset", "dtype", "start_byte", "end_byte"]


def _span_elements(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from the first to the last one a (shape, stride) view reaches (0 when empty)."""
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride))


def storage_views(tensors: pd.DataFrame, storages: pd.DataFrame, name: str) -> tuple[pd.DataFrame, int]:
    """Every name on the storage of tensor `name` (itself included, table order), with the byte
    range `[start_byte, end_byte)` each covers; and the storage's size in bytes.

    KeyError names an unknown tensor.
    """
    match = tensors[tensors["name"] == name]
    if match.empty:
        raise KeyError(f"no tensor named {name!r}")
    storage_id = match.iloc[0]["storage_id"]
    sharing = tensors[tensors["storage_id"] == storage_id]
    itemsize = (sharing["bytes"] / sharing["numel"].where(sharing["numel"] > 0)).fillna(0)
    rows = []
    for (_, row), size in zip(sharing.iterrows(), itemsize.tolist()):
        item = int(size) if size else _itemsize(row["dtype"])
        start = int(row["storage_offset"]) * item
        rows.append({**{c: row[c] for c in VIEW_COLUMNS[:7]}, "start_byte": start,
                     "end_byte": start + _span_elements(tuple(row["shape"]), tuple(row["stride"])) * item})
    storage_bytes = int(storages.loc[storages["storage_id"] == storage_id, "bytes"].iloc[0])
    return pd.DataFrame(rows, columns=VIEW_COLUMNS), storage_bytes


def _itemsize(dtype_name: str) -> int:
    import torch

    return torch.empty((), dtype=getattr(torch, dtype_name)).element_size()
