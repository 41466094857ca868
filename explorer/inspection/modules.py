"""The modules table: one row per module path, with what its subtree holds."""

from __future__ import annotations

import math

import pandas as pd

from ..naming import depth_of, parent_of
from .census import DEFERRED_STATES, DISK, PARAMETER, REMOTE, Census

MODULE_COLUMNS = [
    "name",
    "class",
    "depth",
    "own_params",
    "total_params",
    "bytes",
    "bytes_by_dtype",
    "bytes_by_device",
    "share",
    "materialized_bytes",
    "materialized",
    "disk_bytes",
    "remote_bytes",
]


def modules_table(census: Census) -> pd.DataFrame:
    """One row per module path in `named_modules` order (a shared submodule appears at each path).

    Sizes count memory: each storage once per subtree, at its full size, so a view and its base,
    or two tied names, are not counted twice. Parameter counts are elements of distinct parameters
    (`own_params`: held directly; `total_params`: anywhere below, as
    `sum(p.numel() for p in m.parameters())`), a materialized parameter and the fakes of the same
    recorded tensor counting once.

    - `bytes_by_dtype` / `bytes_by_device`: {"float32": bytes, ...} / {"cpu": bytes, ...};
    - `share`: the subtree's bytes over the root's (NaN when the root holds no bytes);
    - `materialized_bytes`: bytes of the subtree's storages that some name in the subtree holds as a
      real (materialized or eager) tensor; `materialized`: their fraction of `bytes` (NaN when the
      subtree holds no bytes);
    - `disk_bytes`: bytes of the subtree's storages still fake whose value a checkpoint read feeds
      (state "disk" or "remote"): what materializing the subtree takes from checkpoint files, as loaded;
    - `remote_bytes`: the part of `disk_bytes` whose storages are "remote" (bytes still on the Hub).
    """
    storages: dict[str, set[int]] = {path: set() for path, _ in census.modules}
    present: dict[str, set[int]] = {path: set() for path, _ in census.modules}  # a non-fake name on it
    on_disk = {sid for sid, record in enumerate(census.storages) if record.state in (DISK, REMOTE)}
    remote = {sid for sid in on_disk if census.storages[sid].state == REMOTE}
    own_params: dict[str, dict[tuple, int]] = {path: {} for path, _ in census.modules}
    for entry in census.tensors:
        storages[entry.module].add(entry.storage)
        if entry.state not in DEFERRED_STATES:
            present[entry.module].add(entry.storage)
        if entry.kind == PARAMETER:
            own_params[entry.module][entry.identity] = entry.numel

    # Children come after their parent in pre-order: walking backwards completes each subtree
    # before it is merged into its parent.
    total_params = {path: dict(params) for path, params in own_params.items()}
    for path, _ in reversed(census.modules):
        if path:
            parent = parent_of(path)
            storages[parent] |= storages[path]
            present[parent] |= present[path]
            total_params[parent].update(total_params[path])

    records = census.storages
    columns: dict[str, list] = {column: [] for column in MODULE_COLUMNS}
    root_bytes = sum(records[sid].nbytes for sid in storages[""])
    for path, module in census.modules:
        by_dtype: dict[str, int] = {}
        by_device: dict[str, int] = {}
        total = materialized = disk = on_hub = 0
        for sid in sorted(storages[path]):
            record = records[sid]
            total += record.nbytes
            by_dtype[record.dtype] = by_dtype.get(record.dtype, 0) + record.nbytes
            by_device[record.device] = by_device.get(record.device, 0) + record.nbytes
            if sid in present[path]:
                materialized += record.nbytes
            elif sid in on_disk:
                disk += record.nbytes
                on_hub += record.nbytes * (sid in remote)
        columns["name"].append(path)
        columns["class"].append(type(module).__name__)
        columns["depth"].append(depth_of(path))
        columns["own_params"].append(sum(own_params[path].values()))
        columns["total_params"].append(sum(total_params[path].values()))
        columns["bytes"].append(total)
        columns["bytes_by_dtype"].append(by_dtype)
        columns["bytes_by_device"].append(by_device)
        columns["share"].append(total / root_bytes if root_bytes else math.nan)
        columns["materialized_bytes"].append(materialized)
        columns["materialized"].append(materialized / total if total else math.nan)
        columns["disk_bytes"].append(disk)
        columns["remote_bytes"].append(on_hub)
    return pd.DataFrame(columns, columns=MODULE_COLUMNS)
