"""`load_checkpoint`: a checkpoint loaded into any module, deferred or not.

On a deferred module the load is recorded into the module's own recording: each tensor is a read
op (record/checkpoint_reads.py, checkpoint_formats.py), copied into its parameter or buffer as
`load_state_dict` copies (converting dtype), so the initialisation it overwrites becomes a dead
write that replay skips, and nothing is read until materialization. Tensors already real are
loaded for real, as `load_state_dict` of the file would.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .._torch_compat.dispatch import metadata_access
from ..checkpoint_headers import CheckpointHeaders, file_format, loads_into, read_headers, state_dict_in
from ..errors import CheckpointError
from .checkpoint_formats import READ_DCP, READ_TORCH, meta_load, torch_key
from .checkpoint_reads import READ_SAFETENSORS
from .deferred import deferred
from .fake import is_fake
from .file_stamps import stamped
from .hub_open import hub_checkpoint

Reader = Callable[[str], torch.Tensor]  # checkpoint key → tensor (a read op inside a recording)


def load_checkpoint(module: nn.Module, path: str | os.PathLike, *, strict: bool = True) -> nn.Module:
    """Load the checkpoint at `path` into `module` as `module.load_state_dict` would.

    `path`: a safetensors file or directory (`model.safetensors`, a sharded index), a Hub repo as
    `hub://org/name[@revision][/subfolder]` (headers read now, bytes fetched at materialization:
    record/hub_open.py), a `torch.save`
    file (`.pt`/`.bin`, read with `weights_only`: pickled code is refused) or shards of them, or a
    `torch.distributed.checkpoint` directory. A deferred module stays deferred: the load is recorded
    (a read op per tensor, copied into its parameter or buffer), the init it overwrites is skipped at
    materialization, and bytes are read only for what is materialized. Tensors already materialized
    are loaded for real. Keys are checked first, from headers only: with `strict`, a key missing
    from the checkpoint or not in the module raises CheckpointError naming it, and nothing is
    loaded. Returns `module`.
    """
    local = hub_checkpoint(path)
    headers = read_headers(local)
    current = module.state_dict(keep_vars=True)
    expected = set(current)
    stored = {key for key, entry in headers.entries.items() if entry.shape is not None}
    # Non-tensor values of a torch.save dict: a module's `get_extra_state()`, or keys of no module
    # (a step count), unexpected as load_state_dict finds them. DCP flattens values into its own keys.
    values = set() if headers.format == "dcp" else set(headers.entries) - stored
    # A name tied to a stored one is filled through the tie (save_pretrained stores ties once).
    stored_objects = {id(current[key]) for key in stored & expected}
    missing = sorted(key for key in expected - stored - values if id(current[key]) not in stored_objects)
    unexpected = sorted((stored | values) - expected)
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} key(s): {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            more = " ..." if len(unexpected) > 5 else ""
            parts.append(f"unexpected {len(unexpected)} key(s): {', '.join(unexpected[:5])}{more}")
        raise CheckpointError(
            f"{path} does not fit {type(module).__name__}: "
            + "; ".join(parts)
            + " (strict=False loads the keys both have)"
        )
    wanted = sorted(expected & stored)
    _refuse_other_shapes(path, module, headers, {key: current[key] for key in wanted})
    for key in wanted:
        _layout(headers, key)  # a dtype this torch cannot load is refused before anything is read or recorded
    read = _reader(headers, Path(local))
    # Tensors already materialized (or never deferred) get the bytes now; deferred ones a recorded
    # read. One load_state_dict over both, in the module's order as eager's: a deferred buffer that
    # views a materialized weight is written after that weight, as eager writes it.
    tensors: dict[str, torch.Tensor] = {key: read(key) for key in wanted if not is_fake(current[key])}
    if len(tensors) < len(wanted):
        with deferred(module):
            tensors |= {key: read(key) for key in wanted if is_fake(current[key])}
    if tensors:
        module.load_state_dict({key: tensors[key] for key in wanted}, strict=False)
    if wanted_values := sorted(expected & values):  # extra states: Python values, set as they are
        module.load_state_dict(_stored_values(headers, Path(local), wanted_values), strict=False)
    return module


def _stored_values(headers: CheckpointHeaders, path: Path, keys: list[str]) -> dict[str, object]:
    """The non-tensor values stored under `keys` in `torch.save` files (read with `weights_only`;
    tensors in them stay on the meta device, unread)."""
    root = path if path.is_dir() else path.parent
    found: dict[str, object] = {}
    for key in keys:
        inner = state_dict_in(meta_load(str((root / headers.entries[key].file).resolve())))
        assert inner is not None  # the headers were read from this same mapping
        found[key] = inner[key]
    return found


def _refuse_other_shapes(
    path: str | os.PathLike, module: nn.Module, headers: CheckpointHeaders, current: dict[str, torch.Tensor]
) -> None:
    """CheckpointError for the keys `load_state_dict` would refuse as a size mismatch, before
    anything is loaded: it loads the keys before them first, leaving the module half-loaded."""
    with metadata_access():  # lazy parameters refuse metadata reads
        other = [
            (key, headers.entries[key], tuple(tensor.shape))
            for key, tensor in current.items()
            if not is_lazy(tensor) and not loads_into(cast(tuple, headers.entries[key].shape), tuple(tensor.shape))
        ]
    if other:
        listed = "; ".join(
            f"{key}: {list(entry.shape or ())} in {entry.file}, {list(shape)} in the module"
            for key, entry, shape in other[:5]
        )
        more = f"; and {len(other) - 5} more" if len(other) > 5 else ""
        raise CheckpointError(
            f"{path} does not fit {type(module).__name__}: size mismatch for {len(other)} key(s): {listed}{more}; "
            "nothing was loaded"
        )


def _reader(headers: CheckpointHeaders, path: Path) -> Reader:
    """How to read each key of the checkpoint: the format's read op (recorded inside a recording)."""
    root = path if path.is_dir() else path.parent
    if headers.format == "dcp":
        directory = str(path.resolve())
        return lambda key: READ_DCP(stamped(directory), key, *_layout(headers, key))
    prefixes: dict[str, list] = {}

    def prefix(file: str) -> list:
        if file not in prefixes:  # training checkpoints nest the state dict under "state_dict" / "model"
            loaded = meta_load(file)
            inner = state_dict_in(loaded)
            prefixes[file] = [] if inner is loaded else [k for k in ("state_dict", "model") if loaded.get(k) is inner]
        return prefixes[file]

    formats: dict[str, str] = {}  # by content, as the headers were read: a name need not say

    def read(key: str) -> torch.Tensor:
        file = str((root / headers.entries[key].file).resolve())
        if file not in formats:
            formats[file] = file_format(Path(file))
        if formats[file] == "safetensors":
            return READ_SAFETENSORS(stamped(file), key, *_layout(headers, key))
        return READ_TORCH(stamped(file), torch_key([*prefix(file), key]), *_layout(headers, key))

    return read


def _layout(headers: CheckpointHeaders, key: str) -> tuple[list[int], torch.dtype]:
    entry = headers.entries[key]
    dtype = getattr(torch, str(entry.dtype), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"{headers.path}: {key!r} is stored as {entry.dtype}, which this torch cannot load")
    return list(entry.shape or ()), dtype
