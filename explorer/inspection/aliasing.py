"""Which names share one tensor's storage, and which bytes of that storage each of them covers.

Views, tied parameters and `.data` aliases all show up as names on one storage. A strided view
touches the bytes between its first and last element; `storage_views` gives that range per name,
so a picture of the storage (a strip with one bar per name) can be drawn from it.
"""

from __future__ import annotations

import pandas as pd

from ..naming import byte_span, dtype_named

VIEW_COLUMNS = ["name", "module", "kind", "shape", "stride", "storage_offset", "dtype", "start_byte", "end_byte"]


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
    rows = []
    for _, row in sharing.iterrows():
        itemsize = dtype_named(row["dtype"]).itemsize
        start, end = byte_span(row["shape"], row["stride"], int(row["storage_offset"]), itemsize)
        rows.append({**{c: row[c] for c in VIEW_COLUMNS[:7]}, "start_byte": start, "end_byte": end})
    storage_bytes = int(storages.loc[storages["storage_id"] == storage_id, "bytes"].iloc[0])
    return pd.DataFrame(rows, columns=VIEW_COLUMNS), storage_bytes
