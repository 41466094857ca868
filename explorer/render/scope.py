"""Step 1 of the op diagram: which ops and which tensors a view draws."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..inspection.census import FAKE
from ..naming import depth_of, dtype_name, is_inside
from .names import unnamed_tensor_node
from .scene import Scene, TensorMark


@dataclass
class Scope:
    """The ops and tensors one view draws, before placement."""

    ops: dict[int, list[int]]  # graph → op indices drawn, ascending
    marks: list[TensorMark]
    description: str

    def __post_init__(self) -> None:
        self.op_sets = {graph: set(indices) for graph, indices in self.ops.items()}


def _reads_marks(scene: Scene, ops: dict[int, list[int]], chosen: list[TensorMark]) -> list[TensorMark]:
    """`chosen` plus every other tensor with a node that a drawn op takes as input."""
    read: set[tuple[int, int]] = set()
    for graph, indices in ops.items():
        graph_ops = scene.graphs[graph].ops
        for index in indices:
            read.update((graph, tid) for tid in graph_ops[index].inputs)
    picked = {id(mark) for mark in chosen}
    others = [mark for mark in scene.marks if id(mark) not in picked and (mark.graph, mark.tensor_id) in read]
    return [*chosen, *others]


def _closure_target(scene: Scene, name: str) -> tuple[TensorMark | None, int, int]:
    mark = scene.find_mark(name)
    if mark is not None:
        if mark.graph is None or mark.tensor_id is None:  # both or neither
            raise ValueError(f"closure_of={name!r}: that tensor is real (never recorded), so it has no closure")
        return mark, mark.graph, mark.tensor_id
    if name.startswith("#"):
        graph_text, _, tid_text = name[1:].rpartition(":")
        try:
            graph, tid = int(graph_text or 0), int(tid_text)
        except ValueError:
            graph = tid = -1
        if 0 <= graph < len(scene.graphs) and tid in scene.graphs[graph].tensors:
            return None, graph, tid
    known = ", ".join(mark.name for mark in scene.marks[:5])
    raise ValueError(
        f"closure_of={name!r}: no tensor of {scene.root_class} has that name (give a qualified name such "
        f"as {known or 'layers.0.weight'}, or '#<graph>:<tensor id>' for an unnamed one)"
    )


def select_scope(scene: Scene, focus: str | None, closure_of: str | None) -> Scope:
    """Every op; or the closures of a focused module's tensors; or one tensor's closure (exactly
    `InitGraph.closure_of`). Tensor nodes: those of the focus (or the target), plus the other
    named tensors that drawn ops read. Raises ValueError naming an unknown path or tensor."""
    graphs = scene.graphs
    if focus is not None and closure_of is not None:
        raise ValueError("op_graph: give focus= or closure_of=, not both")
    if closure_of is not None and scene.owner_ran_ops:
        raise ValueError(
            "op_graph: closure_of= is for construction graphs; a forward graph has no closures "
            "(use focus= to draw one module's ops)"
        )
    if closure_of is not None:
        mark, graph, tid = _closure_target(scene, closure_of)
        ops = {graph: scene.graphs[graph].closure_of([tid])}
        if mark is None:
            info = graphs[graph].tensors[tid]
            mark = TensorMark(
                unnamed_tensor_node(graph, tid),
                graph,
                tid,
                scene.owner(graph, info.producer),
                f"#{graph}:{tid}",
                "intermediate",
                FAKE,
                tuple(info.shape),
                dtype_name(info.dtype),
                math.prod(info.shape) * info.dtype.itemsize,
            )
        return Scope(ops, _reads_marks(scene, ops, [mark]), f"closure of {closure_of}")
    if focus is not None:
        if not scene.has_modules:
            raise ValueError("op_graph: focus= needs a module; a bare graph has no module paths")
        if focus not in scene.module_classes:
            children = [path for path in scene.module_classes if path and depth_of(path) == depth_of(focus)]
            raise ValueError(
                f"focus={focus!r}: {scene.root_class} has no submodule with that path "
                f"(modules at that depth: {', '.join(children[:8]) or 'none'})"
            )
        if scene.owner_ran_ops:
            ops = {
                graph: [i for i in range(len(g.ops)) if is_inside(scene.op_owner.get((graph, i), ""), focus)]
                for graph, g in enumerate(graphs)
            }
            return Scope(ops, _reads_marks(scene, ops, []), f"focus {focus or '(root)'}")
        chosen = [mark for mark in scene.marks if any(is_inside(module, focus) for module in mark.modules)]
        needed: dict[int, set[int]] = {}
        census = scene.census
        assert census is not None  # has_modules, checked above
        for entry in census.tensors:
            if entry.graph is not None and entry.tensor_id is not None and is_inside(entry.module, focus):
                needed.setdefault(entry.graph, set()).update(census.closures[(entry.graph, entry.tensor_id)])
        ops = {graph: sorted(indices) for graph, indices in needed.items()}
        return Scope(ops, _reads_marks(scene, ops, chosen), f"focus {focus or '(root)'}")
    ops = {graph: list(range(len(g.ops))) for graph, g in enumerate(graphs)}
    return Scope(ops, list(scene.marks), "")
