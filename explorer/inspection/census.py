"""One read-only pass over a module: every parameter and buffer by name, with its provenance.

The four tables all read the `Census`, so each fact (which tensors are tied, which share a storage,
whether a real tensor came from materialization, which ops a tensor needs) is computed in one place.

Identity rules the census keeps:
- a *name* is one slot (`module._parameters[key]` or `module._buffers[key]`) reached by one module
  path; a shared submodule or a tied weight gives several names for one tensor object;
- a *storage* is one piece of memory, present or future: a deferred fake's recorded storage in its
  graph, or a real tensor's `StorageImpl` (`untyped_storage()._cdata`, not `data_ptr()`, which is 0
  for every meta or empty tensor and would merge unrelated ones). A materialized tensor joins the
  two: its memory is what the remaining fakes of that recorded storage will alias when they are
  materialized, so a half-materialized tied weight or view stays one storage. Storage ids are
  numbered 0, 1, ... in the order names first reach them;
- a fake is "disk" when a recorded checkpoint read feeds its value, else "fake" (made by
  initializers alone); see note [Checkpoint sources flow forward] in checkpoint_sources.py. It is
  "remote" instead when one of those reads is of a Hub shard (hub_fetch.py) whose bytes are not in
  the range cache yet: materializing it transfers them;
- a real tensor is "materialized" when `materialize_*` handed it out (it has an `Origin`), and
  "real" otherwise. It is joined to its recorded tensor (graph, tensor id, storage) only while its
  graph is reachable from the module's remaining fakes: a fully materialized module reaches none
  (its tensors keep their graph alive only for release_module), and what is shown must not depend
  on which graphs happen to be alive.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

from .._torch_compat.dispatch import metadata_access
from ..errors import DeferredInitError
from ..graph import InitGraph, OpIndex, TensorId
from ..hub_fetch import hub_range, is_cached
from ..naming import dtype_name
from ..record.fake import handle_of, is_fake
from ..replay.provenance import Origin, creation_sources, origin_of
from .checkpoint_sources import CheckpointRead, CheckpointReads, storage_sources

FAKE, DISK, REMOTE, MATERIALIZED, REAL = "fake", "disk", "remote", "materialized", "real"
# no memory yet: made by initializers / to be read from a checkpoint / to be fetched from the Hub first
DEFERRED_STATES = (FAKE, DISK, REMOTE)
PARAMETER, BUFFER, NON_PERSISTENT = "parameter", "buffer", "non-persistent buffer"


@dataclass(slots=True)
class NamedTensor:
    """One parameter or buffer slot of the module, with the facts every table needs about it."""

    name: str  # qualified name, e.g. "layers.0.attn.weight"
    module: str  # qualified name of the owning module ("" for the root)
    kind: str  # PARAMETER, BUFFER or NON_PERSISTENT
    tensor: torch.Tensor
    state: str  # FAKE, DISK, REMOTE, MATERIALIZED or REAL
    graph: int | None  # index into Census.graphs (fakes, and materialized tensors traced back)
    tensor_id: TensorId | None  # recorded id in that graph
    storage: int  # index into Census.storages
    numel: int
    origin: Origin | None = None  # how construction made it (fakes and materialized tensors)
    reads: tuple[CheckpointRead, ...] = ()  # checkpoint reads feeding its value, in recording order

    @property
    def recorded(self) -> tuple[int, TensorId] | None:
        """(graph index, tensor id) of a name traced to a recording, None for one that is not."""
        if self.graph is None or self.tensor_id is None:
            return None
        return (self.graph, self.tensor_id)

    @property
    def identity(self) -> tuple:
        """Which tensor this is, counting a materialized tensor and the fakes it will replace as one."""
        if self.graph is not None:
            return (self.graph, self.tensor_id)
        return (None, id(self.tensor))


@dataclass(slots=True)
class StorageRecord:
    """One piece of memory under one or more names."""

    id: int
    nbytes: int
    device: str
    dtype: str  # of the first name found on it
    state: str  # FAKE/DISK/REMOTE when every name on it is, else the first other name's state
    graph: int | None
    recorded_id: int | None  # the storage id in that graph
    names: list[int] = field(default_factory=list)  # indices into Census.tensors, module order


@dataclass
class Census:
    """Everything the tables read about one module, gathered without changing anything."""

    root: nn.Module
    modules: list[tuple[str, nn.Module]]  # every module path, pre-order (shared modules repeat)
    tensors: list[NamedTensor]
    storages: list[StorageRecord]
    graphs: list[InitGraph]
    closures: dict[tuple[int, TensorId], list[OpIndex]]  # (graph, tensor id) → ops it needs

    def names_by_tensor_id(self) -> dict[tuple[int, TensorId], str]:
        """The first name (module order) of every recorded tensor the module holds."""
        names: dict[tuple[int, TensorId], str] = {}
        for entry in self.tensors:
            if entry.recorded is not None:
                names.setdefault(entry.recorded, entry.name)
        return names


def _slots(root: nn.Module) -> tuple[list[tuple[str, nn.Module]], list[tuple[str, str, str, torch.Tensor]]]:
    modules = list(root.named_modules(remove_duplicate=False))
    slots: list[tuple[str, str, str, torch.Tensor]] = []
    for path, module in modules:
        prefix = f"{path}." if path else ""
        for key, tensor in module._parameters.items():
            if tensor is not None:
                slots.append((prefix + key, path, PARAMETER, tensor))
        non_persistent = module._non_persistent_buffers_set
        for key, tensor in module._buffers.items():
            if tensor is not None:
                slots.append((prefix + key, path, NON_PERSISTENT if key in non_persistent else BUFFER, tensor))
    return modules, slots


class _KeyUnion:
    """Union-find over storage keys: a materialized tensor joins its recorded storage to its memory."""

    def __init__(self) -> None:
        self.parent: dict[tuple, tuple] = {}

    def find(self, key: tuple) -> tuple:
        parent = self.parent.setdefault(key, key)
        while parent != key:
            grandparent = self.parent[parent]
            self.parent[key] = grandparent
            key, parent = parent, grandparent
        return key

    def join(self, first: tuple, second: tuple) -> None:
        self.parent[self.find(second)] = self.find(first)


def is_strided(tensor: torch.Tensor) -> bool:
    """Whether `tensor` lies in one storage by strides (not sparse, mkldnn or nested), so that
    storage, stride and offset mean something for it."""
    return tensor.layout is torch.strided and not tensor.is_nested


def strides_of(tensor: torch.Tensor) -> tuple[tuple[int, ...] | None, int]:
    """(stride, storage offset) of a strided tensor; (None, 0) for one with no strides."""
    if not is_strided(tensor):
        return None, 0
    return tuple(tensor.stride()), int(tensor.storage_offset())


def memory_nbytes(tensor: torch.Tensor) -> int:
    """The bytes of the memory a real tensor is on: its storage's, or its dense size for a tensor
    with no storage of its own (sparse, mkldnn, nested)."""
    if not is_strided(tensor):
        return tensor.numel() * tensor.element_size()
    return tensor.untyped_storage().nbytes()


def _memory_key(tensor: torch.Tensor) -> tuple[str, int]:
    """Which real memory a tensor is on (its storage's address in the process); a tensor with no
    storage of its own is its own memory."""
    if not is_strided(tensor):
        return ("object", id(tensor))
    return ("memory", tensor.untyped_storage()._cdata)


def take_census(root: nn.Module) -> Census:
    """Gather the parameters, buffers, storages and recorded closures of `root`; changes nothing."""
    modules, slots = _slots(root)
    graphs, graph_index, handles = _recordings(slots)
    union = _KeyUnion()
    with metadata_access():  # lazy parameters refuse metadata reads
        tensors, keys = _named_tensors(slots, handles, graphs, graph_index, union)
        _note_checkpoint_reads(tensors, graphs)  # before storages take their names' states
        storages = _storages(tensors, keys, union, graphs)
    closures = _closures_with_origins(tensors, graphs)
    return Census(root, modules, tensors, storages, graphs, closures)


def _recordings(slots: list[tuple[str, str, str, torch.Tensor]]) -> tuple[list[InitGraph], dict[int, int], list]:
    """The graphs the slots' fakes were recorded in (first-seen order), each graph's index by `id`,
    and every slot's fake handle (None for a tensor that is not one of ours)."""
    graphs: list[InitGraph] = []
    graph_index: dict[int, int] = {}
    handles = []
    for _, _, _, tensor in slots:
        handle = handle_of(tensor)
        if handle is not None and handle.graph.finished and handle.graph.recorder is not None:
            # a `.data = x` made since the fake's last op, recorded as materialization would record
            # it (note [Recording after deferred_init]): else the tables show the storage it replaced
            with contextlib.suppress(DeferredInitError):  # refused there; shown as it was
                handle.graph.recorder.catch_up(tensor)
            handle = handle_of(tensor)
        handles.append(handle)
        if handle is not None and id(handle.graph) not in graph_index:
            graph_index[id(handle.graph)] = len(graphs)
            graphs.append(handle.graph)
    return graphs, graph_index, handles


def _named_tensors(
    slots: list[tuple[str, str, str, torch.Tensor]],
    handles: list,
    graphs: list[InitGraph],
    graph_index: dict[int, int],
    union: _KeyUnion,
) -> tuple[list[NamedTensor], list[tuple]]:
    """One `NamedTensor` per slot (its storage still -1), and per name its storage key: the recorded
    storage for a name traced to a recording, else its memory. A materialized tensor's two keys are
    joined in `union`."""
    tensors: list[NamedTensor] = []
    keys: list[tuple] = []
    for (name, path, kind, tensor), handle in zip(slots, handles):
        graph: int | None = None
        tid: TensorId | None = None
        origin: Origin | None = None
        if handle is not None:
            graph, tid, state = graph_index[id(handle.graph)], handle.tensor_id, FAKE
        elif is_fake(tensor):
            state = FAKE  # another FakeTensorMode's: nothing recorded
        else:
            origin = origin_of(tensor)
            state = REAL if origin is None else MATERIALIZED
            if origin is not None and id(origin.graph()) in graph_index:
                graph, tid = graph_index[id(origin.graph())], origin.tensor_id
        if graph is not None and tid is not None:
            key: tuple = ("recorded", graph, graphs[graph].tensors[tid].storage)
            if handle is None:
                # The same memory a fake of this storage will alias once it is materialized too.
                union.join(key, _memory_key(tensor))
        else:
            key = _memory_key(tensor)
        union.find(key)
        keys.append(key)
        tensors.append(NamedTensor(name, path, kind, tensor, state, graph, tid, -1, tensor.numel(), origin))
    return tensors, keys


def _storages(
    tensors: list[NamedTensor], keys: list[tuple], union: _KeyUnion, graphs: list[InitGraph]
) -> list[StorageRecord]:
    """One `StorageRecord` per joined storage key, numbered in the order names first reach it; sets
    every name's `storage`. Run after the names' states are final (checkpoint reads noted)."""
    storages: list[StorageRecord] = []
    storage_of_root: dict[tuple, int] = {}
    for position, (entry, key) in enumerate(zip(tensors, keys)):
        component = union.find(key)
        sid = storage_of_root.get(component)
        if sid is None:
            sid = storage_of_root[component] = len(storages)
            storages.append(
                StorageRecord(
                    sid,
                    memory_nbytes(entry.tensor) if entry.graph is None else -1,
                    str(entry.tensor.device),
                    dtype_name(entry.tensor.dtype),
                    entry.state,
                    None,
                    None,
                )
            )
        record = storages[sid]
        if entry.graph is not None and record.graph is None:
            record.graph, record.recorded_id = entry.graph, key[2]
            record.nbytes = graphs[entry.graph].storages[key[2]].nbytes
        if record.state in DEFERRED_STATES and entry.state not in DEFERRED_STATES:
            record.state = entry.state  # some name on it has real memory
        record.names.append(position)
        entry.storage = sid
    return storages


def _closures_with_origins(
    tensors: list[NamedTensor], graphs: list[InitGraph]
) -> dict[tuple[int, TensorId], list[OpIndex]]:
    """The ops every recorded name needs; a fake (no origin yet) gets its `Origin` from them and from
    its graph's creation sources, read once per graph."""
    closures: dict[tuple[int, TensorId], list[OpIndex]] = {}
    # graph → its fakes with their ids (materialized ones carry an origin already)
    unexplained: dict[int, list[tuple[NamedTensor, TensorId]]] = {}
    for entry in tensors:
        recorded = entry.recorded
        if recorded is None:
            continue
        if recorded not in closures:
            closures[recorded] = graphs[recorded[0]].closure_of([recorded[1]])
        if entry.origin is None:
            unexplained.setdefault(recorded[0], []).append((entry, recorded[1]))
    for position, entries in unexplained.items():
        recording = graphs[position]
        sources = creation_sources(recording, dict.fromkeys(tid for _, tid in entries))
        for entry, tid in entries:
            entry.origin = Origin.of(recording, tid, len(closures[(position, tid)]), sources[tid])
    return closures


def _note_checkpoint_reads(tensors: list[NamedTensor], graphs: list[InitGraph]) -> None:
    """Give every recorded name the checkpoint reads feeding it; a fake so fed becomes DISK, or
    REMOTE when some of those bytes are still on the Hub."""
    reads = CheckpointReads(graphs)
    sources: dict[int, dict] = {}
    for entry in tensors:
        if entry.recorded is None:
            continue
        position, tid = entry.recorded
        if position not in sources:
            graph = graphs[position]
            sources[position] = storage_sources(graph) if graph.storages else {}
        feeding = sources[position].get(graphs[position].tensors[tid].storage)
        if feeding:
            entry.reads = tuple(reads[(position, index)] for index in sorted(feeding))
            if entry.state == FAKE:
                entry.state = REMOTE if any(map(_still_remote, entry.reads)) else DISK


def _still_remote(read: CheckpointRead) -> bool:
    where = hub_range(read.path, read.key)
    return where is not None and not is_cached(*where)
