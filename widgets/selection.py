"""Which modules of a tree are selected, kept closed under "a parent selects its subtree".

Pure data over module paths (`named_modules` order, root = ""), so the rule lives in one place and
the tree widget, the tables and the materialize bar all read the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from explorer.naming import common_module, parent_path


class ModuleSelection:
    """The module paths of one root module, with the subtree and ancestor relations between them."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths: list[str] = list(dict.fromkeys(paths))
        self._known = set(self.paths)
        self.children: dict[str, list[str]] = {path: [] for path in self.paths}
        for path in self.paths:
            parent = parent_path(path)
            if parent is not None and parent in self.children:
                self.children[parent].append(path)

    def check(self, path: str) -> None:
        """Raise KeyError naming `path` when it is not a module path of this tree."""
        if path not in self._known:
            raise KeyError(f"no module at path {path!r}")

    def subtree(self, path: str) -> list[str]:
        """`path` and every module below it, pre-order."""
        self.check(path)
        out, stack = [], [path]
        while stack:
            current = stack.pop()
            out.append(current)
            stack.extend(reversed(self.children[current]))
        return out

    def ancestors(self, path: str) -> list[str]:
        """Parent, grandparent, ... up to the root (nearest first)."""
        out = []
        parent = parent_path(path)
        while parent is not None:
            out.append(parent)
            parent = parent_path(parent)
        return out

    def toggled(self, checked: Iterable[str], path: str, value: bool) -> set[str]:
        """The checked set after (un)checking `path`.

        Checking selects the whole subtree. Unchecking clears the subtree and every ancestor: a
        checked parent means "all of me", which is no longer true.
        """
        result = set(checked)
        subtree = self.subtree(path)
        if value:
            result.update(subtree)
        else:
            result.difference_update(subtree)
            result.difference_update(self.ancestors(path))
        return result

    def ordered(self, checked: Iterable[str]) -> list[str]:
        """`checked` in tree order."""
        chosen = set(checked)
        return [path for path in self.paths if path in chosen]

    def partial(self, checked: Iterable[str]) -> list[str]:
        """Unchecked modules with something checked below them (the tree draws them indeterminate)."""
        chosen = set(checked)
        below: set[str] = set()
        for path in chosen:
            below.update(self.ancestors(path))
        return [path for path in self.paths if path in below and path not in chosen]

    def roots(self, checked: Iterable[str]) -> list[str]:
        """Checked modules whose parent is not checked: the tops of the selected subtrees."""
        chosen = set(checked)
        return [path for path in self.paths if path in chosen and parent_path(path) not in chosen]

    def focus(self, checked: Iterable[str]) -> str | None:
        """The deepest module containing every selected subtree (None when nothing is selected)."""
        roots = self.roots(checked)
        return common_module(roots) if roots else None
