"""Turning user-controlled text (module paths, tensor names, source lines) into DOT that stays text.

Every name in a diagram comes from the user's model: a module registered as `<script>`, a key with
quotes or braces, a path with a backslash. Three places in DOT read text differently, so each gets
its own function and nothing else in the package writes DOT quoting by hand:

- node and cluster ids (`dot_id`): a double-quoted DOT string. Graphviz keeps every character of it
  except `\\"`, and writes it XML-escaped into the SVG `<title>`, which is how a click is mapped
  back to Python; so the title reads exactly the name given, except for control characters (shown
  as U+FFFD) and a backslash that would swallow the closing quote (doubled);
- labels (`html_text`): we only ever write HTML-like labels, where `<`, `>`, `&`, quotes must be
  entities; Graphviz still expands escString sequences there (`\\N` becomes the node name, even
  when written `&#92;N`), and reads `\\\\` as one backslash, so a backslash is doubled;
- tooltips (`esc_string`): a quoted escString, where backslash sequences are Graphviz escapes.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # not allowed in XML 1.0 (SVG)
# Graphviz's lexer reads a backslash pair as two literal characters and `\\"` as a quote, so an odd
# run of backslashes before a quote, a newline or the closing quote would swallow that character.
_ODD_BACKSLASHES = re.compile(r'(?<!\\)(?:\\\\)*\\(?=["\n]|$)')

_HTML_ENTITIES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    '"': "&quot;",
    "'": "&#39;",
    "\\": "\\\\",
    "\n": "<br/>",
    "\r": "",
    "\t": " ",
    "]": "&#93;",  # Graphviz's label lexer refuses a text item of `]` alone (`<b>]</b>`)
}
_HTML_SPECIAL = re.compile(r"[&<>\"'\\\n\r\t\]]")


def _visible(text: str) -> str:
    return _CONTROL.sub("\ufffd", text)


def dot_id(name: str) -> str:
    """`name` as a quoted DOT id whose SVG `<title>` reads back as `name`."""
    text = _visible(name)
    text = _ODD_BACKSLASHES.sub(lambda m: m.group(0) + "\\", text)
    return '"' + text.replace('"', '\\"') + '"'


def html_text(text: str) -> str:
    """`text` as literal text inside an HTML-like label (newlines become line breaks)."""
    return _HTML_SPECIAL.sub(lambda m: _HTML_ENTITIES[m.group(0)], _visible(text))


def esc_string(text: str) -> str:
    """`text` as a quoted escString attribute value (tooltips): shown as is, `\\n` as line breaks."""
    text = _visible(text).replace("\\", "\\\\").replace('"', '\\"').replace("\r", "")
    return '"' + text.replace("\n", "\\n") + '"'
