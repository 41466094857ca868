"""A forward graph as a `Scene`: what `op_view` draws for construction, fed with a forward pass.

The forward's ops are one `InitGraph` (graph 0 of the scene); each op is owned by the module whose
forward ran it (`Scene.owner_ran_ops`). Tensor nodes are the forward's inputs: every parameter or
buffer an op read (a `TensorMark` named as in construction diagrams, styled by its census state:
fake, disk, materialized, real) and every tensor argument of forward (style `FORWARD_INPUT`).
"""

from __future__ import annotations

import math

from .._torch_compat.dispatch import metadata_access
from ..analysis.forward_graph import ForwardGraph
from ..inspection.census import NamedTensor
from ..naming import dtype_name
from .names import forward_input_node, tensor_node
from .scene import Scene, TensorMark
from .styles import FORWARD_INPUT

INPUT_KIND = "input"


def _parameter_marks(forward: ForwardGraph) -> list[TensorMark]:
    """One mark per parameter/buffer object the forward read (tied names folded into `also`)."""
    groups: dict[tuple, list[NamedTensor]] = {}
    for entry in forward.census.tensors:
        if entry.name in forward.parameters:
            groups.setdefault(entry.identity, []).append(entry)
    marks = []
    with metadata_access():  # lazy parameters refuse metadata reads
        for entries in groups.values():
            first = entries[0]
            tensor = first.tensor
            marks.append(
                TensorMark(
                    node=tensor_node(first.name),
                    graph=0,
                    tensor_id=forward.parameters[first.name],
                    module=first.module,
                    name=first.name,
                    kind=first.kind,
                    state=first.state,
                    shape=tuple(tensor.shape),
                    dtype=dtype_name(tensor.dtype),
                    nbytes=first.numel * tensor.dtype.itemsize,
                    also=[entry.name for entry in entries[1:]],
                    modules=tuple(dict.fromkeys(entry.module for entry in entries)),
                )
            )
    return marks


def _input_marks(forward: ForwardGraph) -> list[TensorMark]:
    marks = []
    for name, tid in forward.inputs.items():
        info = forward.graph.tensors[tid]
        marks.append(
            TensorMark(
                node=forward_input_node(tid),
                graph=0,
                tensor_id=tid,
                module="",
                name=name,
                kind=INPUT_KIND,
                state=FORWARD_INPUT,
                shape=tuple(info.shape),
                dtype=dtype_name(info.dtype),
                nbytes=math.prod(info.shape) * info.dtype.itemsize,
                modules=("",),
            )
        )
    return marks


def forward_scene(forward: ForwardGraph) -> Scene:
    """The drawable material of a forward graph (see the module docstring)."""
    owners = {(0, index): owner for index, owner in enumerate(forward.owners)}
    return Scene(
        forward.root_class,
        [forward.graph],
        _input_marks(forward) + _parameter_marks(forward),
        forward.census,
        dict(forward.module_classes),
        owners,
        owner_ran_ops=True,
    )
