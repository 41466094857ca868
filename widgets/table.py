"""`DataTable`: a sortable, clickable table of text cells (anywidget, `table.js`).

Python owns the data: it sorts the pandas frame, cuts it to `limit` rows and formats the cells;
the browser only draws `rows` and reports clicks by setting `selected` (a row key) or
`sort_by` / `ascending` (a header). Every table in the explorer is one of these.

Cells of the `path_columns` hold dotted names; where such a cell is narrower than its name, the
browser shows `explorer.naming.short_path` of it for the cell's width (`short_path.js`, the same
rule), which keeps every layer index and the leaf, and the cell's tooltip keeps the whole name.

With `group_rows` on, and rows in the frame's order or sorted by the first path column (module
order, where a module's rows are consecutive), Python sends `row_groups`: runs of rows under one
module (`explorer.naming.module_groups`). The browser draws a header row per group showing the
module once, then each row's name without it (`q_proj.weight` under `model.layers.3.self_attn · 4`).
Header rows are not rows: they have no key and a click on one selects nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anywidget
import pandas as pd
import traitlets

from explorer.naming import module_groups

from .formatting import Formatter, cell_text, frame_rows
from .front_end import source

DEFAULT_LIMIT = 500


def sort_frame(frame: pd.DataFrame, column: str, ascending: bool) -> pd.DataFrame:
    """Stable sort by `column`; values that do not compare with each other (tuples vs None, lists)
    sort by their text, missing values last."""
    try:
        return frame.sort_values(column, ascending=ascending, kind="stable", na_position="last")
    except TypeError:
        return frame.sort_values(
            column, ascending=ascending, kind="stable", na_position="last", key=lambda values: values.map(cell_text)
        )


class DataTable(anywidget.AnyWidget):
    """Rows of text with a key per row; `selected` is the clicked row's key ("" for none)."""

    _esm = source("short_path.js") + source("table.js")
    _css = source("style.css")

    columns = traitlets.List(traitlets.Unicode(), help="The shown columns' names, in order").tag(sync=True)
    labels = traitlets.List(traitlets.Unicode(), help='Header text per column ("" shows its name)').tag(sync=True)
    rows = traitlets.List(traitlets.List(), help="The shown rows, sorted and cut to `limit`, as cell texts").tag(
        sync=True
    )
    row_keys = traitlets.List(
        traitlets.Unicode(), help="The key of each shown row (what `selected` and `highlighted` name)"
    ).tag(sync=True)
    row_colours = traitlets.List(traitlets.Unicode(), help='A CSS colour per shown row ("" for none)').tag(sync=True)
    selected = traitlets.Unicode("", help='The clicked row\'s key ("" for none); the browser writes it').tag(sync=True)
    highlighted = traitlets.List(traitlets.Unicode(), help="Row keys drawn marked").tag(sync=True)
    sort_by = traitlets.Unicode(
        "", help='The column rows are sorted by ("" for frame order); a header click writes it'
    ).tag(sync=True)
    ascending = traitlets.Bool(True, help="Whether `sort_by` sorts ascending").tag(sync=True)
    caption = traitlets.Unicode("", help='The line under the table ("12 rows", "showing 500 of 3,000 rows")').tag(
        sync=True
    )
    sortable = traitlets.Bool(True, help="Whether a header click sorts").tag(sync=True)
    path_columns = traitlets.List(
        traitlets.Unicode(),
        help="Columns of dotted names, shortened by `short_path` to their cell's width in the browser",
    ).tag(sync=True)
    row_groups = traitlets.List(
        traitlets.Dict(),
        help="Runs of shown rows under one module, {prefix, start, stop} (stop exclusive), in the first of"
        " `path_columns`: the browser shows the prefix once above them and each name without it",
    ).tag(sync=True)
    group_rows = traitlets.Bool(
        False, help="Whether rows in module order (frame order, or sorted by the first path column) are grouped"
    )

    def __init__(
        self, *, limit: int = DEFAULT_LIMIT, sortable: bool = True, captioned: bool = True, **kwargs: object
    ) -> None:
        super().__init__(sortable=sortable, **kwargs)
        self.limit = limit
        self.captioned = captioned
        self._frame: pd.DataFrame | None = None
        self._labels: dict[str, str] = {}
        self._spec: tuple = ((), "", {}, None)
        self._paths: list[str] = []
        self.observe(lambda _: self._draw(), names=["sort_by", "ascending", "group_rows"])

    def show(
        self,
        frame: pd.DataFrame,
        columns: Sequence[str],
        *,
        key: str,
        formats: Mapping[str, Formatter] | None = None,
        colour: Mapping[str, str] | None = None,
        colour_by: str | None = None,
        labels: Mapping[str, str] | None = None,
        paths: Sequence[str] = ("name",),
    ) -> None:
        """Display `columns` of `frame`, one row per frame row, keyed by the text of column `key`.

        `colour_by` names a column whose value picks the row's colour from `colour`; `labels` gives
        shorter header texts for some columns; `paths` names the columns of dotted names, which a
        narrow cell shows by `short_path`.
        """
        self._frame = frame
        self._labels = dict(labels or {})
        self._paths = [column for column in columns if column in paths]
        self._spec = (tuple(columns), key, dict(formats or {}), (colour_by, dict(colour or {})))
        self._draw()

    def current_frame(self) -> pd.DataFrame:
        """Every row the table holds (filters applied, not cut to `limit`), sorted as shown, in the
        shown columns: what an export of "the current table" writes."""
        columns = list(self._spec[0])
        frame = self._frame if self._frame is not None else pd.DataFrame(columns=columns)
        if self.sort_by and self.sort_by in frame.columns:
            frame = sort_frame(frame, self.sort_by, self.ascending)
        return frame[[c for c in columns if c in frame.columns]].reset_index(drop=True)

    def visible_frame(self) -> pd.DataFrame:
        """The rows on screen, sorted and cut to `limit`, as a frame (what the user sees, unformatted)."""
        frame = self._frame if self._frame is not None else pd.DataFrame()
        if self.sort_by and self.sort_by in frame.columns:
            frame = sort_frame(frame, self.sort_by, self.ascending)
        return frame.iloc[: self.limit]

    def _draw(self) -> None:
        columns, key, formats, (colour_by, colour) = self._spec
        full = self._frame if self._frame is not None else pd.DataFrame(columns=list(columns))
        shown = self.visible_frame()
        caption = (
            f"{len(full):,} rows"
            if len(shown) == len(full)
            else f"showing {len(shown):,} of {len(full):,} rows (filter to narrow)"
        )
        with self.hold_sync():
            self.columns = list(columns)
            self.labels = [self._labels.get(column, "") for column in columns]
            self.path_columns = self._paths
            self.rows = frame_rows(shown, columns, formats)
            self.row_groups = self._groups(self.rows)
            self.row_keys = [str(value) for value in shown[key].tolist()] if len(shown) else []
            self.row_colours = (
                [colour.get(value, "") for value in shown[colour_by].tolist()]
                if colour_by and len(shown)
                else [""] * len(shown)
            )
            self.caption = caption if self.captioned else ""

    def _groups(self, rows: list[list[str]]) -> list[dict]:
        """`module_groups` of the first path column's cells, where grouping is on and the sort keeps
        a module's rows together ([] otherwise)."""
        column = self._paths[0] if self._paths else None
        if not self.group_rows or column is None or self.sort_by not in ("", column):
            return []
        index = list(self._spec[0]).index(column)
        return [group._asdict() for group in module_groups([row[index] for row in rows])]
