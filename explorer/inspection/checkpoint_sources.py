"""Which recorded checkpoint reads each storage's value comes from: the "disk" state's facts.

A tensor read from a safetensors file under deferred init is a fake made by the recorded op
`explorer::read_safetensors(path, key, shape, dtype)` (record/checkpoint_reads.py); what the loader
then does with it (`_to_copy`, `copy_` into a parameter, `.data = x`) is recorded like any op.

Note: [Checkpoint sources flow forward]
One pass over the ops, in order, carries for every storage the set of read ops its current contents
come from: an op's sources are those of the storages it reads (`OpNode.reads`) plus itself when it
is a read; a storage it creates takes them, a storage it writes adds them, or takes only them when
the op overwrites every element without reading them (`OpNode.overwrites`: `copy_`, `normal_`, ...).
That is the value flow of `closure_of(..., skip_dead_writes=True)` restricted to read ops, for the
whole graph at the cost of one closure, rather than one closure per tensor (a 70B model has
thousands). It differs from the closure only where a closure keeps an op for its tensor object and
not its values (a storage's creator, an alias's producer): bytes that replay reads but that the
tensor's value never shows.

The rule for the state (`census.DISK`): a fake tensor is "disk" when any read op feeds its storage's
final contents, even if an initializer also wrote part of it (a checkpoint read, then a slice
re-initialized): materializing it reads the file, which is what the state warns of. A fake whose
storage no read feeds stays "fake" (made by initializers alone).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..checkpoint_headers import safetensors_offsets
from ..errors import CheckpointError
from ..graph import InitGraph, OpIndex, OpNode, StorageId
from ..hub_fetch import remote_file
from ..naming import dtype_name
from ..record.checkpoint_formats import key_path

READ_SAFETENSORS = "explorer.read_safetensors.default"  # `OpNode.label` of a recorded checkpoint read
# Every recorded checkpoint read: safetensors, torch.save files, DCP directories (record/checkpoint_formats.py).
CHECKPOINT_READS = frozenset({READ_SAFETENSORS, "explorer.read_torch.default", "explorer.read_dcp.default"})
_NONE: frozenset[OpIndex] = frozenset()


def is_checkpoint_read(op: OpNode) -> bool:
    """Whether `op` is a recorded checkpoint read (safetensors, torch.save or DCP)."""
    return op.label in CHECKPOINT_READS


@dataclass(frozen=True, slots=True)
class CheckpointRead:
    """One recorded read: tensor `key` of safetensors file `path`, as its header said when recorded."""

    graph: int  # index into Census.graphs
    op: OpIndex
    path: str  # absolute, as recorded
    key: str
    shape: tuple[int, ...]
    dtype: str  # on disk, as `naming.dtype_name` spells it
    nbytes: int  # bytes materializing it reads
    offset: int | None  # where its data starts in the file; None when the header cannot be read now

    @property
    def file(self) -> str:
        """The file's name, as tables and labels show it (`file_label`)."""
        return file_label(self.path)


def file_label(path: str) -> str:
    """A checkpoint file's name, as tables and diagrams show it; for a Hub shard's header stub
    (hub_fetch.py), where its bytes come from: `org/name@commit12/file`."""
    remote = remote_file(path)
    return remote.label() if remote is not None else os.path.basename(path)


def read_of(op: OpNode) -> tuple[str, str, tuple[int, ...], torch.dtype]:
    """`(path, key, shape, dtype)` of a checkpoint read op, from its recorded arguments (a torch.save
    read's key path, JSON-encoded, shown as its last key)."""
    path, key, shape, dtype = op.args[:4]
    if op.label == "explorer.read_torch.default":
        key = str(key_path(key)[-1])
    return path, key, tuple(shape), dtype


def storage_sources(graph: InitGraph) -> dict[StorageId, frozenset[OpIndex]]:
    """For every storage of `graph`, the read ops its final contents come from (see the note)."""
    tensors = graph.tensors
    sources: dict[StorageId, frozenset[OpIndex]] = {}
    for op in graph.ops:
        flowing = _NONE
        for tid in op.reads:
            came = sources.get(tensors[tid].storage, _NONE)
            if came:
                flowing = flowing | came
        if op.label in CHECKPOINT_READS:
            flowing = flowing | {op.index}
        for sid in op.creates:
            sources[sid] = flowing
        for sid in op.writes:
            sources[sid] = flowing if op.overwrites else sources.get(sid, _NONE) | flowing
    return sources


class CheckpointReads:
    """The `CheckpointRead` of read ops, each file's header read once (offsets) per inspection."""

    def __init__(self, graphs: list[InitGraph]) -> None:
        self.graphs = graphs
        self._offsets: dict[str, dict[str, int]] = {}
        self._reads: dict[tuple[int, OpIndex], CheckpointRead] = {}

    def __getitem__(self, where: tuple[int, OpIndex]) -> CheckpointRead:
        read = self._reads.get(where)
        if read is None:
            graph, index = where
            path, key, shape, dtype = read_of(self.graphs[graph].ops[index])
            numel = 1
            for size in shape:
                numel *= size
            read = self._reads[where] = CheckpointRead(
                graph,
                index,
                path,
                key,
                shape,
                dtype_name(dtype),
                numel * dtype.itemsize,
                self._offsets_of(path).get(key),
            )
        return read

    def _offsets_of(self, path: str) -> dict[str, int]:
        if not path.endswith(".safetensors"):
            return {}  # torch.save files and DCP directories: no per-key byte offset in a header
        if path not in self._offsets:
            try:
                self._offsets[path] = safetensors_offsets(path)
            except (CheckpointError, OSError):  # moved or changed since: materializing will say so
                self._offsets[path] = {}
        return self._offsets[path]
