"""How table values read as text in the widget: one place for every cell, so views agree."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from explorer.naming import format_bytes

Formatter = Callable[[Any], str]

_COUNT_UNITS = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))
_SECOND_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))


def is_missing(value: Any) -> bool:
    """None, NaN and pandas NA."""
    if value is None or value is pd.NA:
        return True
    return isinstance(value, float) and math.isnan(value)


def cell_text(value: Any) -> str:
    """Generic text: "" for missing, 1,234 for ints, (4, 3) for shapes, a, b for lists."""
    if isinstance(value, np.generic):
        value = value.item()
    if is_missing(value):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, tuple):
        return "(" + ", ".join(str(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return ", ".join(cell_text(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{key} {bytes_text(amount)}" for key, amount in value.items())
    return str(value)


def bytes_text(value: Any) -> str:
    """Binary units, as the inspection summary writes them (1.5 KiB); a shortfall with a minus (-247.0 KiB)."""
    if is_missing(value):
        return ""
    count = int(value)
    return format_bytes(count) if count >= 0 else "-" + format_bytes(-count)


def exact_bytes_text(value: Any) -> str:
    """A byte count as "48 B", or "1,536 B (1.5 KiB)": exact, with the readable size beside it."""
    if is_missing(value):
        return ""
    count = int(value)
    return f"{count:,} B" if count < 1024 else f"{count:,} B ({format_bytes(count)})"


def count_text(value: Any) -> str:
    """Parameter counts: 950, 12.3K, 6.74B."""
    if is_missing(value):
        return ""
    count = int(value)
    for scale, unit in _COUNT_UNITS:
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return str(count)


def seconds_text(value: Any) -> str:
    """Durations in the unit that keeps them readable: 0 s, 850 ns, 4.6 µs, 12.5 ms, 3.2 s."""
    if is_missing(value):
        return ""
    seconds = float(value)
    for scale, unit in _SECOND_UNITS:
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return "0 s" if seconds == 0 else f"{seconds * 1e9:.3g} ns"


def percent_text(value: Any) -> str:
    """Fractions as percentages (0.25 → 25.0%)."""
    return "" if is_missing(value) else f"{100 * float(value):.1f}%"


def frame_rows(frame: pd.DataFrame, columns: Sequence[str], formats: Mapping[str, Formatter]) -> list[list[str]]:
    """The cells of `columns` as text, each through its formatter (`cell_text` by default)."""
    out_columns = [[formats.get(column, cell_text)(value) for value in frame[column].tolist()] for column in columns]
    return [list(row) for row in zip(*out_columns)] if out_columns else [[] for _ in range(len(frame))]
