"""The checkpoint reads table: one row per recorded safetensors read that some name's value needs."""

from __future__ import annotations

import pandas as pd

from .census import Census
from .checkpoint_sources import CheckpointRead

READ_COLUMNS = ["graph", "op", "file", "path", "key", "offset", "shape", "disk_dtype", "bytes", "tensors", "states"]


def reads_table(census: Census) -> pd.DataFrame:
    """One row per checkpoint read feeding a parameter or buffer, in (graph, op) order.

    - `file`: the file's name; `path`: as recorded (absolute); `key`: the tensor in it;
    - `offset`: where its data starts in the file (bytes; missing when the header cannot be read now);
    - `shape`, `disk_dtype`, `bytes`: as the file holds it (what materializing reads);
    - `tensors`, `states`: every name it feeds, in module order, and each one's state (a read whose
      names are all materialized is done; one with a "disk" name is still to come).
    """
    fed: dict[CheckpointRead, list[int]] = {}
    for position, entry in enumerate(census.tensors):
        for read in entry.reads:
            fed.setdefault(read, []).append(position)
    columns: dict[str, list] = {column: [] for column in READ_COLUMNS}
    for read in sorted(fed, key=lambda read: (read.graph, read.op)):
        names = [census.tensors[position] for position in fed[read]]
        for column, value in (
            ("graph", read.graph),
            ("op", read.op),
            ("file", read.file),
            ("path", read.path),
            ("key", read.key),
            ("offset", read.offset),
            ("shape", read.shape),
            ("disk_dtype", read.dtype),
            ("bytes", read.nbytes),
            ("tensors", [entry.name for entry in names]),
            ("states", [entry.state for entry in names]),
        ):
            columns[column].append(value)
    columns["offset"] = pd.array(columns["offset"], dtype="Int64")
    return pd.DataFrame(columns, columns=READ_COLUMNS)
