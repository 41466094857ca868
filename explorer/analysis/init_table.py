"""`InitReport`: the init audit table with its one-line summary and notebook display (`Inspection.init`)."""

from __future__ import annotations

import html
import math
from collections import Counter
from dataclasses import dataclass

import pandas as pd

from ..naming import format_bytes
from .init_flags import FLAGS, Severity, flag_totals, format_seconds

_SHOWN = [
    "name",
    "module_class",
    "init",
    "mean",
    "std",
    "writes",
    "dead_writes",
    "uninitialized",
    "flags",
    "severity",
    "source",
]
# A defect's row is red, a waste row a calm blue-grey: a defect must stand out among many waste rows.
_SEVERITY_STYLES: dict[Severity, str] = {"defect": "background:#f8d7da", "waste": "background:#e8edf5"}


@dataclass(frozen=True, repr=False)
class InitReport:
    """`explorer.init_report`'s table (`table`) for a module of class `root_class`."""

    root_class: str
    table: pd.DataFrame

    def flag_counts(self) -> dict[str, int]:
        """How many names carry each flag, in `FLAGS` order (flags no name carries left out)."""
        counts = Counter(flag for flags in self.table["flags"] for flag in flags)
        return {flag: counts[flag] for flag in FLAGS if counts[flag]}

    def summary(self) -> str:
        """One line, defects first: `LlamaForCausalLM: 23 tensors; 2 defects (2 uninitialized); waste:
        21 overwritten (1.2 MiB of dead writes, ~1.5 ms)` (the time: `init_report`'s `wasted_s`)."""
        totals = flag_totals(self.table)
        defects = int((self.table["severity"] == "defect").sum())
        text = f"{self.root_class}: {len(self.table)} tensors; {defects} defect{'s' * (defects != 1)}"
        named = [f"{total.names} {total.flag}" for total in totals if total.severity == "defect"]
        if named:
            text += f" ({', '.join(named)})"
        waste = [
            f"{total.names} {total.flag} ({format_bytes(total.wasted_bytes)} of dead writes, "
            f"{format_seconds(total.wasted_s)})"
            for total in totals
            if total.severity == "waste"
        ]
        return text + (f"; waste: {', '.join(waste)}" if waste else "")

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        """The summary, then the table with flagged rows coloured by severity (text only, escaped)."""
        columns = [column for column in _SHOWN if column in self.table.columns]
        head = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
        rows = []
        for record in self.table[columns].itertuples(index=False):
            cells = "".join(f"<td>{html.escape(_cell(value))}</td>" for value in record)
            style = f' style="{_SEVERITY_STYLES[record.severity]}"' if record.severity else ""
            rows.append(f"<tr{style}>{cells}</tr>")
        return (
            f"<div class='explorer-init'><p><b>{html.escape(self.summary())}</b></p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        )


def _cell(value: object) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    if value is None or value is pd.NA:
        return ""
    return str(value)
