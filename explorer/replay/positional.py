"""Whether a storage's final value can be made for any run of its elements alone.

Two callers need a few elements of a large deferred tensor without the rest: an FSDP2 rank needs
its rows (`rows.py`) and `materialize_tensor(t[3])` needs one slice (`slices.py`). Both can skip the
whole tensor when every element's value depends on its position only:

- the source: one in-place random fill of the whole storage (`nn.init.normal_`, `uniform_`...;
  earlier dead writes such as Hugging Face's first `kaiming_uniform_` are skipped, as in replay),
  whose draws the caller then places by element; or a constant (`torch.zeros`, `ones`, `full`, or
  `fill_` / `zero_` of the whole storage);
- then any number of ops that read no other tensor: pointwise in-place ops on the whole storage
  (timm's `trunc_normal_` is `uniform_`, `erfinv_`, `mul_`, `add_`, `clamp_`), each applied to the
  run of elements alone once `pointwise.py`'s probe shows the kernel gives the same bits there; and
  constants written to a contiguous run of elements (an embedding's padding row zeroed).

Anything else returns the reason, in words a user can act on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from ..graph import InitGraph, OpNode, TensorId, TensorInfo, accepts_generator, is_inplace_random
from ..record.initializers import INITIALIZER_OPS
from .draws import draw_count, family_of, is_contiguous
from .fill_layout import fill_layout

SourceKind = Literal["random fill", "constant"]

_aten = torch.ops.aten
_EMPTY = frozenset({_aten.empty.memory_format, _aten.empty_strided.default})
_CONSTANT_FACTORIES = {
    _aten.ones.default: lambda op: 1,
    _aten.zeros.default: lambda op: 0,
    _aten.full.default: lambda op: op.args[1],
}
_CONSTANT_FILLS = {_aten.fill_.Scalar: lambda op: op.args[1], _aten.zero_.default: lambda op: 0}
_DRAWN_ON = frozenset({"cpu", "cuda"})  # generators whose draws are placed by element


@dataclass(frozen=True)
class TailOp:
    """An op after the source: pointwise over the whole storage (`window` None), or a constant
    written to elements [window[0], window[1]) only (an embedding's padding row zeroed)."""

    op: OpNode
    window: tuple[int, int] | None = None


@dataclass(frozen=True)
class PositionalValue:
    """A storage's final value: `source` (a random fill, or the op giving the `constant`), then the
    ops `tail`, in order."""

    kind: SourceKind
    source: OpNode
    tail: tuple[TailOp, ...] = ()
    constant: int | float | bool | None = None


def value_ops(graph: InitGraph, tid: TensorId) -> list[OpNode]:
    """The ops replay runs for tensor `tid`'s value, aliasing ops (views, detach) left out."""
    return [graph.ops[i] for i in graph.closure_of([tid], skip_dead_writes=True) if not graph.ops[i].aliases_only]


def positional_value(graph: InitGraph, base: TensorInfo) -> PositionalValue | str:
    """How `base` — a contiguous tensor over the whole of its storage — gets its final value by
    position, or why it does not (see above)."""
    storage = graph.storages[base.storage]
    if base.storage_offset or not is_contiguous(base) or storage.nbytes != math.prod(base.shape) * base.dtype.itemsize:
        return "the tensor is not contiguous over its whole storage"
    ops = value_ops(graph, base.id)
    if any(op.inference for op in ops):
        return "it was made under torch.inference_mode() (an inference tensor, made whole as eager made it)"
    if not any(op.index == storage.creator for op in ops):
        return "the storage was not created by an op of the graph"
    own = [op for op in ops if op.index == storage.creator or base.storage in op.writes]
    source = _source(graph, own, base)
    if isinstance(source, str):
        return source
    done = 2 if source.source is not own[0] else 1
    tail = []
    for op in own[done:]:
        step = _tail_op(graph, op, base)
        if isinstance(step, str):
            return step
        tail.append(step)
    if len(own) != len(ops):  # ops making other tensors that one of these reads
        return f"the value reads other tensors (ops: {_labels([op for op in ops if op not in own])})"
    return PositionalValue(source.kind, source.source, tuple(tail), source.constant)


def _tail_op(graph: InitGraph, op: OpNode, base: TensorInfo) -> TailOp | str:
    if len(op.inputs) != 1 or op.externals:
        return f"{op.label} after the fill reads another tensor"
    if is_pointwise_in_place(graph, op, base):
        return TailOp(op)
    window = _constant_window(graph, op, base)
    if window is not None:
        return TailOp(op, window)
    return f"{op.label} after the fill is neither a pointwise in-place op on the whole tensor nor a constant"


def _constant_window(graph: InitGraph, op: OpNode, base: TensorInfo) -> tuple[int, int] | None:
    """Elements [start, stop) of `base` that constant fill `op` writes, when they are a contiguous run."""
    if op.func not in _CONSTANT_FILLS or not isinstance(_CONSTANT_FILLS[op.func](op), (int, float, bool)):
        return None
    written = graph.tensors[op.inputs[0]]
    count = math.prod(written.shape)
    if written.storage != base.storage or written.dtype != base.dtype or not is_contiguous(written):
        return None
    if written.storage_offset + count > math.prod(base.shape):
        return None
    return written.storage_offset, written.storage_offset + count


def _labels(ops: list[OpNode]) -> str:
    return ", ".join(op.label for op in ops[:4]) + (" ..." if len(ops) > 4 else "")


def _source(graph: InitGraph, ops: list[OpNode], base: TensorInfo) -> PositionalValue | str:
    creator, first_write = ops[0], ops[1] if len(ops) > 1 else None
    if first_write is not None and first_write.random:
        return _random_fill(graph, first_write, base)
    constant_creator = creator.func in _EMPTY or creator.func in _CONSTANT_FACTORIES
    if first_write is not None and first_write.func in _CONSTANT_FILLS and constant_creator:
        if not _whole_storage(graph, first_write, base):
            return f"its {first_write.label} does not write the whole tensor"
        return _constant(first_write, _CONSTANT_FILLS[first_write.func](first_write))
    if creator.func in _CONSTANT_FACTORIES:
        return _constant(creator, _CONSTANT_FACTORIES[creator.func](creator))
    if creator.random and first_write is None:
        return (
            f"it is made by a random factory ({creator.label}), whose draws are not placed by row here: "
            "torch.empty(...) then an in-place fill (.normal_(), .uniform_()) draws the same numbers and is"
        )
    return f"the value is not one random fill or constant of the whole storage (ops: {_labels(ops)})"


def _constant(op: OpNode, value: object) -> PositionalValue | str:
    if not isinstance(value, (int, float, bool)):
        return f"its {op.label} sets a value that is not a Python number"
    return PositionalValue("constant", op, constant=value)


def _random_fill(graph: InitGraph, fill: OpNode, base: TensorInfo) -> PositionalValue | str:
    """`fill` as the source, when its draws can be placed by element on its generator."""
    if fill.stream is None or base.device.type not in _DRAWN_ON or fill.stream[0] != str(base.device):
        return f"its {fill.label} draws from a generator other than {base.device}'s"
    if not is_inplace_random(fill.func):
        return f"{fill.label} is not an in-place random fill"
    if fill.func in INITIALIZER_OPS:
        return f"{fill.label} (rejection sampling) draws as many numbers as its values need: none can be placed"
    if not accepts_generator(fill.func):
        return f"{fill.label} takes no generator, so its draws cannot be placed by position"
    if len(fill.inputs) != 1:
        return f"{fill.label} reads another tensor"
    if not fill.overwrites or not _whole_storage(graph, fill, base):
        return f"its {fill.label} does not write the whole tensor in order"
    if base.device.type == "cpu":
        family = family_of(graph, fill) if draw_count(graph, fill) is not None else None
        if family is None or fill_layout(family, base.dtype, math.prod(base.shape)) is None:
            return f"the draws of its {fill.label} on the CPU are not placed element by element"
    return PositionalValue("random fill", fill)


def is_pointwise_in_place(graph: InitGraph, op: OpNode, base: TensorInfo) -> bool:
    """Whether `op` writes `base`'s storage in place with a pointwise kernel that reads no other
    tensor, through a view of the whole storage in `base`'s dtype and element order."""
    func = op.func
    if torch.Tag.pointwise not in getattr(func, "tags", ()) or op.random or op.inference or op.default_dtype:
        return False
    schema = func._schema
    first = schema.arguments[0] if schema.arguments else None
    if first is None or first.alias_info is None or not first.alias_info.is_write or len(schema.returns) != 1:
        return False
    if len(op.inputs) != 1 or op.externals:
        return False
    return _whole_storage(graph, op, base)


def _whole_storage(graph: InitGraph, op: OpNode, base: TensorInfo) -> bool:
    """Whether `op`'s first argument is a view of all of `base`'s storage, contiguous, in its dtype:
    the same elements in the same order, whatever its shape."""
    written = graph.tensors[op.inputs[0]] if op.inputs else None
    return (
        written is not None
        and written.storage == base.storage
        and written.storage_offset == 0
        and is_contiguous(written)
        and math.prod(written.shape) == math.prod(base.shape)
        and written.dtype == base.dtype
    )
