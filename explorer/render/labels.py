"""Label text of op diagrams: op names and arguments, edge labels, tensor descriptions."""

from __future__ import annotations

from ..graph import ExternalRef, InitGraph, OpNode, TensorRef
from ..inspection.checkpoint_sources import file_label, is_checkpoint_read, read_of
from ..inspection.ops import op_kind
from ..naming import dtype_name, format_bytes, short_path
from .diagram import DiagramNode
from .names import op_node
from .scene import Scene, TensorMark
from .styles import CHECKPOINT_READ


def short_op_name(op: OpNode) -> str:
    """`aten.normal_.default` → `normal_`, `mylib.f.out` → `mylib::f` (the overload is in the tooltip)."""
    if op.name:
        return op.label
    namespace, _, rest = op.label.partition(".")
    rest = rest.rpartition(".")[0] or rest
    return rest if namespace == "aten" else f"{namespace}::{rest}"


def _op_arguments(op: OpNode) -> str:
    # tensors by id ("#3"), external tensors by index, device/layout noise left out
    parts = []
    for value in op.args:
        if isinstance(value, TensorRef):
            parts.append(f"#{value.id}")
        elif isinstance(value, ExternalRef):
            parts.append(f"external #{value.index}")
        else:
            parts.append(_value_text(value))
    for key, value in op.kwargs.items():
        if value is not None and key not in ("device", "pin_memory", "layout", "memory_format", "generator"):
            parts.append(f"{key}={dtype_name(value) if key == 'dtype' else _value_text(value)}")
    return ", ".join(parts)


def _value_text(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, float) else repr(value)


LINE_WIDTH = 40  # characters of a label line under an op's name


def _shorten(text: str) -> str:
    return text if len(text) <= LINE_WIDTH else text[: LINE_WIDTH - 1] + "…"


def op_node_of(scene: Scene, graph: int, index: int, cluster: str | None) -> DiagramNode:
    """The node of one op: "12: normal_", its arguments, and a tooltip with the overload and source
    line; a checkpoint read is named by its file, with its key: "12: read model.safetensors"."""
    op = scene.graphs[graph].ops[index]
    if is_checkpoint_read(op):
        return _read_node(scene, graph, op, cluster)
    arguments = _op_arguments(op)
    lines = [_shorten(arguments)] if arguments else []
    tooltip = f"{op.label}({arguments})"
    if op.source is not None:
        tooltip += f"\n{op.source}\n{op.source.line}"
    return DiagramNode(
        op_node(graph, index),
        op_kind(op),
        f"{_prefix(scene, graph, index)}: {short_op_name(op)}",
        lines,
        cluster,
        tooltip,
    )


def _prefix(scene: Scene, graph: int, index: int) -> str:
    # Ops by index ("12: normal_"), tensors by id ("#3"), as in the ops table.
    return f"{graph}:{index}" if len(scene.graphs) > 1 else f"{index}"


def _read_node(scene: Scene, graph: int, op: OpNode, cluster: str | None) -> DiagramNode:
    path, key, shape, dtype = read_of(op)
    file = file_label(path)
    tooltip = f"{op.label}: {key} {list(shape)} {dtype_name(dtype)}\nfrom {path}"
    if op.source is not None:
        tooltip += f"\n{op.source}\n{op.source.line}"
    return DiagramNode(
        op_node(graph, op.index),
        CHECKPOINT_READ,
        f"{_prefix(scene, graph, op.index)}: read {file}",
        [short_path(key, LINE_WIDTH)],  # keeps a key's layer index (model.…17.…q_proj.weight)
        cluster,
        tooltip,
    )


def edge_label(graph: InitGraph, tid: int) -> str:
    """Shape and dtype of the tensor flowing along an edge: "[4096, 4096] float32"."""
    info = graph.tensors[tid]
    return f"{list(info.shape)} {dtype_name(info.dtype)}"


def describe_mark(mark: TensorMark) -> list[str]:
    """Label lines under a tensor's name: layout, kind and state, size, tied names."""
    lines = [f"{list(mark.shape)} {mark.dtype}", f"{mark.kind} · {mark.state} · {format_bytes(mark.nbytes)}"]
    if mark.also:
        lines.append("= " + ", ".join(mark.also[:3]) + (f" (+{len(mark.also) - 3})" if len(mark.also) > 3 else ""))
    return lines
