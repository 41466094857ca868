"""What an op diagram can draw, read once from a module's census or from a bare (partial) graph.

A `Scene` is the drawable material with no view decisions yet: the graphs, the tensors that get
a node of their own (`TensorMark`), which module each op belongs to, and the sizes of modules. The
facts come from `explorer.inspection` (census, `op_modules`, `modules_table`); this file only
reshapes them for drawing.

Which module an op belongs to: the innermost module common to every module holding a tensor whose
closure contains it (an op feeding only `layers.3.attn.q.weight` is drawn inside `layers.3.attn.q`,
one feeding two layers inside their common parent). Ops feeding no held tensor belong to the root.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import nn

from .._torch_compat.dispatch import metadata_access
from ..graph import InitGraph, TensorId
from ..inspection.census import FAKE, PARAMETER, Census, NamedTensor, take_census
from ..inspection.modules import modules_table
from ..inspection.ops import op_modules
from ..naming import common_module, dtype_name
from .names import tensor_node, unnamed_tensor_node


@dataclass(slots=True)
class TensorMark:
    """A tensor drawn as a node of its own: a named parameter/buffer, or a parameter of a partial graph."""

    node: str
    graph: int | None  # None: a real tensor the recording never saw
    tensor_id: TensorId | None
    module: str | None  # owning module path; None when the scene has no modules
    name: str  # qualified name (first of a tied group), or "#<tensor id>"
    kind: str  # parameter / buffer / non-persistent buffer
    state: str  # census state: fake / materialized / real
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    also: list[str] = field(default_factory=list)  # the other names of a tied group
    modules: tuple[str, ...] = ()  # the modules holding it under any of its names


@dataclass
class Scene:
    """The drawable material of one module (with `census`) or one bare graph (without)."""

    root_class: str
    graphs: list[InitGraph]
    marks: list[TensorMark]
    census: Census | None = None
    module_classes: dict[str, str] = field(default_factory=dict)  # path → class name (first occurrence)
    op_owner: dict[tuple[int, int], str] = field(default_factory=dict)  # (graph, op) → module path
    error: str | None = None  # why a partial graph stopped
    # A forward graph (render/forward_scene.py): each op's owner is the module whose forward ran it,
    # so focus= draws the ops run inside the focus, and closures do not apply.
    owner_ran_ops: bool = False
    _module_bytes: dict[str, int] | None = None

    @property
    def has_modules(self) -> bool:
        return self.census is not None

    def owner(self, graph: int, index: int) -> str | None:
        """Module path an op is drawn in (root for ops that feed no held tensor); None without modules."""
        if self.census is None:
            return None
        return self.op_owner.get((graph, index), "")

    def module_bytes(self, path: str) -> int:
        """Storage bytes under module `path`, as the modules table counts them."""
        if self._module_bytes is None:
            assert self.census is not None  # asked for summary nodes, which only a scene with modules draws
            table = modules_table(self.census)
            self._module_bytes = dict(zip(table["name"], (int(b) for b in table["bytes"])))
        return self._module_bytes.get(path, 0)

    def find_mark(self, name: str) -> TensorMark | None:
        for mark in self.marks:
            if mark.name == name or name in mark.also:
                return mark
        return None


def _mark_of(entries: list[NamedTensor], census: Census) -> TensorMark:
    first = entries[0]
    if first.graph is not None and first.tensor_id is not None:  # both or neither
        info = census.graphs[first.graph].tensors[first.tensor_id]
        shape, dtype = tuple(info.shape), info.dtype
    else:
        with metadata_access():  # a lazy parameter refuses `.shape`
            shape, dtype = tuple(first.tensor.size()), first.tensor.dtype
    numel = first.numel
    return TensorMark(
        node=tensor_node(first.name),
        graph=first.graph,
        tensor_id=first.tensor_id,
        module=first.module,
        name=first.name,
        kind=first.kind,
        state=first.state,
        shape=shape,
        dtype=dtype_name(dtype),
        nbytes=numel * dtype.itemsize,
        also=[entry.name for entry in entries[1:]],
        modules=tuple(dict.fromkeys(entry.module for entry in entries)),
    )


def module_scene(module: nn.Module) -> Scene:
    """The scene of a deferred, partly materialized or eager module (eager: tensors, no ops)."""
    census = take_census(module)
    groups: dict[tuple, list[NamedTensor]] = {}
    for entry in census.tensors:
        groups.setdefault(entry.identity, []).append(entry)
    with metadata_access():  # lazy parameters refuse metadata reads
        marks = [_mark_of(entries, census) for entries in groups.values()]
    classes: dict[str, str] = {}
    for path, sub in census.modules:
        classes.setdefault(path, type(sub).__name__)
    owners = {key: common_module(paths) for key, paths in op_modules(census).items()}
    return Scene(type(module).__name__, census.graphs, marks, census, classes, owners)


def graph_scene(graph: InitGraph, error: str | None = None) -> Scene:
    """The scene of a bare graph, e.g. the partial recording of a failed `deferred_init`.

    Without a module there are no names or modules, so the tensors that get nodes (`tensor:#0:<id>`)
    are the recording's end results: every tensor no op went on to use except in place (a
    parameter after its initializers, a filled buffer, a dropped temporary), plus every tensor
    that requires grad (parameters). Everything is drawn at the top level.
    """
    used: set[TensorId] = set()
    for op in graph.ops:
        used.update(tid for tid in op.inputs if tid not in op.output_ids)
    marks = []
    for tid, info in graph.tensors.items():
        parameter = info.is_param or info.requires_grad
        if parameter or tid not in used:
            marks.append(
                TensorMark(
                    node=unnamed_tensor_node(0, tid),
                    graph=0,
                    tensor_id=tid,
                    module=None,
                    name=f"#{tid}",
                    kind=PARAMETER if parameter else "tensor",
                    state=FAKE,
                    shape=tuple(info.shape),
                    dtype=dtype_name(info.dtype),
                    nbytes=math.prod(info.shape) * info.dtype.itemsize,
                )
            )
    if error is None and not graph.finished:
        error = "construction did not finish"
    return Scene("partial graph" if not graph.finished else "graph", [graph], marks, error=error)
