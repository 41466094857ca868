"""`widgets.compare(a, b)`: what differs between two models (deferred, partial or eager), as tables.

A summary line and three sortable tables from `Inspection.diff`: modules added, removed or of
another class; tensors added or removed; and every changed metadata field of the tensors both
hold (shape, stride, offset, dtype, device, kind, tie group). Typical use: a model before and
after a config change, or Hugging Face's model against a refactor, both built deferred.

`widgets.compare(model, "path/to/checkpoint")`: a checkpoint path as the second argument shows
`explorer.check_checkpoint(model, path)` instead (missing and unexpected keys, shape and dtype
mismatches, tie conflicts, from headers only), as its HTML.
"""

from __future__ import annotations

import html
import os

import ipywidgets as w
from torch import nn

import explorer
from explorer.inspection import Inspection
from explorer.inspection.diff import InspectionDiff

from .formatting import cell_text
from .table import DataTable

Comparable = nn.Module | Inspection
CheckpointPath = str | os.PathLike


def _inspection(subject: Comparable, side: str) -> Inspection:
    if isinstance(subject, Inspection):
        return subject
    if isinstance(subject, nn.Module):
        return explorer.inspect(subject)
    raise TypeError(
        f"compare: {side} must be an nn.Module, an Inspection or (after) a checkpoint path, "
        f"got {type(subject).__name__}"
    )


def summary_html(labels: tuple[str, str], classes: tuple[str, str], summary: str) -> str:
    """The summary line, "<b>before</b> (Net) → <b>after</b> (Net): 2 tensors changed", every part
    escaped: labels and class names are the user's text and must show as text, never as markup."""
    before, after = html.escape(labels[0]), html.escape(labels[1])
    before_class, after_class = html.escape(classes[0]), html.escape(classes[1])
    return f"<b>{before}</b> ({before_class}) → <b>{after}</b> ({after_class}): {html.escape(summary)}"


class CompareWidget(w.VBox):
    """`diff` holds the differences; `modules_table`, `tensors_table`, `changes_table` show them."""

    def __init__(self, before: Comparable, after: Comparable, *, labels: tuple[str, str] = ("before", "after")) -> None:
        self.before, self.after = _inspection(before, "before"), _inspection(after, "after")
        self.diff: InspectionDiff = self.before.diff(self.after)
        self.summary = w.HTML(
            summary_html(labels, (self.before.root_class, self.after.root_class), self.diff.summary())
        )
        self.summary.add_class("de-compare-summary")
        self.modules_table = DataTable()
        self.modules_table.add_class("de-compare-modules")
        self.modules_table.show(
            self.diff.modules.assign(name=self.diff.modules["name"].replace("", "(root)")),
            ["name", "change", "before", "after"],
            key="name",
        )
        self.tensors_table = DataTable()
        self.tensors_table.add_class("de-compare-tensors")
        self.tensors_table.show(self.diff.tensors, ["name", "change", "kind", "shape", "dtype"], key="name")
        changes = self.diff.tensor_changes
        self.changes_table = DataTable()
        self.changes_table.add_class("de-compare-changes")
        self.changes_table.show(
            changes.assign(
                key=changes["name"] + ":" + changes["field"],
                before=changes["before"].map(cell_text),
                after=changes["after"].map(cell_text),
            ),
            ["name", "field", "before", "after"],
            key="key",
        )
        super().__init__(
            [
                self.summary,
                w.Label("modules added, removed or of another class"),
                self.modules_table,
                w.Label("tensors added or removed"),
                self.tensors_table,
                w.Label("tensors whose metadata changed"),
                self.changes_table,
            ]
        )
        self.add_class("de-compare")


class CheckpointCompareWidget(w.VBox):
    """`check` holds `explorer.check_checkpoint(module, path)`; `report` shows its HTML."""

    def __init__(self, module: nn.Module, path: CheckpointPath) -> None:
        self.check = explorer.check_checkpoint(module, path)
        self.report = w.HTML(self.check._repr_html_())
        self.report.add_class("de-compare-checkpoint")
        super().__init__([self.report])
        self.add_class("de-compare")


def compare(
    before: Comparable, after: Comparable | CheckpointPath, *, labels: tuple[str, str] = ("before", "after")
) -> CompareWidget | CheckpointCompareWidget:
    """A widget listing what differs between `before` and `after` (modules or inspections); when
    `after` is a checkpoint path (str or os.PathLike), what stands between that checkpoint and the
    module `before` (`explorer.check_checkpoint`; `labels` unused). Raises CheckpointError as the
    check does, TypeError for anything else."""
    if isinstance(after, (str, os.PathLike)):
        if not isinstance(before, nn.Module):
            raise TypeError(f"compare: checking a checkpoint needs the module as before, got {type(before).__name__}")
        return CheckpointCompareWidget(before, after)
    return CompareWidget(before, after, labels=labels)
