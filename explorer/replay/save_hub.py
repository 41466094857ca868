"""`save_checkpoint` of a tensor read from a Hub shard: streamed from the Hub into the file written.

A parameter `from_pretrained` opened from the Hub (record/hub_open.py) is, in the recording, one
`explorer::read_safetensors` of a header stub, then at most a dtype conversion (`_to_copy`) and
`detach`s. Its value is the stored bytes, converted element by element, so it needs no replay:
`save_checkpoint` streams those bytes from one `Range` request (hub_fetch.stream_range), converts
each piece of `CHUNK_BYTES` and writes it before the next comes. Memory holds a piece and its
conversion whatever the tensor's size, and the range cache is left alone: a 685 GB model is not
kept twice on disk. Any other recording (an in-place op after the load, a view, a computed value, a
local file, bytes already in the range cache) is materialized as before (`materialize_tensor`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..hub_fetch import RemoteFile, is_cached, remote_file, stream_range, tensor_span
from ..record.checkpoint_reads import READ_SAFETENSORS
from ..record.fake import handle_of

CHUNK_BYTES = 8 << 20  # a piece of a streamed tensor, in the stored dtype
_PASS_THROUGH = ("aten::detach", "aten::alias", "aten::lift_fresh")
_CAST = "aten::_to_copy"
_CAST_KWARGS = frozenset({"dtype", "device"})
_MAX_STEPS = 8  # ops between a read and the tensor saved, at most, for it to be streamed


@dataclass(frozen=True, slots=True)
class HubCopy:
    """A deferred tensor whose value is bytes [begin, end) of `remote`, stored as `stored`, cast to
    `dtype` (the tensor's own)."""

    remote: RemoteFile
    key: str
    begin: int
    end: int
    stored: torch.dtype
    dtype: torch.dtype

    def pieces(self, saved: torch.dtype) -> Iterator[torch.Tensor]:
        """The tensor's elements in order, in `saved`, a piece of at most `CHUNK_BYTES` stored bytes
        at a time (a whole number of elements: the conversion is elementwise, so the pieces are
        bitwise the whole tensor's)."""
        step = max(1, CHUNK_BYTES // self.stored.itemsize) * self.stored.itemsize
        for data in stream_range(self.remote, self.begin, self.end, repr(self.key), step):
            piece = torch.frombuffer(data, dtype=self.stored)
            yield piece.to(self.dtype).to(saved)


def hub_copy(tensor: torch.Tensor) -> HubCopy | None:
    """How to stream `tensor` from the Hub, when its recording is one read of a Hub shard whose
    bytes are not cached, then only `detach`, `alias` or a dtype conversion; else None."""
    handle = handle_of(tensor)
    if handle is None:
        return None
    graph = handle.graph
    info = graph.tensors[handle.tensor_id]
    producer = graph.ops[info.producer]
    for _ in range(_MAX_STEPS):  # first the producers alone: most tensors of most models are no read
        if producer.func is READ_SAFETENSORS or len(producer.inputs) != 1:
            break
        producer = graph.ops[graph.tensors[producer.inputs[0]].producer]
    if producer.func is not READ_SAFETENSORS or remote_file(producer.args[0]) is None:
        return None
    ops = [graph.ops[index] for index in graph.closure_of([handle.tensor_id])]
    if not ops or ops[0].func is not READ_SAFETENSORS or info.storage_offset != 0:
        return None
    current = ops[0].output_ids
    for op in ops[1:]:
        name = op.func._schema.name
        if name == _CAST and not set(op.kwargs) <= _CAST_KWARGS:
            return None
        if name not in (*_PASS_THROUGH, _CAST) or op.inputs != current or op.writes:
            return None
        current = op.output_ids
    path, key, shape, stored = ops[0].args[:4]
    remote = remote_file(path)
    if current != (handle.tensor_id,) or remote is None or list(shape) != list(info.shape):
        return None
    if info.stride != _contiguous(info.shape):
        return None
    begin, end = tensor_span(path, key, list(shape), stored)
    if is_cached(remote, begin, end):
        return None
    return HubCopy(remote, key, begin, end, stored, info.dtype)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
