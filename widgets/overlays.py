"""Overlays: one colour per module, by bytes (heat map), dtype, device or state, with a legend.

Python decides every colour (the tree and the graph only paint what they are sent). Sizes come from
the modules table, which counts each storage once per subtree: tied weights and views are not
counted twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import pandas as pd

from .formatting import bytes_text
from .states import EMPTY, STATE_COLOURS, module_states

OverlayMode = Literal["state", "bytes", "dtype", "device"]
OVERLAY_MODES: tuple[str, ...] = get_args(OverlayMode)

# ColorBrewer YlOrRd, light (small) to dark (large).
HEAT = ("#ffffb2", "#fecc5c", "#fd8d3c", "#f03b20", "#bd0026")
# ColorBrewer Set2 then Dark2: categories (dtypes, devices) in sorted order.
CATEGORIES = (
    "#66c2a5",
    "#fc8d62",
    "#8da0cb",
    "#e78ac3",
    "#a6d854",
    "#ffd92f",
    "#e5c494",
    "#1b9e77",
    "#d95f02",
    "#7570b3",
)
MIXED = "#6c757d"
NONE = STATE_COLOURS[EMPTY]


@dataclass(frozen=True)
class Overlay:
    """`colours`: module path → colour; `legend`: (label, colour) pairs, in reading order."""

    mode: str
    colours: dict[str, str]
    legend: list[tuple[str, str]]


def overlay(modules: pd.DataFrame, mode: str) -> Overlay:
    """Colour every module of an inspection's modules table by `mode` (one of OVERLAY_MODES)."""
    if mode not in OVERLAY_MODES:
        raise ValueError(f"unknown overlay {mode!r}; choose one of {', '.join(OVERLAY_MODES)}")
    if mode == "state":
        return _by_state(modules)
    if mode == "bytes":
        return _by_bytes(modules)
    return _by_category(modules, "bytes_by_dtype" if mode == "dtype" else "bytes_by_device", mode)


def _by_state(modules: pd.DataFrame) -> Overlay:
    states = module_states(modules)
    colours = {path: STATE_COLOURS[state] for path, state in zip(modules["name"], states)}
    legend = [(state, STATE_COLOURS[state]) for state in STATE_COLOURS if state in set(states)]
    return Overlay("state", colours, legend)


def _by_bytes(modules: pd.DataFrame) -> Overlay:
    """Log-scale heat map between the smallest and the largest non-empty module."""
    sizes = [int(b) for b in modules["bytes"]]
    nonzero = [b for b in sizes if b > 0]
    if not nonzero:
        return Overlay("bytes", {path: NONE for path in modules["name"]}, [("no bytes", NONE)])
    low, high = math.log(min(nonzero)), math.log(max(nonzero))
    span = high - low

    def bin_of(size: int) -> int:
        if span == 0:
            return len(HEAT) - 1
        return min(int((math.log(size) - low) / span * len(HEAT)), len(HEAT) - 1)

    colours = {path: HEAT[bin_of(size)] if size else NONE for path, size in zip(modules["name"], sizes)}
    edges = [math.exp(low + span * i / len(HEAT)) for i in range(len(HEAT) + 1)]
    legend = [(f"{bytes_text(edges[i])} – {bytes_text(edges[i + 1])}", HEAT[i]) for i in range(len(HEAT))]
    if span == 0:
        legend = [(bytes_text(high and max(nonzero)), HEAT[-1])]
    if len(nonzero) < len(sizes):
        legend.append(("no bytes", NONE))
    return Overlay("bytes", colours, legend)


def _by_category(modules: pd.DataFrame, column: str, mode: str) -> Overlay:
    """One colour per dtype (device); a module holding several is "mixed"."""
    keys = [tuple(sorted(k for k, v in amounts.items() if v)) for amounts in modules[column]]
    names = sorted({key[0] for key in keys if len(key) == 1})
    palette = {name: CATEGORIES[i % len(CATEGORIES)] for i, name in enumerate(names)}

    def colour(key: tuple[str, ...]) -> str:
        if not key:
            return NONE
        return palette[key[0]] if len(key) == 1 else MIXED

    colours = {path: colour(key) for path, key in zip(modules["name"], keys)}
    legend = [(name, palette[name]) for name in names]
    if any(len(key) > 1 for key in keys):
        legend.append((f"mixed {mode}s", MIXED))
    if any(not key for key in keys):
        legend.append(("no bytes", NONE))
    return Overlay(mode, colours, legend)
