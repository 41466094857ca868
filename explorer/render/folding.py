"""Steps 2 and 3 of the op diagram: collapsing deep modules into summaries, folding repeats.

A module deeper than the collapse level disappears into the summary node of its ancestor at that
level + 1. Summaries of numbered siblings (`layers.0`, `layers.1`...) with the same class and the
same contents (op sequence, tensors, submodule structure, states) fold into one "Class ×N" node,
named after the first of them.
"""

from __future__ import annotations

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


def collapse_level(scene: Scene, depth: int | None, focus: str | None) -> int | None:
    """Modules deeper than this are collapsed (None: none are)."""
    if depth is None or not scene.has_modules:
        return None
    if depth < 0:
        raise ValueError(f"op_graph: depth must be >= 0 (root = 0), got {depth}")
    # The focused module (and what contains it) is never collapsed: it is what the user opened.
    return max(depth, depth_of(focus)) if focus is not None else depth


def collapsed_into(path: str | None, level: int | None) -> str | None:
    """The summary module a path at this level disappears into, or None when it stays drawn."""
    if level is None or path is None or depth_of(path) <= level:
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
    scene: Scene, summaries: dict[str, Summary], level: int | None, unfold: frozenset[str] = frozenset()
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
        foldable = is_repeat_slot(path) and parent_of(path) not in unfold
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
