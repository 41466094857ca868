"""`SearchBox`: the explorer's search field (anywidget, `search_box.js`).

The browser sets `query` and `regex` as the user types and sends `{"type": "next"}` /
`{"type": "previous"}` on Enter / Shift+Enter; whoever owns the box (the explorer) searches and
writes `counts`. No matching happens in the browser.
"""

from __future__ import annotations

from collections.abc import Callable

import anywidget
import traitlets

from .front_end import source


class SearchBox(anywidget.AnyWidget):
    """`query`/`regex`: what the user typed; `counts`: the answer line ("3 modules · 12 tensors · 40
    ops — 2 of 55"); `error`: true when `counts` reports a bad pattern."""

    _esm = source("search_box.js")
    _css = source("style.css")

    query = traitlets.Unicode("", help="The pattern typed; the browser writes it").tag(sync=True)
    regex = traitlets.Bool(False, help="Whether `query` is a regular expression (else a substring)").tag(sync=True)
    counts = traitlets.Unicode("", help="The answer line, written by the box's owner").tag(sync=True)
    error = traitlets.Bool(False, help="Whether `counts` reports a bad pattern (drawn red)").tag(sync=True)

    def __init__(self, on_step: Callable[[int], object], **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._on_step = on_step
        self.on_msg(self._on_front_end_msg)

    def _on_front_end_msg(self, _widget: object, content: dict, _buffers: object) -> None:
        step = {"next": 1, "previous": -1}.get(content.get("type", ""))
        if step:
            self._on_step(step)
