"""The browser side of the anywidget classes: ES modules and the stylesheet beside this file."""

from __future__ import annotations

import pathlib

HERE = pathlib.Path(__file__).parent


def source(filename: str) -> str:
    """The text of `filename` (next to this module), for a widget's `_esm` or `_css`.

    Text, not a Path: anywidget connects every instance of a class whose `_esm` is a Path to that
    file's change watcher with a strong reference, so no widget would ever be freed
    (manzt/anywidget#929, open).
    """
    return (HERE / filename).read_text(encoding="utf-8")
