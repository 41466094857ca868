"""Steps 2 and 3 of the op diagram: collapsing deep modules into summaries, folding repeats.

A module deeper than the collapse level disappears into the summary node of its ancestor at that
level + 1. The outline (`outline_of`) collapses per module instead of per level: it opens the root,
every container of numbered blocks and every module holding one (`model`, `encoder`; not a block
itself), and any module running more than half of its parent's ops; every other module is one
node, and the ops an opened module with submodules runs itself (position ids, a causal mask) make
one node of their own inside its box.

Summaries of numbered siblings (`layers.0`, `layers.1`...) with the same class and the
same contents (op sequence, tensors, submodule structure, states) fold into one "Class ×N" node,
named after the first of them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..inspection.ops import op_kind
from ..naming import depth_of, format_bytes, is_repeat_slot, parent_of
from .diagram import DiagramNode
from .names import module_node
from .scene import Scene, TensorMark
from .styles import FOLDED, SUMMARY


@dataclass
class Summary:
    """A collapsed module and what it hides."""

    path: str
    ops: list[tuple[int, int]] = field(default_factory=list)
    marks: list[TensorMark] = field(default_factory=list)
    folded: list[str] = field(default_factory=list)  # paths drawn by this node (itself first)
    own: bool = False  # the ops an opened module runs outside its submodules (outline only)


@dataclass(frozen=True)
class Outline:
    """A per-module collapse: `opened` modules are drawn as boxes, the rest as one node each; the
    own ops of a module in `fold_own` (opened, with submodules) make one node inside its box."""

    opened: frozenset[str]
    fold_own: frozenset[str]


Collapse = int | Outline | None  # a level (modules deeper are collapsed), an outline, or nothing


def collapse_level(scene: Scene, depth: int | None, focus: str | None) -> int | None:
    """Modules deeper than this are collapsed (None: none are)."""
    if depth is None or not scene.has_modules:
        return None
    if depth < 0:
        raise ValueError(f"op_graph: depth must be >= 0 (root = 0), got {depth}")
    # The focused module (and what contains it) is never collapsed: it is what the user opened.
    return max(depth, depth_of(focus)) if focus is not None else depth


def _prefixes(path: str) -> list[str]:
    """ "a.b" → ["", "a", "a.b"]."""
    parts = path.split(".") if path else []
    return [".".join(parts[:i]) for i in range(len(parts) + 1)]


def outline_of(scene: Scene, ops: dict[int, list[int]], focus: str | None) -> Outline | None:
    """The outline of the drawn `ops` from `focus` down (see the module docstring); None without modules."""
    if not scene.has_modules:
        return None
    counts: Counter[str] = Counter()
    for graph, indices in ops.items():
        for index in indices:
            counts.update(_prefixes(scene.owner(graph, index) or ""))
    children: dict[str, list[str]] = {}
    for path in scene.module_classes:
        if path:
            children.setdefault(parent_of(path), []).append(path)

    def stack(path: str) -> bool:  # a container of numbered blocks (ModuleList, Sequential)
        return path in children and all(is_repeat_slot(child) for child in children[path])

    start = focus or ""
    opened = set(_prefixes(start))
    queue = [start]
    while queue:
        path = queue.pop()
        for child in children.get(path, ()):
            if child not in children or not counts[child]:
                continue
            # a block of a stack opens only when it runs most of the stack's ops (a 1-layer model)
            holds_stack = not is_repeat_slot(child) and (stack(child) or any(map(stack, children[child])))
            if holds_stack or 2 * counts[child] > counts[path]:
                opened.add(child)
                queue.append(child)
    return Outline(frozenset(opened), frozenset(path for path in opened if path in children))


def collapsed_into(path: str | None, level: Collapse, own: bool = False) -> str | None:
    """The summary module a path at this level disappears into, or None when it stays drawn.

    In an outline: its first prefix that is not opened; or, with `own` (an op, not a tensor), the
    path itself when it is an opened module whose own ops fold."""
    if level is None or path is None:
        return None
    if isinstance(level, Outline):
        for prefix in _prefixes(path):
            if prefix not in level.opened:
                return prefix
        return path if own and path in level.fold_own else None
    if depth_of(path) <= level:
        return None
    return ".".join(path.split(".")[: level + 1])


def _signature(scene: Scene, summary: Summary, structure: list[tuple[str, str]]) -> tuple:
    base = len(summary.path)
    op_part = []
    for graph, index in summary.ops:
        op = scene.graphs[graph].ops[index]
        tensors = scene.graphs[graph].tensors
        op_part.append(
            (
                op.label,
                op_kind(op),
                (scene.owner(graph, index) or "")[base:],
                tuple((tensors[tid].shape, tensors[tid].dtype) for tid in op.output_ids),
            )
        )
    mark_part = [(m.name[base:], m.kind, m.state, m.shape, m.dtype, len(m.also)) for m in summary.marks]
    return scene.module_classes.get(summary.path), tuple(op_part), tuple(mark_part), tuple(structure)


def fold_siblings(
    scene: Scene, summaries: dict[str, Summary], level: Collapse, unfold: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Summary path → the path of the summary that draws it (itself unless folded into a sibling).

    Children of a module in `unfold` are never folded (the user expanded "Class ×N")."""
    structure: dict[str, list[tuple[str, str]]] = {path: [] for path in summaries}
    for path, cls in scene.module_classes.items():
        anchor = collapsed_into(path, level)
        if anchor in structure:
            structure[anchor].append((path[len(anchor) :], cls))
    groups: dict[tuple | str, list[str]] = {}  # a fold signature, or the path of a module drawn alone
    for path, summary in summaries.items():
        foldable = is_repeat_slot(path) and parent_of(path) not in unfold and not summary.own
        key = (parent_of(path), _signature(scene, summary, structure[path])) if foldable else path
        groups.setdefault(key, []).append(path)
    drawn_by: dict[str, str] = {}
    for paths in groups.values():
        for path in paths:
            drawn_by[path] = paths[0]
        summaries[paths[0]].folded = paths
    return drawn_by


def _path_range(paths: list[str]) -> str:
    if len(paths) <= 2:
        return ", ".join(paths)
    return f"{paths[0]} … {paths[-1]}"


def summary_node(scene: Scene, summary: Summary) -> DiagramNode:
    cls = scene.module_classes.get(summary.path, "?")
    counts = f"{len(summary.ops)} ops · {len(summary.marks)} tensors · {format_bytes(scene.module_bytes(summary.path))}"
    cluster = parent_of(summary.path) if summary.path else None
    if summary.own:  # drawn inside the opened module's own box
        own = f"{len(summary.ops)} ops · {len(summary.marks)} tensors"
        return DiagramNode(
            module_node(summary.path),
            SUMMARY,
            f"{cls}.forward",
            ["ops outside its submodules", own],
            summary.path,
            tooltip=f"ops run by {summary.path or scene.root_class} itself, not by a submodule",
        )
    if len(summary.folded) > 1:
        total = sum(scene.module_bytes(path) for path in summary.folded)
        return DiagramNode(
            module_node(summary.path),
            FOLDED,
            f"{cls} ×{len(summary.folded)}",
            [_path_range(summary.folded), f"each: {counts}", f"total: {format_bytes(total)}"],
            cluster,
            tooltip="identical modules, drawn once:\n" + "\n".join(summary.folded[:64]),
        )
    return DiagramNode(module_node(summary.path), SUMMARY, summary.path or scene.root_class, [cls, counts], cluster)
