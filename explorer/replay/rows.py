"""Drawing only some rows of a random tensor, with the values the whole tensor would have.

A rank of a sharded materialization needs its slice of each parameter, not the whole. When the
final value of a tensor is one in-place random fill of its whole storage (what `nn.init` leaves:
Hugging Face's `normal_` after the dead `kaiming_uniform_`), the draws map to elements in order on
the CPU generator, so rows [start, stop) can be drawn alone from a generator jumped to their first
draw:

- `uniform_` (and `random_`, `bernoulli_(p)`...): element i uses draws [k*i, k*i + k), k = 1 or 2;
- `normal_` (float32/float64, contiguous, >= 16 elements): all n uniforms are drawn first, then
  turned into normals in blocks of 16 (each block only reads its own 16 uniforms); when n is not a
  multiple of 16, the last 16 elements are recomputed from 16 uniforms drawn after the n. So a
  16-aligned run of blocks is a `normal_` of its own from the jumped state, and the tail is a
  16-element `normal_` from the state after n uniforms.

Note: [normal_fill block layout] mirrors `normal_fill` / `normal_fill_AVX2` in
aten/src/ATen/native/cpu/DistributionTemplates.h; re-check on PyTorch upgrades
(tests/explorer/replay/test_rows.py compares every case with the whole tensor's rows).
Anything else (other ops after the fill, views of a larger storage, a GPU target, half-precision
`normal_`, whose kernel pads differently) returns None: the caller materializes the whole tensor.
"""

from __future__ import annotations

import torch

from ..graph import InitGraph, OpNode, TensorId, accepts_generator, is_inplace_random
from ..record.checkpoint_formats import READ_TORCH, read_torch
from ..record.checkpoint_reads import READ_SAFETENSORS, original_safe_open
from ..record.fake import handle_of
from ..record.scope import outside_recording
from .draws import calibrated_formula, draw_count, family_of, is_contiguous
from .materialize import check_materializable
from .mt19937 import jump_state
from .replay import Replay, ReplayState
from .rng import RngMode, RngSession
from .routing import route_devices

_BLOCK = 16


def drawable_fill(graph: InitGraph, tid: TensorId) -> OpNode | None:
    """The one in-place CPU random op that gives tensor `tid` its final value, when nothing else
    (but the op creating its storage) is needed to replay it; else None."""
    info = graph.tensors[tid]
    storage = graph.storages[info.storage]
    numel = 1
    for size in info.shape:
        numel *= size
    if info.storage_offset != 0 or storage.nbytes != numel * info.dtype.itemsize or info.device.type != "cpu":
        return None
    needed = [i for i in graph.closure_of([tid], skip_dead_writes=True) if not graph.ops[i].aliases_only]
    if len(needed) != 2 or needed[0] != storage.creator:
        return None  # (views and detach, e.g. nn.Parameter's, only alias the filled storage)
    fill = graph.ops[needed[1]]
    if fill.stream is None or fill.stream[0] != "cpu" or fill.inference:
        return None
    if not (is_inplace_random(fill.func) and accepts_generator(fill.func)) or graph.tensors[fill.inputs[0]].storage != info.storage:
        return None
    if set(fill.inputs) - {fill.inputs[0]} or draw_count(graph, fill) is None:
        return None  # reads other tensors (bernoulli_ with a tensor p), or of unknown draw count
    return fill


def draw_rows(
    fake: torch.Tensor, start: int, stop: int, rng: RngMode = "eager", name: str = "<tensor>"
) -> torch.Tensor | None:
    """Rows [start, stop) along dim 0 of deferred tensor `fake`, on the CPU, equal to those rows of
    `materialize_tensor(fake, rng=rng)`; None when its values cannot be drawn by rows (see above).
    The default generators are left as they were. Raises MaterializationError (naming `name`) for
    a fake that `materialize_tensor` would refuse, e.g. one changed in place after deferred_init."""
    handle = handle_of(fake)
    if handle is None or fake.dim() == 0 or not 0 <= start <= stop <= fake.shape[0]:
        return None
    check_materializable(fake, name)
    graph, tid = handle.graph, handle.tensor_id
    read = checkpoint_rows(graph, tid, start, stop)
    if read is not None:
        return read
    fill = drawable_fill(graph, tid)
    if fill is None:
        return None
    info = graph.tensors[tid]
    if not is_contiguous(info):
        return None
    numel = fake.numel()
    row = numel // fake.shape[0] if fake.shape[0] else 0
    family = family_of(graph, fill)
    per_element = None
    if family.name == "normal":
        if info.dtype not in (torch.float32, torch.float64):
            return None
    else:
        formula = calibrated_formula(family, info.dtype)
        per_element = formula(1, info.dtype)
        if formula(1000, info.dtype) != 1000 * per_element:
            return None  # not element by element (MKL's bernoulli_ seeds a stream with one draw)
    with ReplayState.of(graph).lock, outside_recording():
        state = _state_before(graph, fill, rng)
        out = torch.empty((stop - start, *fake.shape[1:]), dtype=info.dtype)
        flat = out.view(-1)
        first, last = start * row, stop * row
        args, kwargs = fill.args[1:], dict(fill.kwargs)
        if per_element is not None:
            _fill(fill, flat, jump_state(state, first * per_element), args, kwargs)
        else:
            _normal_range(fill, flat, state, first, last, numel, args, kwargs)
    return out


# A value read from a checkpoint, then at most converted: a rank reads only its rows of the file.
_CONVERSIONS = frozenset({torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default})


def checkpoint_rows(graph: InitGraph, tid: TensorId, start: int, stop: int) -> torch.Tensor | None:
    """Rows [start, stop) of tensor `tid` when its value is one checkpoint read of the same shape,
    at most converted to another dtype (`from_pretrained`'s `.to(dtype)`, `load_checkpoint`'s
    `copy_`): read from the file alone (safetensors slices and memory-mapped torch.save files read
    only those bytes). None otherwise; the caller then materializes the whole tensor."""
    info = graph.tensors[tid]
    needed = [graph.ops[i] for i in graph.closure_of([tid], skip_dead_writes=True) if not graph.ops[i].aliases_only]
    reads = [op for op in needed if op.func in (READ_SAFETENSORS, READ_TORCH)]
    rest = [op for op in needed if op not in reads and op.index != graph.storages[info.storage].creator]
    if len(reads) != 1 or any(op.func not in _CONVERSIONS for op in rest) or info.device.type != "cpu":
        return None
    read = reads[0]
    path, key, shape, dtype = read.args[:4]
    if list(shape) != list(info.shape) or info.storage_offset != 0 or not is_contiguous(info):
        return None
    with outside_recording():
        if read.func is READ_SAFETENSORS:
            with original_safe_open()(path, framework="pt") as handle:
                rows = handle.get_slice(key)[start:stop]
        else:
            rows = read_torch(path, key, list(shape), dtype)[start:stop].clone()
        return rows.to(info.dtype)


def _state_before(graph: InitGraph, fill: OpNode, rng: RngMode) -> torch.Tensor:
    """The CPU generator state the fill starts from, as whole-tensor replay would give it."""
    key, position = fill.stream
    state = ReplayState.of(graph)
    replay = Replay(graph, route_devices(None, rng), remember=False)
    with RngSession(state.streams, rng, replay.run_scratch) as session:
        if rng == "fast" and fill.stream not in session.eager_anyway:
            generator = torch.Generator()
            generator.manual_seed(state.streams.fast_seed(key, position))
            return generator.get_state()
        return session.state_before(key, position)


def _fill(fill: OpNode, target: torch.Tensor, state: torch.Tensor, args: tuple, kwargs: dict) -> None:
    if target.numel() == 0:
        return
    generator = torch.Generator()
    generator.set_state(state)
    with torch.no_grad():
        fill.func(target, *args, **{**kwargs, "generator": generator})


def _normal_range(fill: OpNode, flat: torch.Tensor, state: torch.Tensor, first: int, last: int, numel: int,
                  args: tuple, kwargs: dict) -> None:
    """Elements [first, last) of a `normal_` over `numel` elements, into `flat`."""
    draws_per_uniform = 2 if flat.dtype == torch.float64 else 1
    blocks_end = numel - numel % _BLOCK  # elements past this come from the recomputed tail
    tail_start = numel - _BLOCK if numel % _BLOCK else numel
    lo, hi = first - first % _BLOCK, min(-(-last // _BLOCK) * _BLOCK, blocks_end)
    if lo < hi:
        blocks = torch.empty(hi - lo, dtype=flat.dtype)
        _fill(fill, blocks, jump_state(state, lo * draws_per_uniform), args, kwargs)
        keep_to = min(last, hi, tail_start)
        if keep_to > first:
            flat[: keep_to - first] = blocks[first - lo: keep_to - lo]
    if last > tail_start:
        tail = torch.empty(_BLOCK, dtype=flat.dtype)
        _fill(fill, tail, jump_state(state, numel * draws_per_uniform), args, kwargs)
        begin = max(first, tail_start)
        flat[begin - first: last - first] = tail[begin - tail_start: last - tail_start]
