"""`ModuleTree`: the module hierarchy with checkboxes, expand/collapse and a state colour per node.

An anywidget (`tree.js` draws it). The selection rule lives in `ModuleSelection`; the browser only
reports intents (`{"type": "check", "path", "checked"}`, `{"type": "select", "path"}`) through
custom messages and writes `expanded` itself. Python answers by setting `checked`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import anywidget
import pandas as pd
import traitlets

from explorer.naming import parent_of

from .formatting import bytes_text, count_text
from .front_end import source
from .selection import ModuleSelection
from .states import STATE_COLOURS, module_states


def tree_nodes(modules: pd.DataFrame, root_class: str) -> list[dict[str, Any]]:
    """One dict per row of the modules table (pre-order): what a tree row shows."""
    names = modules["name"].tolist()
    has_children = set()
    for name in names:
        if name:
            has_children.add(parent_of(name))
    nodes = []
    for name, cls, depth, params, total, devices, state in zip(
        names,
        modules["class"].tolist(),
        modules["depth"].tolist(),
        modules["total_params"].tolist(),
        modules["bytes"].tolist(),
        modules["bytes_by_device"].tolist(),
        module_states(modules),
    ):
        nodes.append(
            {
                "path": name,
                "label": name.rpartition(".")[2] if name else root_class,
                "class": cls,
                "depth": depth,
                "params": count_text(params),
                "bytes": bytes_text(total),
                "device": ", ".join(devices),
                "state": state,
                "colour": STATE_COLOURS[state],
                "has_children": name in has_children,
            }
        )
    return nodes


class ModuleTree(anywidget.AnyWidget):
    """The module tree. `checked` is closed under "a parent selects its subtree"; `partial` lists
    the unchecked modules with something checked below; `active` is the last module selected."""

    _esm = source("tree.js")
    _css = source("style.css")

    nodes = traitlets.List(
        traitlets.Dict(),
        help="One row per module, pre-order: path, label, class, depth, "
        "params, bytes, device, state, colour, has_children (see `tree_nodes`)",
    ).tag(sync=True)
    checked = traitlets.List(
        traitlets.Unicode(),
        help="Checked module paths, tree order, closed under 'a parent selects its subtree'; set by Python only",
    ).tag(sync=True)
    partial = traitlets.List(
        traitlets.Unicode(), help="Unchecked module paths with something checked below them (drawn indeterminate)"
    ).tag(sync=True)
    expanded = traitlets.List(
        traitlets.Unicode(), help="Module paths drawn unfolded; the browser writes it as the user folds"
    ).tag(sync=True)
    active = traitlets.Unicode("", help="The module last selected by a click on its name").tag(sync=True)
    colours = traitlets.Dict(help="Module path → overlay colour, drawn as the row's swatch").tag(sync=True)
    matches = traitlets.List(traitlets.Unicode(), help="Module paths the search matched, drawn marked").tag(sync=True)
    aliases = traitlets.List(
        traitlets.Unicode(), help="Module paths holding a name on the open tensor's storage, lit up"
    ).tag(sync=True)

    def __init__(self, modules: pd.DataFrame, root_class: str, *, expand_depth: int = 1, **kwargs: Any) -> None:
        self.selection = ModuleSelection(modules["name"].tolist())
        super().__init__(
            nodes=tree_nodes(modules, root_class),
            expanded=[
                n
                for n, d in zip(modules["name"].tolist(), modules["depth"].tolist())
                if d <= expand_depth and n in self.selection.children and self.selection.children[n]
            ],
            **kwargs,
        )
        self.root_class = root_class
        self.observe(self._on_checked, names="checked")
        self.on_msg(self._on_front_end_msg)

    def update(self, modules: pd.DataFrame) -> None:
        """Redraw states, sizes and devices from a fresh modules table. When the paths changed
        (surgery in a `deferred(model)` block), the selection follows the new tree: modules gone
        are unchecked, unfolded and no longer active."""
        paths = modules["name"].tolist()
        if paths != self.selection.paths:
            self.selection = ModuleSelection(paths)
            present = set(paths)
            self.checked = self.selection.ordered([path for path in self.checked if path in present])
            self.expanded = [path for path in self.expanded if path in present]
            if self.active not in present:
                self.active = ""
        self.nodes = tree_nodes(modules, self.root_class)

    def set_checked(self, path: str, value: bool) -> None:
        """(Un)check one module as its checkbox does: its subtree follows, ancestors uncheck."""
        self.checked = self.selection.ordered(self.selection.toggled(self.checked, path, value))

    def select(self, path: str) -> None:
        """Make `path`'s subtree the whole selection, and unfold the tree down to it."""
        self.selection.check(path)
        with self.hold_sync():
            self.reveal(path)
            self.active = path
            self.checked = self.selection.subtree(path)

    def select_many(self, paths: Iterable[str]) -> None:
        """Select the subtrees of several modules at once."""
        chosen: set[str] = set()
        for path in paths:
            chosen.update(self.selection.subtree(path))
        self.checked = self.selection.ordered(chosen)

    def clear(self) -> None:
        """Select nothing."""
        self.checked = []

    def reveal(self, path: str) -> None:
        """Expand every ancestor of `path` so its row is on screen."""
        self.expand([*reversed(self.selection.ancestors(path))])

    def expand(self, paths: Iterable[str]) -> None:
        """Expand `paths` (modules with children; others are ignored), keeping what is open."""
        have = set(self.expanded)
        missing = [p for p in paths if p not in have and self.selection.children.get(p)]
        if missing:
            self.expanded = [*self.expanded, *missing]

    def _on_checked(self, change: dict) -> None:
        self.partial = self.selection.partial(change["new"])

    def _on_front_end_msg(self, _widget: object, content: dict, _buffers: object) -> None:
        kind = content.get("type")
        if kind == "check":
            self.set_checked(content["path"], bool(content["checked"]))
        elif kind == "select":
            self.select(content["path"])
