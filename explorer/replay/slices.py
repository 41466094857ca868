"""A slice of a deferred tensor at the cost of the slice.

`materialize_tensor(m.experts.gate_up_proj[3])` asks for one expert of a fused 3-D parameter; the
ordinary replay would produce the whole 30 GB base and hand out a view of it. When the base's value
is one source whose elements can be produced by position, only the view's elements are made:

- one in-place CPU random fill of the whole storage (`nn.init.normal_`, `uniform_`...; earlier
  dead writes such as Hugging Face's first `kaiming_uniform_` are skipped, as in replay): the
  view's elements are drawn alone from the generator jumped to their first draw (`fill_layout.py`);
- a constant (`torch.ones`, `torch.full`, `zeros_`, `fill_`): the view is that constant;
- one checkpoint read, at most converted (`rows.checkpoint_rows`): only the view's rows are read.

The view must be a contiguous run of its base's elements in the base's dtype: `t[i]`, `t[a:b]`,
`t.narrow(0, a, n)`, `t.select(0, i)` of a contiguous base (and any other view that happens to be
such a run). The result equals the same view of the whole materialized base, bit for bit, but
shares no memory with it. Anything else (`t[:, 3]`, a base changed by other ops, a GPU generator, a
base already materialized, which makes the ordinary view free) takes the ordinary path; when that
path makes a larger base than the view, `slice_plan` says why and `materialize_tensor` warns
(`WholeBaseWarning`).
"""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass
from typing import Literal, cast

import torch

from ..graph import InitGraph, OpNode, TensorId, TensorInfo, accepts_generator, is_inplace_random
from ..record.fake import handle_of
from ..record.no_data import named_tensors_of
from ..record.scope import outside_recording
from .draws import Family, draw_count, family_of, is_contiguous
from .fill_layout import FillLayout, RecordedFill, draw_range, fill_layout
from .preflight import check_materializable
from .provenance import remember_origins
from .real_memory import as_recorded_kind
from .replay import ReplayState
from .rng import RngMode
from .routing import DeviceMap, DeviceRouting, route_devices
from .rows import checkpoint_read, checkpoint_rows, fill_start_state

SliceSource = Literal["random fill", "constant", "checkpoint read"]

_aten = torch.ops.aten
_EMPTY = frozenset({_aten.empty.memory_format, _aten.empty_strided.default})
_CONSTANT_FACTORIES = {
    _aten.ones.default: lambda op: 1,
    _aten.zeros.default: lambda op: 0,
    _aten.full.default: lambda op: op.args[1],
}
_CONSTANT_FILLS = {_aten.fill_.Scalar: lambda op: op.args[1], _aten.zero_.default: lambda op: 0}


class WholeBaseWarning(UserWarning):
    """`materialize_tensor` of a view had to materialize the view's whole (larger) base."""


@dataclass(frozen=True)
class SlicePlan:
    """How `materialize_tensor` makes a deferred tensor: its own elements alone (`sliced`), or by
    the ordinary replay of everything its storage needs."""

    sliced: bool
    nbytes: int  # bytes of new tensor memory it allocates: the view's own, or its whole storage
    source: SliceSource | None  # what the sliced elements come from (None when not sliced)
    reason: str  # why the whole storage is needed; "" when sliced or when the tensor is its storage


@dataclass(frozen=True)
class _Window:
    """Elements [first, first + count) of a storage's base tensor `base` (shape, dtype, device)."""

    base: TensorInfo
    first: int
    count: int


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _window(graph: InitGraph, tid: TensorId) -> _Window | str:
    """The view `tid` as a contiguous run of a whole-storage tensor, or why it is not one."""
    info = graph.tensors[tid]
    creator = graph.ops[graph.storages[info.storage].creator]
    bases = [graph.tensors[t] for t in creator.output_ids if graph.tensors[t].storage == info.storage]
    if not bases:
        return "its storage was not created by a tensor of the graph"
    base = bases[0]
    if base.storage_offset or not is_contiguous(base) or base.dtype != info.dtype:
        return "its base is not a contiguous tensor of the same dtype"
    if not is_contiguous(info) or info.storage_offset + _numel(info.shape) > _numel(base.shape):
        return "it is not a contiguous run of its base's elements (only rows are drawn alone: t[i], t[a:b])"
    return _Window(base, info.storage_offset, _numel(info.shape))


def _value_ops(graph: InitGraph, tid: TensorId) -> list[OpNode]:
    return [graph.ops[i] for i in graph.closure_of([tid], skip_dead_writes=True) if not graph.ops[i].aliases_only]


def _whole_storage(graph: InitGraph, op: OpNode, window: _Window) -> bool:
    written = graph.tensors[op.inputs[0]] if op.inputs else None
    return (
        written is not None
        and written.storage == graph.tensors[window.base.id].storage
        and written.storage_offset == 0
        and is_contiguous(written)
        and written.shape == window.base.shape
        and written.dtype == window.base.dtype
    )


def _random_fill(graph: InitGraph, ops: list[OpNode], window: _Window) -> OpNode | None:
    """The one in-place CPU random fill of the whole storage giving the window its value, or None."""
    if len(ops) != 2 or ops[0].func not in _EMPTY:
        return None
    fill = ops[1]
    if fill.stream is None or fill.stream[0] != "cpu" or fill.inference or len(fill.inputs) != 1:
        return None
    if not (is_inplace_random(fill.func) and accepts_generator(fill.func)) or not _whole_storage(graph, fill, window):
        return None
    if draw_count(graph, fill) is None or family_of(graph, fill) is None:
        return None
    family = cast(Family, family_of(graph, fill))  # checked just above
    return fill if fill_layout(family, window.base.dtype, _numel(window.base.shape)) else None


def _constant(graph: InitGraph, ops: list[OpNode], window: _Window) -> int | float | bool | None:
    """The constant every element of the storage holds, or None."""
    if len(ops) == 1 and ops[0].func in _CONSTANT_FACTORIES:
        value = _CONSTANT_FACTORIES[ops[0].func](ops[0])
    elif len(ops) == 2 and ops[0].func in _EMPTY | set(_CONSTANT_FACTORIES) and ops[1].func in _CONSTANT_FILLS:
        if not _whole_storage(graph, ops[1], window):
            return None
        value = _CONSTANT_FILLS[ops[1].func](ops[1])
    else:
        return None
    return value if isinstance(value, (int, float, bool)) else None


def _checkpoint_rows(graph: InitGraph, window: _Window) -> tuple[int, int] | None:
    """Rows [start, stop) of the base the window is, when it is whole rows of it."""
    rows = window.base.shape[0] if window.base.shape else 0
    row = _numel(window.base.shape[1:]) if rows else 0
    if not row or window.first % row or window.count % row:
        return None
    return window.first // row, (window.first + window.count) // row


@dataclass(frozen=True)
class _Recipe:
    source: SliceSource
    window: _Window
    fill: OpNode | None = None
    constant: int | float | bool | None = None
    rows: tuple[int, int] | None = None


def _recipe(graph: InitGraph, tid: TensorId) -> _Recipe | str | None:
    """How to make view `tid` alone; a reason when it needs its whole larger base; None when it is
    not smaller than its storage (nothing to save)."""
    info = graph.tensors[tid]
    if _numel(info.shape) * info.dtype.itemsize >= graph.storages[info.storage].nbytes:
        return None
    if info.device.type != "cpu":
        return f"it was recorded on {info.device} (only CPU generators are drawn by position)"
    window = _window(graph, tid)
    if isinstance(window, str):
        return window
    ops = _value_ops(graph, tid)
    if any(op.inference for op in ops):
        return "its base was made under torch.inference_mode() (an inference tensor, made whole as eager made it)"
    fill = _random_fill(graph, ops, window)
    if fill is not None:
        return _Recipe("random fill", window, fill=fill)
    constant = _constant(graph, ops, window)
    if constant is not None:
        return _Recipe("constant", window, constant=constant)
    rows = _checkpoint_rows(graph, window)
    if rows is not None and checkpoint_read(graph, window.base.id) is not None:
        return _Recipe("checkpoint read", window, rows=rows)
    labels = ", ".join(op.label for op in ops[:4]) + (" ..." if len(ops) > 4 else "")
    return f"its base's value is not one random fill, constant or checkpoint read of the whole storage (ops: {labels})"


def _slice_bytes(info: TensorInfo) -> int:
    return _numel(info.shape) * info.dtype.itemsize


def slice_plan(tensor: torch.Tensor, *, device: DeviceMap = None, rng: RngMode = "eager") -> SlicePlan:
    """Whether `materialize_tensor(tensor, device=device, rng=rng)` would make only `tensor`'s own
    elements, and how many bytes it allocates either way (for previews). A real tensor: sliced is
    False, nbytes 0."""
    handle = handle_of(tensor)
    if handle is None:
        return SlicePlan(False, 0, None, "")
    graph, tid = handle.graph, handle.tensor_id
    info = graph.tensors[tid]
    whole = graph.storages[info.storage].nbytes
    if _base_alive(graph, tid, route_devices(device, rng)):
        return SlicePlan(False, 0, None, "")  # a view of memory already made
    recipe = _recipe(graph, tid)
    if recipe is None:
        return SlicePlan(False, whole, None, "")
    if isinstance(recipe, str):
        return SlicePlan(False, whole, None, recipe)
    if route_devices(device, rng).target(info.device).type == "meta":
        return SlicePlan(False, 0, None, "")
    return SlicePlan(True, _slice_bytes(info), recipe.source, "")


def _base_alive(graph: InitGraph, tid: TensorId, routing: DeviceRouting) -> bool:
    anchors = ReplayState.of(graph).anchors.get(routing.key)
    return anchors is not None and graph.tensors[tid].storage in anchors


def made_alone(graph: InitGraph, tid: TensorId, routing: DeviceRouting) -> torch.Tensor | None:
    """The view `tid` as `materialize_slice` made it alone under `routing`, while it lives: another
    name for the same fake must get that same object (materialize_tensor's memo)."""
    memo = ReplayState.of(graph).slices.get(routing.key)
    return None if memo is None else memo.get(tid)


def materialize_slice(
    tensor: torch.Tensor, device: DeviceMap, rng: RngMode, name: str = "<tensor>"
) -> torch.Tensor | None:
    """The view `tensor` made alone, when `slice_plan` says it can be; None: use the ordinary path
    (after a WholeBaseWarning when that path makes a larger base). Memoized per view and routing."""
    handle = handle_of(tensor)
    if handle is None:
        return None
    check_materializable(tensor, name)
    graph, tid = handle.graph, handle.tensor_id
    routing = route_devices(device, rng)
    state = ReplayState.of(graph)
    with state.lock:
        if _base_alive(graph, tid, routing):
            return None
        info = graph.tensors[tid]
        target = routing.target(info.device)
        recipe = _recipe(graph, tid)
        if recipe is None or target.type == "meta":
            return None
        if isinstance(recipe, str):
            if not _slice_bytes(info):
                return None  # an empty view: nothing asked, nothing to warn about
            if name == "<tensor>":
                name = _view_name(graph, tensor)
            warnings.warn(
                WholeBaseWarning(
                    f"materializing {name} ({_slice_bytes(info):,} bytes) makes its whole base "
                    f"({graph.storages[info.storage].nbytes:,} bytes): {recipe}"
                ),
                stacklevel=3,
            )
            return None
        memo = state.slices.setdefault(routing.key, weakref.WeakValueDictionary())
        known = memo.get(tid)
        if known is not None:
            return known
        with outside_recording():
            real = _with_recorded_strides(_made(graph, recipe, info, rng).to(target), info)
        result = as_recorded_kind(real, tensor)
        memo[tid] = result
        remember_origins(graph, [tid], [result])  # so inspect tells it from an eager tensor
        return result


def _with_recorded_strides(real: torch.Tensor, info: TensorInfo) -> torch.Tensor:
    """`real` (contiguous) with eager's strides: a view made alone differs from its recorded layout
    only in the strides of dimensions of size 1, which address nothing and so fit any storage."""
    if tuple(real.stride()) == tuple(info.stride) or real.numel() == 0:
        return real
    if any(size != 1 and real.stride(dim) != info.stride[dim] for dim, size in enumerate(info.shape)):
        return real
    return real.as_strided(info.shape, info.stride)


def _view_name(graph: InitGraph, view: torch.Tensor) -> str:
    """`a [2, 4] view of parameter 'layers.0.w'`: the view's shape and the first parameter or buffer
    of the module `graph` built that shares its storage (`<tensor>` when the module is gone)."""
    storage = torch.Tensor.untyped_storage(view)._cdata
    for kind, owner, candidate in named_tensors_of(graph):
        if torch.Tensor.untyped_storage(candidate)._cdata == storage:
            return f"a {list(view.shape)} view of {kind} {owner!r}"
    return "<tensor>"


def _made(graph: InitGraph, recipe: _Recipe, info: TensorInfo, rng: RngMode) -> torch.Tensor:
    # Each source's fields are set, and were checked to work, by _recipe.
    window = recipe.window
    if recipe.source == "constant":
        return torch.full(info.shape, cast(int | float | bool, recipe.constant), dtype=info.dtype)
    if recipe.source == "checkpoint read":
        start, stop = cast(tuple[int, int], recipe.rows)
        return cast(torch.Tensor, checkpoint_rows(graph, window.base.id, start, stop)).reshape(info.shape)
    fill = cast(OpNode, recipe.fill)
    layout = cast(FillLayout, fill_layout(cast(Family, family_of(graph, fill)), info.dtype, _numel(window.base.shape)))
    state = fill_start_state(graph, fill, rng)
    flat = draw_range(
        RecordedFill(fill.func, fill.args[1:], dict(fill.kwargs)),
        layout,
        state,
        window.first,
        window.first + window.count,
        info.dtype,
    )
    return flat.view(info.shape)
