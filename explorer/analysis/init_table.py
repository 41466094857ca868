"""`InitReport`: the init audit table with its one-line summary and notebook display (`Inspection.init`)."""

from __future__ import annotations

import html
import math
from collections import Counter
from dataclasses import dataclass

import pandas as pd

from ..naming import format_bytes
from .init_report import FLAGS

_SHOWN = ["name", "module_class", "init", "mean", "std", "writes", "dead_writes", "uninitialized", "flags", "source"]
_FLAGGED_STYLE = "background:#fff3cd"


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
        """One line: `LlamaForCausalLM: 23 tensors; 21 overwritten (1.2 MiB of dead writes), 2 uninitialized`."""
        counts = self.flag_counts()
        parts = []
        for flag, count in counts.items():
            part = f"{count} {flag}"
            if flag == "overwritten":
                part += f" ({format_bytes(int(self.table['dead_bytes'].fillna(0).sum()))} of dead writes)"
            parts.append(part)
        return f"{self.root_class}: {len(self.table)} tensors; " + (", ".join(parts) if parts else "no flags")

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        """The summary, then the table with flagged rows highlighted (text only, escaped)."""
        columns = [column for column in _SHOWN if column in self.table.columns]
        head = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
        rows = []
        for record in self.table[columns].itertuples(index=False):
            cells = "".join(f"<td>{html.escape(_cell(value))}</td>" for value in record)
            style = f' style="{_FLAGGED_STYLE}"' if record.flags else ""
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
