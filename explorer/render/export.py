"""Exporting a diagram: SVG text, PNG bytes, a standalone HTML page, or a file chosen by suffix."""

from __future__ import annotations

import html
from pathlib import Path

import graphviz

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ margin: 0; font-family: Helvetica, Arial, sans-serif; background: #fff; }}
header {{ padding: 6px 12px; font-size: 13px; color: #495057; border-bottom: 1px solid #dee2e6; }}
main {{ overflow: auto; padding: 8px; }}
main svg {{ max-width: none; height: auto; }}
</style>
</head>
<body>
<header>{title}</header>
<main>
{svg}
</main>
</body>
</html>
"""


def to_svg(digraph: graphviz.Digraph) -> str:
    """The diagram laid out by Graphviz `dot`, as SVG text (raises graphviz.ExecutableNotFound without it)."""
    return digraph.pipe(format="svg").decode("utf-8")


def to_png(digraph: graphviz.Digraph) -> bytes:
    """The diagram as PNG bytes."""
    return digraph.pipe(format="png")


def to_html(digraph: graphviz.Digraph, title: str | None = None) -> str:
    """A self-contained HTML page showing the diagram: the SVG inline, no script, nothing fetched."""
    svg = to_svg(digraph)
    svg = svg[svg.index("<svg") :]  # drop the XML prolog and DOCTYPE, which are not valid inside HTML
    return _PAGE.format(title=html.escape(title or digraph.name or "diagram"), svg=svg)


def save(digraph: graphviz.Digraph, path: str | Path) -> Path:
    """Write the diagram to `path` as .svg, .png, .html or .dot (by suffix); returns the path.

    Raises ValueError for any other suffix.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".svg":
        path.write_text(to_svg(digraph), encoding="utf-8")
    elif suffix == ".png":
        path.write_bytes(to_png(digraph))
    elif suffix in (".html", ".htm"):
        path.write_text(to_html(digraph), encoding="utf-8")
    elif suffix in (".dot", ".gv"):
        path.write_text(digraph.source, encoding="utf-8")
    else:
        raise ValueError(f"save: cannot tell the format of {str(path)!r}; use .svg, .png, .html or .dot")
    return path
