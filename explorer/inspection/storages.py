"""The storages table: one row per piece of memory, with every name that views it."""

from __future__ import annotations

import pandas as pd

from .._torch_compat.dispatch import metadata_access
from .census import Census, strides_of

STORAGE_COLUMNS = [
    "storage_id",
    "bytes",
    "device",
    "dtype",
    "state",
    "graph",
    "recorded_id",
    "tensors",
    "offsets",
    "shapes",
    "strides",
]


def storages_table(census: Census) -> pd.DataFrame:
    """One row per storage, numbered in the order names first reach it (`storage_id`, as in the
    tensors table).

    - `bytes`: the whole storage, however little of it its views cover;
    - `dtype`, `state`: of its first name;
    - `graph`, `recorded_id`: the recorded storage (fakes, and materialized tensors traced back);
    - `tensors`, `offsets`, `shapes`, `strides`: every name viewing it, in module order, and each
      one's layout over it (offsets and strides in elements of that name's dtype).
    """
    columns: dict[str, list] = {column: [] for column in STORAGE_COLUMNS}
    entries = census.tensors
    with metadata_access():  # lazy parameters refuse metadata reads
        for record in census.storages:
            views = [entries[position] for position in record.names]
            columns["storage_id"].append(record.id)
            columns["bytes"].append(record.nbytes)
            columns["device"].append(record.device)
            columns["dtype"].append(record.dtype)
            columns["state"].append(record.state)
            columns["graph"].append(record.graph)
            columns["recorded_id"].append(record.recorded_id)
            columns["tensors"].append([view.name for view in views])
            layouts = [strides_of(view.tensor) for view in views]
            columns["offsets"].append([offset for _, offset in layouts])
            columns["shapes"].append([tuple(view.tensor.size()) for view in views])
            columns["strides"].append([stride for stride, _ in layouts])
    for column in ("graph", "recorded_id"):
        columns[column] = pd.array(columns[column], dtype="Int64")
    return pd.DataFrame(columns, columns=STORAGE_COLUMNS)
