"""The module tree as a diagram: one node per module path, sizes and state from the modules table.

Identical numbered siblings (ModuleList / Sequential items with the same classes, parameter counts,
bytes and states all the way down, e.g. 32 decoder layers) are drawn once as "Class ×N" with the
first one's subtree under it.
"""

from __future__ import annotations

import math

from torch import nn

from .._torch_compat.dispatch import metadata_access
from ..inspection.census import Census, take_census
from ..inspection.modules import modules_table
from ..naming import format_bytes, is_repeat_slot, parent_of
from .diagram import Diagram, DiagramEdge, DiagramNode
from .names import module_node
from .styles import (
    MODULE_DISK,
    MODULE_EMPTY,
    MODULE_FAKE,
    MODULE_LEGEND,
    MODULE_MATERIALIZED,
    MODULE_PARTLY,
    MODULE_REAL,
)


def _own_layouts(census: Census) -> dict[str, list[tuple]]:
    """Per module path, (name, shape, dtype, device) of the tensors it holds itself: siblings fold
    only when these agree too (two Linears of the same size but transposed shapes are not
    "identical")."""
    layouts: dict[str, list[tuple]] = {}
    with metadata_access():  # a lazy parameter refuses `.shape`
        for entry in census.tensors:
            own_name = entry.name[len(entry.module) + 1 :] if entry.module else entry.name
            tensor = entry.tensor
            layouts.setdefault(entry.module, []).append((own_name, tuple(tensor.size()), tensor.dtype, tensor.device))
    return layouts


def count_text(count: int) -> str:
    """4096 → "4.10K", 6_738_415_616 → "6.74B": parameter counts at a glance."""
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= threshold:
            return f"{count / threshold:.2f}{suffix}"
    return str(count)


def _state(fraction: float, recorded: bool, disk_share: float = 0.0) -> tuple[str, str]:
    # "disk" as widgets/states.py has it: nothing materialized, checkpoint reads feed most bytes
    if math.isnan(fraction):
        return MODULE_EMPTY, "no tensors"
    if fraction == 0:
        return (MODULE_DISK, "disk") if disk_share > 0.5 else (MODULE_FAKE, "fake")
    if fraction == 1:
        return (MODULE_MATERIALIZED, "materialized") if recorded else (MODULE_REAL, "real")
    return MODULE_PARTLY, f"partly materialized ({100 * fraction:.0f}%)"


def module_diagram(
    module: nn.Module, depth: int | None = None, fold_repeats: bool = True, legend: bool = True
) -> Diagram:
    """Decide what `module_graph` draws."""
    if depth is not None and depth < 0:
        raise ValueError(f"module_graph: depth must be >= 0 (root = 0), got {depth}")
    census = take_census(module)
    table = modules_table(census)
    recorded: set[str] = set()  # paths whose subtree holds a tensor that came from a recording
    for entry in census.tensors:
        if entry.graph is not None:
            path = entry.module
            while path not in recorded:
                recorded.add(path)
                if not path:
                    break
                path = parent_of(path)

    rows = list(
        zip(
            table["name"],
            table["class"],
            table["depth"],
            table["total_params"],
            table["bytes"],
            table["materialized"],
            table["disk_bytes"],
        )
    )
    children: dict[str, list[str]] = {}
    info: dict[str, tuple] = {}
    for path, cls, level, params, nbytes, fraction, disk in rows:
        if path in info:  # a shared module reached again under the same path cannot happen; keep first
            continue
        disk_share = int(disk) / int(nbytes) if nbytes else 0.0
        info[path] = (cls, int(level), int(params), int(nbytes), _state(float(fraction), path in recorded, disk_share))
        if path:
            children.setdefault(parent_of(path), []).append(path)

    layouts = _own_layouts(census)
    signatures: dict[str, tuple] = {}
    for path in reversed(list(info)):  # pre-order reversed: children before parents
        cls, _, params, nbytes, state = info[path]
        kids = tuple(signatures[c] for c in children.get(path, ()))
        signatures[path] = (cls, params, nbytes, state[1], tuple(layouts.get(path, ())), kids)

    diagram = Diagram(f"{type(module).__name__}: module tree", legend=MODULE_LEGEND if legend else ())

    def visit(path: str, siblings: list[str]) -> None:
        cls, level, params, nbytes, (style, state) = info[path]
        title = path.rpartition(".")[2] if path else cls
        lines = [cls] if path else []
        lines.append(f"{count_text(params)} params · {format_bytes(nbytes)} · {state}")
        kids = children.get(path, [])
        if depth is not None and level >= depth and kids:
            lines.append(f"+{len(kids)} submodules")
            kids = []
        tooltip = path or cls
        if len(siblings) > 1:
            title = f"{cls} ×{len(siblings)}"
            lines[0] = f"{siblings[0]} … {siblings[-1]}" if len(siblings) > 2 else ", ".join(siblings)
            lines[1] = "each: " + lines[1]
            tooltip = "identical modules, drawn once:\n" + "\n".join(siblings[:64])
        diagram.nodes.append(DiagramNode(module_node(path), style, title, lines, None, tooltip))
        groups: dict[tuple | str, list[str]] = {}  # a fold signature, or the path of a module drawn alone
        for kid in kids:
            key = signatures[kid] if fold_repeats and is_repeat_slot(kid) else kid
            groups.setdefault(key, []).append(kid)
        for group in groups.values():
            diagram.edges.append(DiagramEdge(module_node(path), module_node(group[0])))
            visit(group[0], group)

    visit("", [""])
    return diagram
