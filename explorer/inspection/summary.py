"""The terminal summary of an inspection: a few lines read off the four tables."""

from __future__ import annotations

import pandas as pd

from ..naming import format_bytes
from .census import DISK, FAKE, MATERIALIZED, PARAMETER, REAL, REMOTE
from .ops import OP_KINDS


def _amounts(amounts: dict[str, int]) -> str:
    return ", ".join(f"{key} {format_bytes(value)}" for key, value in amounts.items()) or "none"


def summary_text(
    root_class: str, tensors: pd.DataFrame, modules: pd.DataFrame, ops: pd.DataFrame, storages: pd.DataFrame
) -> str:
    """Five or six lines: sizes, state (fake, disk when some storage will be read from a checkpoint,
    materialized, real), dtypes and devices, recorded ops by kind, tied names.

    Byte counts are of storages (each counted once), as in the modules table.
    """
    root = modules.iloc[0]
    total = int(root["bytes"])
    parameters = int((tensors["kind"] == PARAMETER).sum())
    buffers = len(tensors) - parameters
    lines = [
        f"{root_class}: {int(root['total_params']):,} parameters, {len(tensors)} names "
        f"({parameters} parameters, {buffers} buffers) on {len(storages)} storages, {format_bytes(total)}"
    ]
    by_state = storages.groupby("state")["bytes"].sum()
    states = []
    for state in (FAKE, DISK, REMOTE, MATERIALIZED, REAL):
        amount = int(by_state.get(state, 0))
        if state in (DISK, REMOTE) and not amount:
            continue  # only checkpoint-backed modules have a "disk" share, Hub-backed ones a "remote" one
        share = f"{100 * amount / total:.1f}%" if total else "-"
        states.append(f"{state} {format_bytes(amount)} ({share})")
    lines.append("state: " + ", ".join(states))
    lines.append(f"dtypes: {_amounts(root['bytes_by_dtype'])}; devices: {_amounts(root['bytes_by_device'])}")
    if len(ops):
        counts = ops["kind"].value_counts()
        kinds = ", ".join(f"{int(counts[kind])} {kind}" for kind in OP_KINDS if kind in counts)
        lines.append(f"ops: {len(ops)} recorded ({kinds})")
    else:
        lines.append("ops: none recorded")
    ties: list[str] = []
    seen: set[str] = set()
    for name, tied in zip(tensors["name"], tensors["tied_with"]):
        if tied and name not in seen:  # each group once, from its first name in module order
            ties.append(" = ".join([name, *tied]))
            seen.update(tied)
    if ties:
        lines.append("tied: " + "; ".join(ties))
    return "\n".join(lines)
