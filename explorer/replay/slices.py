"""A slice of a deferred tensor at the cost of the slice.

`materialize_tensor(m.experts.gate_up_proj[3])` asks for one expert of a fused 3-D parameter; the
ordinary replay would produce the whole 30 GB base and hand out a view of it. When the base's value
is made by position, only the view's elements are made:

- one in-place CPU random fill of the whole storage (`nn.init.normal_`, `uniform_`...; earlier
  dead writes such as Hugging Face's first `kaiming_uniform_` are skipped, as in replay): the
  view's elements are drawn alone from the generator jumped to their first draw (`fill_layout.py`);
- a constant (`torch.ones`, `torch.full`, `zeros_`, `fill_`): the view is that constant;
- either of those followed by pointwise in-place ops (timm's `trunc_normal_`), applied to the
  view's elements alone (`positional.py`, `pointwise.py`);
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

from ..graph import InitGraph, OpNode, TensorId, TensorInfo
from ..record.fake import handle_of
from ..record.no_data import module_holds, named_tensors_of
from ..record.scope import outside_recording
from .draws import is_contiguous
from .pointwise import op_failing_probe
from .positional import PositionalValue, positional_value
from .preflight import check_materializable
from .provenance import remember_origins
from .real_memory import as_recorded_kind
from .replay import ReplayState
from .rng import RngMode
from .routing import DeviceMap, DeviceRouting, route_devices
from .rows import checkpoint_read, checkpoint_rows, made_by_position

SliceSource = Literal["random fill", "constant", "checkpoint read"]


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
    value: PositionalValue | None = None  # a random fill or constant (then pointwise ops)
    rows: tuple[int, int] | None = None  # a checkpoint read's rows


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
    value = positional_value(graph, window.base)
    if not isinstance(value, str):
        return _Recipe(value.kind, window, value=value)
    rows = _checkpoint_rows(graph, window)
    if rows is not None and checkpoint_read(graph, window.base.id) is not None:
        return _Recipe("checkpoint read", window, rows=rows)
    return f"its base is not made by position: {value}"


def _slice_bytes(info: TensorInfo) -> int:
    return _numel(info.shape) * info.dtype.itemsize


def slice_plan(tensor: torch.Tensor, *, device: DeviceMap = None, rng: RngMode = "eager") -> SlicePlan:
    """Whether `materialize_tensor(tensor, device=device, rng=rng)` would make only `tensor`'s own
    elements, and how many bytes it allocates either way (for previews). A real tensor: sliced is
    False, nbytes 0."""
    handle = check_materializable(tensor, "<tensor>") if handle_of(tensor) is not None else None
    if handle is None:
        return SlicePlan(False, 0, None, "")
    graph, tid = handle.graph, handle.tensor_id
    info = graph.tensors[tid]
    whole = graph.storages[info.storage].nbytes
    routing = route_devices(device, rng)
    if _base_alive(graph, tid, routing):
        return SlicePlan(False, 0, None, "")  # a view of memory already made
    recipe = _recipe(graph, tid)
    if recipe is None:
        return SlicePlan(False, whole, None, "")
    if isinstance(recipe, str):
        return SlicePlan(False, whole, None, recipe)
    if routing.target(info.device).type == "meta":
        return SlicePlan(False, 0, None, "")
    if _held_by_module(graph, tensor):
        return SlicePlan(False, whole, None, HELD_VIEW)
    failing = _op_failing_probe(recipe, routing)
    if failing is not None:
        return SlicePlan(False, whole, None, _rounds_by_position(failing, recipe, routing))
    return SlicePlan(True, _slice_bytes(info), recipe.source, "")


def _op_failing_probe(recipe: _Recipe, routing: DeviceRouting) -> OpNode | None:
    """The pointwise op of the recipe's tail whose kernel rounds some elements differently alone
    than in the whole tensor on the device replay runs it on (`pointwise.py`), if any."""
    if recipe.value is None or not recipe.value.tail:
        return None
    base = recipe.window.base
    return op_failing_probe(recipe.value.tail, base.dtype, routing.exec_device(base.device))


def _rounds_by_position(op: OpNode, recipe: _Recipe, routing: DeviceRouting) -> str:
    base = recipe.window.base
    return (
        f"its {op.label} rounds some {str(base.dtype).removeprefix('torch.')} elements differently alone than "
        f"in the whole tensor on {routing.exec_device(base.device)}, so the base is made whole, as eager made it"
    )


HELD_VIEW = "the module holds this view of its base, and shares the base's memory with it as eager does"


def _held_by_module(graph: InitGraph, tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a parameter or buffer of the module `graph` built: such a view keeps
    eager's aliasing (materialized with its base); views a user makes afterwards are made alone."""
    return module_holds(graph, tensor)


def _base_alive(graph: InitGraph, tid: TensorId, routing: DeviceRouting) -> bool:
    anchors = ReplayState.of(graph).anchors.get(ReplayState.of(graph).memo_key(routing))
    return anchors is not None and graph.tensors[tid].storage in anchors


def made_alone(graph: InitGraph, tid: TensorId, routing: DeviceRouting) -> torch.Tensor | None:
    """The view `tid` as `materialize_slice` made it alone under `routing`, while it lives: another
    name for the same fake must get that same object (materialize_tensor's memo)."""
    memo = ReplayState.of(graph).slices.get(ReplayState.of(graph).memo_key(routing))
    return None if memo is None else memo.get(tid)


def materialize_slice(
    tensor: torch.Tensor, device: DeviceMap, rng: RngMode, name: str = "<tensor>"
) -> torch.Tensor | None:
    """The view `tensor` made alone, when `slice_plan` says it can be; None: use the ordinary path
    (after a WholeBaseWarning when that path makes a larger base). Memoized per view and routing."""
    handle = check_materializable(tensor, name) if handle_of(tensor) is not None else None
    if handle is None:
        return None
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
            _warn_whole_base(graph, info, tensor, name, recipe)
            return None
        if _held_by_module(graph, tensor):
            return None  # made with its base, as the module's aliasing needs
        failing = _op_failing_probe(recipe, routing)
        if failing is not None:
            _warn_whole_base(graph, info, tensor, name, _rounds_by_position(failing, recipe, routing))
            return None
        memo = state.slices.setdefault(state.memo_key(routing), weakref.WeakValueDictionary())
        known = memo.get(tid)
        if known is not None:
            return known
        with outside_recording():
            made = _made(graph, recipe, info, rng, routing, name if name != "<tensor>" else _view_name(graph, tensor))
        if made is None:
            return None  # the device replay runs on cannot place the fill's draws: the ordinary path
        real = _with_recorded_strides(made.to(target), info)
        result = as_recorded_kind(real, tensor)
        memo[tid] = result
        remember_origins(graph, [tid], [result])  # so inspect tells it from an eager tensor
        return result


def _warn_whole_base(graph: InitGraph, info: TensorInfo, view: torch.Tensor, name: str, reason: str) -> None:
    """WholeBaseWarning that materializing `view` (recorded as `info`) makes its whole base, and why
    (none for an empty view)."""
    if not _slice_bytes(info):
        return  # an empty view: nothing asked, nothing to warn about
    if name == "<tensor>":
        name = _view_name(graph, view)
    warnings.warn(
        WholeBaseWarning(
            f"materializing {name} ({_slice_bytes(info):,} bytes) makes its whole base "
            f"({graph.storages[info.storage].nbytes:,} bytes): {reason}"
        ),
        stacklevel=4,
    )


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


def _made(
    graph: InitGraph, recipe: _Recipe, info: TensorInfo, rng: RngMode, routing: DeviceRouting, name: str
) -> torch.Tensor | None:
    """The view's elements, or None when the device cannot make them alone after all (a pointwise
    op that fails its probe there)."""
    window = recipe.window
    if recipe.source == "checkpoint read":
        start, stop = cast(tuple[int, int], recipe.rows)
        return cast(torch.Tensor, checkpoint_rows(graph, window.base.id, start, stop, name)).reshape(info.shape)
    value = cast(PositionalValue, recipe.value)  # set for the other sources by _recipe
    flat = made_by_position(graph, value, window.base, rng, routing, window.first, window.first + window.count)
    return None if flat is None else flat.view(info.shape)
