"""Drawing only some rows of a deferred tensor, with the values the whole tensor would have.

A rank of a sharded materialization needs its slice of each parameter, not the whole. When the
tensor's final value is made by position (`positional.py`: one in-place random fill of its whole
storage, or a constant, then pointwise in-place ops such as timm's `trunc_normal_`), rows
[start, stop) are made alone:
- on the CPU generator, the draws map to elements in order, so the rows are drawn from a generator
  jumped to their first draw: which draws give which elements is `fill_layout.py` (note
  [normal_fill block layout]): element by element for `uniform_`, `random_`, `bernoulli_(p)`...;
  blocks of 16 and a recomputed tail for `normal_`;
- on a CUDA generator, each element's value is fixed by its thread and round in the kernel's
  launch, so the rows are drawn by launches placed where the whole launch had them
  (`philox_rows.py`, note [Philox element mapping]), with fewer than one round of extra elements;
- the pointwise ops then run on the rows alone, each once its probe passed (`pointwise.py`).
A value read from a checkpoint is read for those rows only. Anything else (other ops, views of a
larger storage, `normal_` below 16 elements on the CPU, a kernel whose draws are not positional or
not modelled, a non-contiguous tensor, a CUDA device absent here) returns None: the caller
materializes the whole tensor.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple, cast

import torch

from .._torch_compat.generators import cuda_state
from ..graph import InitGraph, OpNode, TensorId, TensorInfo, TensorRef
from ..hub_fetch import read_remote_rows, remote_file
from ..record.checkpoint_formats import READ_TORCH, torch_file_tensor
from ..record.checkpoint_reads import READ_SAFETENSORS, original_safe_open
from ..record.fake import handle_of
from ..record.scope import outside_recording
from .draws import Family, argument_value, family_of, is_contiguous
from .fill_layout import RecordedFill, draw_range, fill_layout
from .philox import DeviceProperties, device_properties, kernel_of
from .philox_rows import Draw, cuda_draw, draw_elements, row_launches
from .pointwise import apply_tail
from .positional import PositionalValue, positional_value
from .preflight import check_materializable, refuse_changed_files
from .replay import Replay, ReplayState
from .rng import RngMode, RngSession
from .routing import DeviceMap, DeviceRouting, route_devices


def draw_rows(
    fake: torch.Tensor,
    start: int,
    stop: int,
    rng: RngMode = "eager",
    name: str = "<tensor>",
    device: DeviceMap = None,
) -> torch.Tensor | None:
    """Rows [start, stop) along dim 0 of deferred tensor `fake`, equal to those rows of
    `materialize_tensor(fake, device=device, rng=rng)` and on its target device; None when its
    values cannot be drawn by rows (see above). The default generators are left as they were.
    Raises MaterializationError (naming `name`) for a fake that `materialize_tensor` would refuse,
    e.g. one changed in place after deferred_init, or for an absent `device`."""
    if handle_of(fake) is None:
        return None
    handle = check_materializable(fake, name)
    if handle is None or fake.dim() == 0 or not 0 <= start <= stop <= fake.shape[0]:
        return None
    graph, tid = handle.graph, handle.tensor_id
    routing = route_devices(device, rng)
    target = routing.target(graph.tensors[tid].device)
    read = checkpoint_rows(graph, tid, start, stop, name)
    if read is not None:
        return read.to(target)
    info = graph.tensors[tid]
    value = positional_value(graph, info)
    if isinstance(value, str):
        return None
    row = fake.numel() // fake.shape[0] if fake.shape[0] else 0
    elements = made_by_position(graph, value, info, rng, routing, start * row, stop * row)
    return None if elements is None else elements.view(stop - start, *fake.shape[1:]).to(target)


RowsSource = Literal["checkpoint read", "random fill", "constant"]


class RowsPlan(NamedTuple):
    """What `draw_rows` makes a tensor's rows from (`source`), or None and the `reason` the whole
    tensor is made instead."""

    source: RowsSource | None
    reason: str


def rows_plan(graph: InitGraph, tid: TensorId) -> RowsPlan:
    """`RowsPlan` of tensor `tid`, read off the graph alone. A device can still send a "random fill"
    whole when it runs: a CUDA kernel outside the element mapping, a pointwise op that fails its
    probe there (see above)."""
    info = graph.tensors[tid]
    if not info.shape:
        return RowsPlan(None, "a 0-d tensor has no rows")
    if checkpoint_read(graph, tid) is not None:
        return RowsPlan("checkpoint read", "")
    value = positional_value(graph, info)
    return RowsPlan(None, value) if isinstance(value, str) else RowsPlan(value.kind, "")


def made_by_position(
    graph: InitGraph,
    value: PositionalValue,
    base: TensorInfo,
    rng: RngMode,
    routing: DeviceRouting,
    first: int,
    stop: int,
) -> torch.Tensor | None:
    """Elements [first, stop) of `base`'s final `value` made alone, as a 1-D tensor on the device
    whole replay runs `base`'s ops on (`routing.exec_device`); None when that device cannot place
    the fill's draws, or a pointwise op of the tail fails its probe (`pointwise.py`)."""
    runs_on = routing.exec_device(base.device)
    numel = math.prod(base.shape)
    if value.kind == "constant":
        elements: torch.Tensor | None = torch.full(
            (stop - first,), cast(int | float | bool, value.constant), dtype=base.dtype, device=runs_on
        )
    else:
        fill, key = value.source, cast(tuple, value.source.stream)[0]
        if runs_on.type == "cpu" and key == "cpu":
            elements = _cpu_rows(graph, fill, base.dtype, numel, rng, first, stop)
        elif runs_on.type == "cuda" and (str(runs_on) == key or _seeded_where_it_goes(graph, fill, rng)):
            elements = _cuda_rows_here(graph, fill, base.dtype, numel, rng, runs_on, first, stop)
        else:
            return None
    if elements is None:
        return None
    with outside_recording():
        return apply_tail(value.tail, elements, first)


def _seeded_where_it_goes(graph: InitGraph, fill: OpNode, rng: RngMode) -> bool:
    """Whether whole replay runs recorded `fill` on its exec device's own generator from a fresh
    seed: rng="fast" seeds that generator per op (`RngSession.before_random_op`), so a CPU-recorded
    fill sent to CUDA starts at offset 0 of its seed there, unless shapes were computed from its
    values (then it draws eager's numbers, on the CPU)."""
    return rng == "fast" and fill.index not in graph.value_feeding_random_ops()


def _cpu_rows(
    graph: InitGraph, fill: OpNode, dtype: torch.dtype, numel: int, rng: RngMode, first: int, stop: int
) -> torch.Tensor | None:
    """Elements [first, stop) of a CPU fill, drawn from the CPU generator jumped to their first draw."""
    family = cast(Family, family_of(graph, fill))  # known: positional_value counted its draws
    layout = fill_layout(family, dtype, numel)
    if layout is None:
        return None  # not element by element (MKL's bernoulli_ seeds a stream with one draw)
    with ReplayState.of(graph).lock, outside_recording():
        state = fill_start_state(graph, fill, rng)
        return draw_range(_recorded(fill), layout, state, first, stop, dtype)


def _cuda_rows_here(
    graph: InitGraph,
    fill: OpNode,
    dtype: torch.dtype,
    numel: int,
    rng: RngMode,
    runs_on: torch.device,
    first: int,
    stop: int,
) -> torch.Tensor | None:
    """Elements [first, stop) of a CUDA fill, drawn on `runs_on` (where whole-tensor replay runs it)."""
    properties = device_properties(str(runs_on))
    if properties is None:
        return None
    with ReplayState.of(graph).lock, outside_recording():
        state = fill_start_state(graph, fill, rng, cuda=True)
        draw = cuda_draw(_recorded(fill), dtype, runs_on)
        return cuda_rows(graph, fill, dtype, numel, properties, state, first, stop, draw)


def cuda_rows(
    graph: InitGraph,
    fill: OpNode,
    dtype: torch.dtype,
    numel: int,
    properties: DeviceProperties,
    state: torch.Tensor,
    first: int,
    stop: int,
    draw: Draw,
) -> torch.Tensor | None:
    """Elements [first, stop) of recorded CUDA `fill` over `numel` contiguous elements of `dtype`,
    on a device of `properties`, the fill starting from generator `state`, each launch run by
    `draw`; None when the fill's kernel is not mapped (note [Philox element mapping])."""
    arguments = {name: value for name in ("from", "to") if (value := argument_value(fill, name)) is not None}
    kernel = kernel_of(fill.func, dtype, arguments)
    if kernel is None or kernel.rule != "grid_stride":
        return None
    launches = row_launches(numel, dtype.itemsize, kernel.unroll, properties, first, stop)
    if not launches:
        return torch.empty(0, dtype=dtype)
    return draw_elements(draw, launches, state, first, stop)


def _recorded(fill: OpNode) -> RecordedFill:
    return RecordedFill(fill.func, fill.args[1:], dict(fill.kwargs))


# A value read from a checkpoint, then at most converted: a rank reads only its rows of the file.
_TO_COPY, _COPY = torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default


class CheckpointRead(NamedTuple):
    """A tensor's value as one checkpoint read, then converted to each of `conversions` in turn
    (`from_pretrained(dtype=...)`'s `.to`, `load_checkpoint`'s `copy_` into the parameter)."""

    read: OpNode
    conversions: tuple[torch.dtype, ...]


def checkpoint_read(graph: InitGraph, tid: TensorId) -> CheckpointRead | None:
    """How tensor `tid`, the whole of its contiguous CPU storage, got its value when that is one
    checkpoint read of its shape, then whole-tensor conversions of that value alone; else None.

    Each conversion must take the previous value whole, in its layout (not a transpose, not a row)
    and write the next whole: a row copied over another, a real tensor copied in, or a
    transposed read give other values than the file's rows converted (so they are made whole)."""
    info = graph.tensors[tid]
    if info.device.type != "cpu" or info.storage_offset != 0 or not is_contiguous(info):
        return None
    needed = [graph.ops[i] for i in graph.closure_of([tid], skip_dead_writes=True) if not graph.ops[i].aliases_only]
    reads = [op for op in needed if op.func in (READ_SAFETENSORS, READ_TORCH)]
    if len(reads) != 1 or list(reads[0].args[2]) != list(info.shape) or len(reads[0].output_ids) != 1:
        return None
    creator = graph.storages[info.storage].creator
    current = reads[0].output_ids[0]
    conversions: list[torch.dtype] = []
    for op in needed:
        if op is reads[0] or (op.index == creator and op.index < reads[0].index):
            continue  # the read, or the parameter a later copy_ fills whole
        source, written = _conversion(op)
        if source is None or not _same_whole(graph, source, current) or not _whole(graph, written):
            return None
        current = written
        conversions.append(graph.tensors[current].dtype)
    return CheckpointRead(reads[0], tuple(conversions)) if graph.tensors[current].storage == info.storage else None


def _conversion(op: OpNode) -> tuple[TensorId | None, TensorId]:
    """(the tensor a conversion op reads, the tensor it makes or writes); (None, -1) for other ops."""
    if op.func is _TO_COPY and isinstance(op.args[0], TensorRef) and len(op.output_ids) == 1:
        return op.args[0].id, op.output_ids[0]
    if (
        op.func is _COPY
        and len(op.args) >= 2
        and isinstance(op.args[0], TensorRef)
        and isinstance(op.args[1], TensorRef)
    ):
        return op.args[1].id, op.args[0].id
    return None, -1


def _whole(graph: InitGraph, tid: TensorId) -> bool:
    info = graph.tensors[tid]
    return info.storage_offset == 0 and is_contiguous(info) and info.device.type == "cpu"


def _same_whole(graph: InitGraph, first: TensorId, second: TensorId) -> bool:
    """Whether two tensors are one value: the same storage, layout and dtype, each the whole of it."""
    a, b = graph.tensors[first], graph.tensors[second]
    same = (a.storage, a.shape, a.stride, a.storage_offset, a.dtype) == (
        b.storage,
        b.shape,
        b.stride,
        b.storage_offset,
        b.dtype,
    )
    return same and _whole(graph, first)


def checkpoint_rows(
    graph: InitGraph, tid: TensorId, start: int, stop: int, name: str | None = None
) -> torch.Tensor | None:
    """Rows [start, stop) of tensor `tid` when its value is one checkpoint read (`checkpoint_read`):
    read from the file alone (safetensors slices and memory-mapped torch.save files read only those
    bytes), then converted as the whole was. None otherwise; the caller then materializes the whole
    tensor. A file changed since it was recorded is refused, naming `name`, as a whole replay
    refuses it (note [A checkpoint changed since recording])."""
    found = checkpoint_read(graph, tid)
    if found is None:
        return None
    read = found.read
    refuse_changed_files(graph, [read.index], [tid], {tid: name} if name else {})
    path, key, shape, dtype = read.args[:4]
    with outside_recording():
        remote = remote_file(path) if read.func is READ_SAFETENSORS else None
        if remote is not None:
            rows = read_remote_rows(path, remote, key, list(shape), dtype, start, stop)
        elif read.func is READ_SAFETENSORS:
            with original_safe_open()(path, framework="pt") as handle:
                rows = handle.get_slice(key)[start:stop]
        else:
            rows = torch_file_tensor(path, key, list(shape), dtype)[start:stop].clone()
        rows = rows.to(graph.tensors[read.output_ids[0]].dtype)
        for conversion in found.conversions:
            rows = rows.to(conversion)
        return rows


def fill_start_state(graph: InitGraph, fill: OpNode, rng: RngMode, *, cuda: bool = False) -> torch.Tensor:
    """The generator state random op `fill` starts from, as whole-tensor replay would give it
    (eager's state, or its rng="fast" seed: on a CUDA generator when `cuda`, else the CPU's); the
    default generators are left as they were. Call with the graph's ReplayState lock held and
    outside recording."""
    key, position = cast(tuple[str, int], fill.stream)  # a random op has a stream
    state = ReplayState.of(graph)
    replay = Replay(graph, route_devices(None, rng), remember=False)
    with RngSession(state.streams, rng, replay.run_scratch) as session:
        if rng == "fast" and fill.stream not in session.eager_anyway:
            seed = state.streams.fast_seed(key, position)
            if cuda:
                return cuda_state(seed, 0)  # what manual_seed leaves on a CUDA generator
            generator = torch.Generator()
            generator.manual_seed(seed)
            return generator.get_state()
        return session.state_before(key, position)
