"""Materialization states as the widget shows them: one name and one colour per state.

Tensors come from the tensors table (`fake`, `disk`, `remote`, `materialized`, `real`); a module's state
summarises its subtree's storages from the modules table. Every view takes its colours from here.
"""

from __future__ import annotations

import pandas as pd

FAKE, DISK, REMOTE, PARTLY, MATERIALIZED, REAL, EMPTY = (
    "fake",
    "disk",
    "remote",
    "partly",
    "materialized",
    "real",
    "empty",
)

STATE_COLOURS: dict[str, str] = {
    FAKE: "#9aa5b1",  # grey: no storage yet
    DISK: "#8e6cc9",  # violet: no storage yet, its values wait in a checkpoint file
    REMOTE: "#1c9aa8",  # teal: no storage yet, its values wait on the Hub (not fetched yet)
    PARTLY: "#f0a030",  # amber: some storages real
    MATERIALIZED: "#3fa34d",  # green: every storage real
    REAL: "#2b7bb9",  # blue: an eager tensor, never recorded
    EMPTY: "#e3e3e3",  # no parameters or buffers below
}


def module_state(total_bytes: int, materialized_bytes: int, disk_bytes: int = 0, remote_bytes: int = 0) -> str:
    """State of a module subtree from the modules table's `bytes`, `materialized_bytes`,
    `disk_bytes` and `remote_bytes`: DISK when nothing is materialized and checkpoint reads feed
    most of its bytes (a Llama's computed rotary buffers do not make its root "fake"), REMOTE when
    most of those are still on the Hub."""
    if total_bytes == 0:
        return EMPTY
    if materialized_bytes == 0:
        if 2 * disk_bytes <= total_bytes:
            return FAKE
        return REMOTE if 2 * remote_bytes > disk_bytes else DISK
    if materialized_bytes == total_bytes:
        return MATERIALIZED
    return PARTLY


def module_states(modules: pd.DataFrame) -> list[str]:
    """`module_state` of every row of a modules table (one without `disk_bytes` / `remote_bytes` has
    none on disk / on the Hub)."""
    disk = modules["disk_bytes"].tolist() if "disk_bytes" in modules else [0] * len(modules)
    remote = modules["remote_bytes"].tolist() if "remote_bytes" in modules else [0] * len(modules)
    totals, done = modules["bytes"].tolist(), modules["materialized_bytes"].tolist()
    return [module_state(*row) for row in zip(totals, done, disk, remote)]
