"""Drawing only some rows of a random tensor, with the values the whole tensor would have.

A rank of a sharded materialization needs its slice of each parameter, not the whole. When the
final value of a tensor is one in-place random fill of its whole storage (what `nn.init` leaves:
Hugging Face's `normal_` after the dead `kaiming_uniform_`), rows [start, stop) can be drawn alone:
- on the CPU generator, the draws map to elements in order, so the rows are drawn from a generator
  jumped to their first draw: which draws give which elements is `fill_layout.py` (note
  [normal_fill block layout]): element by element for `uniform_`, `random_`, `bernoulli_(p)`...;
  blocks of 16 and a recomputed tail for `normal_`;
- on a CUDA generator, each element's value is fixed by its thread and round in the kernel's
  launch, so the rows are drawn by launches placed where the whole launch had them
  (`philox_rows.py`, note [Philox element mapping]), with fewer than one round of extra elements.
Anything else (other ops after the fill, views of a larger storage, `normal_` below 16 elements on
the CPU, a kernel whose draws are not positional or not modelled, a non-contiguous CUDA tensor, a
CUDA device absent here) returns None: the caller materializes the whole tensor.
"""

from __future__ import annotations

from typing import cast

import torch

from .._torch_compat.generators import cuda_state
from ..graph import InitGraph, OpNode, TensorId, accepts_generator, is_inplace_random
from ..hub_fetch import read_remote_rows, remote_file
from ..record.checkpoint_formats import READ_TORCH, read_torch
from ..record.checkpoint_reads import READ_SAFETENSORS, original_safe_open
from ..record.fake import handle_of
from ..record.scope import outside_recording
from .draws import Family, argument_value, draw_count, family_of, is_contiguous
from .fill_layout import RecordedFill, draw_range, fill_layout
from .philox import DeviceProperties, device_properties, kernel_of
from .philox_rows import Draw, cuda_draw, draw_elements, row_launches
from .preflight import check_materializable
from .replay import Replay, ReplayState
from .rng import RngMode, RngSession
from .routing import DeviceLike, route_devices


def drawable_fill(graph: InitGraph, tid: TensorId) -> OpNode | None:
    """The one in-place random op that gives tensor `tid` its final value, drawn from the generator
    of the device `tid` was recorded on, when nothing else (but the op creating its storage) is
    needed to replay it; else None. Whether its draws can be placed by rows is the caller's
    question (`fill_layout` on the CPU, `kernel_of` on CUDA)."""
    info = graph.tensors[tid]
    storage = graph.storages[info.storage]
    numel = 1
    for size in info.shape:
        numel *= size
    if info.storage_offset != 0 or storage.nbytes != numel * info.dtype.itemsize or info.device.type not in _DRAWN_ON:
        return None
    needed = [i for i in graph.closure_of([tid], skip_dead_writes=True) if not graph.ops[i].aliases_only]
    if len(needed) != 2 or needed[0] != storage.creator:
        return None  # (views and detach, e.g. nn.Parameter's, only alias the filled storage)
    fill = graph.ops[needed[1]]
    if fill.stream is None or fill.stream[0] != str(info.device) or fill.inference:
        return None
    if (
        not (is_inplace_random(fill.func) and accepts_generator(fill.func))
        or graph.tensors[fill.inputs[0]].storage != info.storage
    ):
        return None
    if set(fill.inputs) - {fill.inputs[0]}:
        return None  # reads other tensors (bernoulli_ with a tensor p)
    if info.device.type == "cpu" and draw_count(graph, fill) is None:
        return None  # of unknown draw count
    return fill


_DRAWN_ON = frozenset({"cpu", "cuda"})


def draw_rows(
    fake: torch.Tensor,
    start: int,
    stop: int,
    rng: RngMode = "eager",
    name: str = "<tensor>",
    device: DeviceLike | None = None,
) -> torch.Tensor | None:
    """Rows [start, stop) along dim 0 of deferred tensor `fake`, equal to those rows of
    `materialize_tensor(fake, device=device, rng=rng)` and on its target device; None when its
    values cannot be drawn by rows (see above). The default generators are left as they were.
    Raises MaterializationError (naming `name`) for a fake that `materialize_tensor` would refuse,
    e.g. one changed in place after deferred_init, or for an absent `device`."""
    handle = handle_of(fake)
    if handle is None or fake.dim() == 0 or not 0 <= start <= stop <= fake.shape[0]:
        return None
    check_materializable(fake, name)
    graph, tid = handle.graph, handle.tensor_id
    routing = route_devices(device, rng)
    target = routing.target(graph.tensors[tid].device)
    read = checkpoint_rows(graph, tid, start, stop)
    if read is not None:
        return read.to(target)
    fill = drawable_fill(graph, tid)
    info = graph.tensors[tid]
    if fill is None or not is_contiguous(info):
        return None
    key = cast(str, cast(tuple, fill.stream)[0])
    runs_on = routing.exec_device(key)
    numel = fake.numel()
    row = numel // fake.shape[0] if fake.shape[0] else 0
    if runs_on.type == "cpu" and key == "cpu":
        rows = _cpu_rows(graph, fill, info.dtype, numel, rng, start * row, stop * row)
    elif runs_on.type == "cuda" and str(runs_on) == key:
        rows = _cuda_rows_here(graph, fill, info.dtype, numel, rng, runs_on, start * row, stop * row)
    else:
        return None
    return None if rows is None else rows.view(stop - start, *fake.shape[1:]).to(target)


def _cpu_rows(
    graph: InitGraph, fill: OpNode, dtype: torch.dtype, numel: int, rng: RngMode, first: int, stop: int
) -> torch.Tensor | None:
    """Elements [first, stop) of a CPU fill, drawn from the CPU generator jumped to their first draw."""
    family = cast(Family, family_of(graph, fill))  # known: drawable_fill counted its draws
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
_CONVERSIONS = frozenset({torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default})


def checkpoint_read(graph: InitGraph, tid: TensorId) -> OpNode | None:
    """The one checkpoint read giving tensor `tid` its value, of the same shape, at most converted
    to another dtype (`from_pretrained`'s `.to(dtype)`, `load_checkpoint`'s `copy_`), when `tid`
    is its whole contiguous CPU storage; else None."""
    info = graph.tensors[tid]
    needed = [graph.ops[i] for i in graph.closure_of([tid], skip_dead_writes=True) if not graph.ops[i].aliases_only]
    reads = [op for op in needed if op.func in (READ_SAFETENSORS, READ_TORCH)]
    rest = [op for op in needed if op not in reads and op.index != graph.storages[info.storage].creator]
    if len(reads) != 1 or any(op.func not in _CONVERSIONS for op in rest) or info.device.type != "cpu":
        return None
    shape = reads[0].args[2]
    if list(shape) != list(info.shape) or info.storage_offset != 0 or not is_contiguous(info):
        return None
    return reads[0]


def checkpoint_rows(graph: InitGraph, tid: TensorId, start: int, stop: int) -> torch.Tensor | None:
    """Rows [start, stop) of tensor `tid` when its value is one checkpoint read (`checkpoint_read`):
    read from the file alone (safetensors slices and memory-mapped torch.save files read only those
    bytes). None otherwise; the caller then materializes the whole tensor."""
    read = checkpoint_read(graph, tid)
    if read is None:
        return None
    path, key, shape, dtype = read.args[:4]
    with outside_recording():
        remote = remote_file(path) if read.func is READ_SAFETENSORS else None
        if remote is not None:
            rows = read_remote_rows(path, remote, key, list(shape), dtype, start, stop)
        elif read.func is READ_SAFETENSORS:
            with original_safe_open()(path, framework="pt") as handle:
                rows = handle.get_slice(key)[start:stop]
        else:
            rows = read_torch(path, key, list(shape), dtype)[start:stop].clone()
        return rows.to(graph.tensors[tid].dtype)


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
