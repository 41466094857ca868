"""Init tab: what initializes each tensor and what is wrong with it (`explorer.init_report`).

Module classes on top (tensors, names with a defect, names with waste, their inits); clicking one
keeps its tensors in the table below, whose flagged rows are marked by their severity's colour. The
header counts defects first, then each waste flag with the bytes and estimated time it wastes.
Clicking a tensor that has memory (materialized or real) draws the histogram of its values with the
density its initializer should give (widgets/init_histogram.py); a fake one says to
materialize it first. "audit" runs the report again (after materializing).
"""

from __future__ import annotations

import html

import ipywidgets as w
import pandas as pd
import torch
from torch import nn

import explorer
from explorer.analysis.init_flags import SEVERITY, flag_totals, format_seconds
from explorer.naming import format_bytes

from .init_histogram import histogram_svg
from .table import DataTable

ALL_CLASSES = ""
CLASS_COLUMNS = ["module_class", "tensors", "defects", "waste", "inits"]
TENSOR_COLUMNS = ["name", "init", "std", "writes", "dead_writes", "uninitialized", "flags", "severity", "source"]
# A row's mark follows its severity (explorer/analysis/init_flags.py says which flag is which):
# red where the values are wrong, a calm blue-grey where only work was lost.
SEVERITY_COLOURS: dict[str, str] = {"defect": "#d62728", "waste": "#8da0cb"}
EAGER_LIMIT = 200  # names: up to this many, the tab audits when built


def class_rows(report: pd.DataFrame) -> pd.DataFrame:
    """One row per module class: how many tensors, how many carry a defect flag and how many a
    waste flag (a tensor may count in both), and their distinct inits."""
    defects = report["flags"].map(lambda flags: any(SEVERITY[flag] == "defect" for flag in flags))
    waste = report["flags"].map(lambda flags: any(SEVERITY[flag] == "waste" for flag in flags))
    groups = report.assign(defects=defects, waste=waste).groupby("module_class", sort=True)
    return pd.DataFrame(
        {
            "module_class": list(groups.groups),
            "tensors": groups.size().tolist(),
            "defects": groups["defects"].sum().astype(int).tolist(),
            "waste": groups["waste"].sum().astype(int).tolist(),
            "inits": [", ".join(dict.fromkeys(inits)) for inits in groups["init"].agg(list)],
        }
    )


def flag_counts_html(report: pd.DataFrame) -> str:
    """The header: the number of tensors with a defect, one chip per defect flag, then one chip per
    waste flag with what its wasted writes cost ("waste: overwritten 3 (40 B, ~30.0 ns)")."""
    defects = int((report["severity"] == "defect").sum())
    chips = [
        f"<span class='de-init-defects' data-count='{defects}' style='font-weight:bold;margin-right:8px'>"
        f"defects: {defects}</span>"
    ]
    for total in flag_totals(report):
        text = f"{total.flag}: {total.names}"
        if total.severity == "waste":
            text = (
                f"waste: {total.flag} {total.names} "
                f"({format_bytes(total.wasted_bytes)}, {format_seconds(total.wasted_s)})"
            )
        chips.append(
            f"<span class='de-init-flag' data-flag='{html.escape(total.flag)}' data-severity='{total.severity}' "
            f"data-count='{total.names}' style='border-left:4px solid {SEVERITY_COLOURS[total.severity]};"
            f"padding:0 6px;margin-right:8px'>{html.escape(text)}</span>"
        )
    return "<div class='de-init-flags'>" + "".join(chips) + "</div>"


class InitTab(w.VBox):
    """The init audit of `module`, grouped by module class, with a histogram of the opened tensor.

    The report is computed when the tab is built for modules of at most `eager_limit` names, else
    on the first `set_active(True)` (the tab shown) or a click on "audit": a 7B model's report
    takes a fifth of a second, which the explorer's first paint should not wait for.
    """

    def __init__(self, module: nn.Module, *, eager_limit: int = EAGER_LIMIT) -> None:
        self.module = module
        self.header = w.HTML("")
        self.header.add_class("de-init-header")
        self.refresh_button = w.Button(
            description="audit", tooltip="run the init report (again)", layout=w.Layout(width="100px")
        )
        self.refresh_button.on_click(lambda _: self.refresh())
        self.flagged_only = w.Checkbox(value=False, description="flagged only", indent=False)
        self.flagged_only.observe(lambda _: self._draw_tensors(), names="value")
        self.classes = DataTable(limit=200)
        self.classes.add_class("de-init-classes")
        self.classes.observe(lambda _: self._draw_tensors(), names="selected")
        self.table = DataTable()
        self.table.add_class("de-init-table")
        self.table.observe(lambda change: self.show_tensor(change["new"]), names="selected")
        self.histogram = w.HTML("")
        self.histogram.add_class("de-init-histogram-box")
        self.report = pd.DataFrame()
        super().__init__(
            [w.HBox([self.header, self.flagged_only, self.refresh_button]), self.classes, self.table, self.histogram]
        )
        self.add_class("de-init-tab")
        self.audited = False
        if (
            sum(1 for _ in module.named_parameters(remove_duplicate=False))
            + sum(1 for _ in module.named_buffers(remove_duplicate=False))
            <= eager_limit
        ):
            self.refresh()
        else:
            self.header.value = "<div class='de-init-flags'>not audited yet: open this tab or click audit</div>"

    def set_active(self, active: bool) -> None:
        """The tab was shown (True) or hidden: the first showing runs the report."""
        if active and not self.audited:
            self.refresh()

    def refresh(self) -> None:
        """Run `explorer.init_report` on the module as it is now and redraw."""
        self.report = explorer.init_report(self.module)
        self.audited = True
        self.header.value = flag_counts_html(self.report)
        self.classes.show(class_rows(self.report), CLASS_COLUMNS, key="module_class")
        self._draw_tensors()
        if self.table.selected:
            self.show_tensor(self.table.selected)

    def rows(self) -> pd.DataFrame:
        """The tensors shown: the clicked class's (all when none), flagged only when asked."""
        rows = self.report
        if self.classes.selected:
            rows = rows[rows["module_class"] == self.classes.selected]
        if self.flagged_only.value:
            rows = rows[rows["flags"].map(bool)]
        return rows

    def _draw_tensors(self) -> None:
        self.table.show(self.rows(), TENSOR_COLUMNS, key="name", colour=SEVERITY_COLOURS, colour_by="severity")

    def show_tensor(self, name: str) -> None:
        """Show the histogram of tensor `name` (or why there is none)."""
        if not name or name not in set(self.report["name"]):
            self.histogram.value = ""
            return
        row = self.report.set_index("name").loc[name]
        if row["state"] not in ("materialized", "real"):
            self.histogram.value = (
                f"<div class='de-init-no-values'>{html.escape(name)} is {row['state']}: "
                "materialize it to see its values</div>"
            )
            return
        tensor = self.module.get_parameter(name) if row["kind"] == "parameter" else self.module.get_buffer(name)
        if tensor.device.type == "meta":  # materialized onto meta: shapes only, no values to draw
            self.histogram.value = (
                f"<div class='de-init-no-values'>{html.escape(name)} was materialized on meta (shapes only): "
                "materialize it on a device to see its values</div>"
            )
            return
        with torch.no_grad():
            self.histogram.value = histogram_svg(
                tensor, row["family"], row["params"], row["mean"], row["std"], title=f"{name}: {row['init']}"
            )
