"""The tensors table: one row per parameter or buffer name."""

from __future__ import annotations

import pandas as pd

from .._torch_compat.dispatch import metadata_access
from ..naming import dtype_name
from .census import Census, strides_of
from .checkpoint_sources import CheckpointRead

TENSOR_COLUMNS = [
    "name",
    "module",
    "kind",
    "shape",
    "stride",
    "storage_offset",
    "dtype",
    "device",
    "numel",
    "bytes",
    "contiguous",
    "requires_grad",
    "is_view",
    "storage_id",
    "alias_group",
    "tied_with",
    "state",
    "graph",
    "tensor_id",
    "closure_ops",
    "producer",
    "last_write",
    "source",
    "file",
    "key",
    "offset",
    "disk_dtype",
]


def tensors_table(census: Census) -> pd.DataFrame:
    """One row per name, in module order (`named_modules`, parameters before buffers).

    - `bytes`: the tensor's own elements (numel × element size); the storage it views may be larger;
    - `is_view`: the tensor is a window on its storage (an offset, a non-contiguous layout, or fewer
      bytes than the storage). Read from the layout, so an eager, a fake and a materialized tensor of
      the same construction agree (`Tensor._is_view()` does not: materialized views are `set_` on
      their base's storage);
    - `alias_group`: every other name on the same storage (tied names included);
    - `tied_with`: every other name for the same tensor: the same object, or a materialized tensor
      and the fakes of the same recorded tensor (materializing those returns that very object);
    - `graph`: the recorded graph (its position in the ops table's `graph` column) for fakes, and for
      materialized tensors while some fake of their graph remains; `tensor_id`: the recorded tensor,
      as the ops table names it (`#<tensor_id>` when it has no name), for every fake or
      materialized tensor;
    - `closure_ops`: how many recorded ops reproducing it takes; `producer`: the op that made this
      tensor object; `last_write`: the last op that wrote its storage (its initializer, usually);
      `source`: the user's line that made it, "file:line in function" (for `.data = x`, the line that
      made `x`). All missing for real tensors;
    - `file`, `key`, `offset`, `disk_dtype`: the checkpoint read feeding the tensor's value (state
      "disk", and materialized tensors traced back): the safetensors file's name, the key in it, where
      the key's data starts in the file (bytes; missing when the header cannot be read now) and its
      dtype there (a bfloat16 checkpoint loaded as float32 says bfloat16). A tensor fed by several
      reads (a concatenation) lists their files, keys and dtypes joined by ", " and has no offset.
      All missing for tensors no read feeds.
    """
    columns: dict[str, list] = {column: [] for column in TENSOR_COLUMNS}
    storages = census.storages
    names = [entry.name for entry in census.tensors]
    by_identity: dict[tuple, list[int]] = {}
    for position, entry in enumerate(census.tensors):
        by_identity.setdefault(entry.identity, []).append(position)

    with metadata_access():  # lazy parameters refuse metadata reads
        for position, entry in enumerate(census.tensors):
            tensor = entry.tensor
            shape = tuple(tensor.size())  # not `.shape`: a lazy parameter refuses it, even here
            stride, offset = strides_of(tensor)
            numel = entry.numel
            nbytes = numel * tensor.element_size()
            contiguous = stride is not None and tensor.is_contiguous()
            storage = storages[entry.storage]
            columns["name"].append(entry.name)
            columns["module"].append(entry.module)
            columns["kind"].append(entry.kind)
            columns["shape"].append(shape)
            columns["stride"].append(stride)
            columns["storage_offset"].append(offset)
            columns["dtype"].append(dtype_name(tensor.dtype))
            columns["device"].append(str(tensor.device))
            columns["numel"].append(numel)
            columns["bytes"].append(nbytes)
            columns["contiguous"].append(contiguous)
            columns["requires_grad"].append(tensor.requires_grad)
            columns["is_view"].append(offset != 0 or not contiguous or nbytes != storage.nbytes)
            columns["storage_id"].append(entry.storage)
            columns["alias_group"].append([names[i] for i in storage.names if i != position])
            columns["tied_with"].append([names[i] for i in by_identity[entry.identity] if i != position])
            columns["state"].append(entry.state)
            columns["graph"].append(entry.graph)
            _add_reads(columns, entry.reads)
            origin = entry.origin
            if origin is None:
                for column in ("tensor_id", "closure_ops", "producer", "last_write", "source"):
                    columns[column].append(None)
                continue
            columns["tensor_id"].append(origin.tensor_id)
            columns["closure_ops"].append(origin.closure_ops)
            columns["producer"].append(origin.producer)
            columns["last_write"].append(origin.last_write)
            columns["source"].append(str(origin.source) if origin.source is not None else None)

    for column in ("graph", "tensor_id", "closure_ops", "offset"):
        columns[column] = pd.array(columns[column], dtype="Int64")
    return pd.DataFrame(columns, columns=TENSOR_COLUMNS)


def _add_reads(columns: dict[str, list], reads: tuple[CheckpointRead, ...]) -> None:
    if not reads:
        for column in ("file", "key", "offset", "disk_dtype"):
            columns[column].append(None)
        return
    columns["file"].append(", ".join(dict.fromkeys(read.file for read in reads)))
    columns["key"].append(", ".join(read.key for read in reads))
    columns["offset"].append(reads[0].offset if len(reads) == 1 else None)
    columns["disk_dtype"].append(", ".join(dict.fromkeys(read.dtype for read in reads)))
