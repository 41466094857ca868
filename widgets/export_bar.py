"""`ExportBar`: save the current diagram (SVG, PNG, standalone HTML) or table (CSV, Parquet).

The browser sends `{"type": "export", "target", "format"}`; the explorer's `produce(target,
format)` returns (file name, bytes); the bar writes them to `folder` (beside the notebook by
default), reports the path in `status` and `saved`, and sends the bytes back so the browser offers
them as a download too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anywidget
import traitlets

from .front_end import source

GRAPH_FORMATS = ("svg", "png", "html")
TABLE_FORMATS = ("csv", "parquet")
MIME = {
    "svg": "image/svg+xml",
    "png": "image/png",
    "html": "text/html",
    "csv": "text/csv",
    "parquet": "application/vnd.apache.parquet",
}
DEFAULT_FOLDER = Path("explorer_exports")

Producer = Callable[[str, str], tuple[str, bytes]]


class ExportBar(anywidget.AnyWidget):
    """Buttons for every (target, format) in `choices`; `saved` lists the paths written so far."""

    _esm = source("export_bar.js")
    _css = source("style.css")

    choices = traitlets.List(
        traitlets.List(traitlets.Unicode()), help='[target, format] per button, e.g. ["graph", "svg"]'
    ).tag(sync=True)
    status = traitlets.Unicode("", help="What the last export did: the path written, or why it failed").tag(sync=True)

    def __init__(self, produce: Producer, *, folder: Path | str = DEFAULT_FOLDER, **kwargs: object) -> None:
        choices = [["graph", f] for f in GRAPH_FORMATS] + [["table", f] for f in TABLE_FORMATS]
        super().__init__(choices=choices, **kwargs)
        self.produce = produce
        self.folder = Path(folder)
        self.saved: list[Path] = []
        self.on_msg(self._on_front_end_msg)

    def export(self, target: str, format: str) -> Path | None:
        """Build, save and send one file; None (and the reason in `status`) when it could not be built."""
        if [target, format] not in self.choices:
            raise ValueError(f"cannot export {target} as {format!r}; choose one of {self.choices}")
        try:
            filename, data = self.produce(target, format)
        except Exception as error:  # shown in the bar: the explorer stays usable
            self.status = f"export failed: {type(error).__name__}: {error}"
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / filename
        path.write_bytes(data)
        self.saved.append(path)
        self.status = f"saved {path} ({len(data):,} bytes)"
        self.send({"type": "download", "filename": filename, "mime": MIME[format]}, [data])
        return path

    def _on_front_end_msg(self, _widget: object, content: dict, _buffers: object) -> None:
        if content.get("type") == "export":
            self.export(str(content.get("target")), str(content.get("format")))
