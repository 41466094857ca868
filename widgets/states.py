"""Materialization states as the widget shows them: one name and one colour per state.

Tensors come from the tensors table (`fake`, `materialized`, `real`); a module's state summarises
its subtree's storages from the modules table. Every view takes its colours from here.
"""

from __future__ import annotations

FAKE, PARTLY, MATERIALIZED, REAL, EMPTY = "fake", "partly", "materialized", "real", "empty"

STATE_COLOURS: dict[str, str] = {
    FAKE: "#9aa5b1",  # grey: no storage yet
    PARTLY: "#f0a030",  # amber: some storages real
    MATERIALIZED: "#3fa34d",  # green: every storage real
    REAL: "#2b7bb9",  # blue: an eager tensor, never recorded
    EMPTY: "#e3e3e3",  # no parameters or buffers below
}


def module_state(total_bytes: int, materialized_bytes: int) -> str:
    """State of a module subtree from the modules table's `bytes` and `materialized_bytes`."""
    if total_bytes == 0:
        return EMPTY
    if materialized_bytes == 0:
        return FAKE
    if materialized_bytes == total_bytes:
        return MATERIALIZED
    return PARTLY
