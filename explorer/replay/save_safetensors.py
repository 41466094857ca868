"""Hugging Face's safetensors layout, written one tensor at a time.

A shard's header (names, dtypes, shapes, byte offsets) is known from the deferred tensors before
any value exists, so the file is written as the format lays it out: the 8-byte header length, the
JSON header, then each tensor's bytes, materialized, written and dropped in turn. Memory holds one
tensor (plus its conversion), never a shard: `safetensors.torch.save_file` would hold the shard and
a copy of its bytes. Shards are named and indexed as `save_pretrained` names them
(`model.safetensors`, or `model-0000k-of-0000n.safetensors` plus `model.safetensors.index.json`),
and tensors tied to an earlier name are stored once, under that name.

Note: [safetensors layout] header = u64 little-endian length N, then N bytes of JSON padded with
spaces to a multiple of 8; `data_offsets` are relative to the end of the header and tile the data
without gaps (the reader checks this); wider elements first, so each tensor is aligned to its
element size (`aligned_order`). Mirrors safetensors' `serialize`; re-check on upgrades
(tests load every file written here with `safetensors.torch.load_file`).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO

import torch

from ..checkpoint_headers import safetensors_dtype
from ..errors import MaterializationError
from .save_files import written_together
from .save_hub import hub_copy
from .save_progress import SaveReport

_CODES = (
    "BOOL",
    "U8",
    "I8",
    "U16",
    "I16",
    "U32",
    "I32",
    "U64",
    "I64",
    "F16",
    "BF16",
    "F32",
    "F64",
    "C64",
    "F8_E4M3",
    "F8_E5M2",
    "F8_E4M3FNUZ",
    "F8_E5M2FNUZ",
    "F8_E8M0",
)
_CODE_OF = {safetensors_dtype(code): code for code in _CODES if safetensors_dtype(code) is not None}
INDEX_NAME = "model.safetensors.index.json"

Materialize = Callable[[str, torch.Tensor], torch.Tensor]  # (name, deferred or real tensor) -> real tensor


def saved_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype `tensor` is stored in: `dtype` for floating-point tensors when given, else its own."""
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


def saved_nbytes(tensor: torch.Tensor, dtype: torch.dtype | None) -> int:
    return tensor.numel() * saved_dtype(tensor, dtype).itemsize


def converted(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`tensor` detached, in its stored dtype, contiguous and owning just its bytes."""
    tensor = tensor.detach()
    if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    tensor = tensor.contiguous()
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        tensor = tensor.clone()  # a view of a larger storage: keep only these bytes alive
    return tensor


def stored_once(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict with tensors tied to an earlier name left out (as `save_pretrained` stores them)."""
    seen: set[int] = set()
    kept: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            kept[name] = tensor
    return kept


def aligned_order(tensors: dict[str, torch.Tensor], keys: list[str], dtype: torch.dtype | None) -> list[str]:
    """A shard's keys as its data is laid out: wider elements first, state-dict order among equals
    (stable), so every tensor starts at a multiple of its element size, as safetensors' `serialize`
    lays them out for readers that map the file without copying."""
    return sorted(keys, key=lambda key: -saved_dtype(tensors[key], dtype).itemsize)


def shard_keys(tensors: dict[str, torch.Tensor], limit: int, dtype: torch.dtype | None) -> list[list[str]]:
    """Keys grouped in state-dict order into shards of at most `limit` bytes (a bigger tensor alone)."""
    shards: list[list[str]] = []
    size = 0
    for key, tensor in tensors.items():
        nbytes = saved_nbytes(tensor, dtype)
        if not shards or (shards[-1] and size + nbytes > limit):
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    return shards


def shard_names(count: int) -> list[str]:
    if count <= 1:
        return ["model.safetensors"] * count
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def write_safetensors(
    tensors: dict[str, torch.Tensor],
    target: Path,
    limit: int,
    dtype: torch.dtype | None,
    materialize: Materialize,
    report: SaveReport,
) -> list[Path]:
    """Write `tensors` (deferred or real) as shards of at most `limit` bytes plus the index; each
    tensor is materialized by `materialize`, written and dropped. Returns the files written."""
    for name, tensor in tensors.items():
        if saved_dtype(tensor, dtype) not in _CODE_OF:
            raise ValueError(f"{name!r} is {saved_dtype(tensor, dtype)}, which safetensors cannot store")
    shards = shard_keys(tensors, limit, dtype)
    names = shard_names(len(shards))
    report.start(len(tensors), sum(saved_nbytes(t, dtype) for t in tensors.values()))
    written = []
    with written_together() as write_file:  # a failed save leaves the earlier checkpoint whole
        for name, keys in zip(names, shards):
            path = target / name
            shard = {key: tensors[key] for key in aligned_order(tensors, keys, dtype)}
            header = _header(shard, dtype)
            size = len(header) + sum(saved_nbytes(tensor, dtype) for tensor in shard.values())
            write_file(
                path,
                size,
                partial(_write_shard, header=header, shard=shard, dtype=dtype, materialize=materialize, report=report),
                remaining=report.total_bytes - report.done_bytes + len(header),
            )
            written.append(path)
        if len(shards) > 1:
            index = {
                "metadata": {"total_size": report.total_bytes},
                "weight_map": {key: name for name, keys in zip(names, shards) for key in keys},
            }
            text = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
            path = target / INDEX_NAME
            write_file(path, len(text), lambda stream: stream.write(text))
            written.append(path)
    _remove_earlier_saves(target, written)
    return written


_OUR_NAMES = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json")


def _remove_earlier_saves(target: Path, written: list[Path]) -> None:
    """Shards and an index an earlier save left under the names this one writes, as
    `save_pretrained` cleans its own: left there, a stale index would be read for the new model."""
    kept = {path.name for path in written}
    for path in target.iterdir():
        if path.name not in kept and _OUR_NAMES.fullmatch(path.name) and path.is_file():
            path.unlink()


def _write_shard(
    stream: IO[bytes],
    header: bytes,
    shard: dict[str, torch.Tensor],
    dtype: torch.dtype | None,
    materialize: Materialize,
    report: SaveReport,
) -> None:
    """The header, then each tensor's bytes, each reported as written."""
    stream.write(header)
    for key, tensor in shard.items():
        report.advance(1, _write_tensor(stream, key, tensor, dtype, materialize))


def _header(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None) -> bytes:
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, tensor in tensors.items():
        nbytes = saved_nbytes(tensor, dtype)
        entries[key] = {
            "dtype": _CODE_OF[saved_dtype(tensor, dtype)],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _write_tensor(
    stream: IO[bytes], key: str, tensor: torch.Tensor, dtype: torch.dtype | None, materialize: Materialize
) -> int:
    """Materialize, convert and write one tensor's bytes; returns how many (nothing kept alive).
    A tensor read from a Hub shard is streamed from the Hub instead (replay/save_hub.py)."""
    copy = hub_copy(tensor)
    if copy is not None:
        nbytes = 0
        for piece in copy.pieces(saved_dtype(tensor, dtype)):
            stream.write(piece.view(torch.uint8).numpy().data)
            nbytes += piece.numel() * piece.element_size()
        return nbytes
    value = converted(materialize(key, tensor), dtype)
    expected = (saved_dtype(tensor, dtype), tuple(tensor.shape))
    if (value.dtype, tuple(value.shape)) != expected:
        raise MaterializationError(
            f"{key!r} materialized as {value.dtype} {tuple(value.shape)}, but its deferred "
            f"tensor is {expected[0]} {expected[1]}"
        )
    nbytes = value.numel() * value.element_size()
    if nbytes:
        stream.write(value.reshape(-1).view(torch.uint8).numpy().data)  # the array's memoryview: no copy
    return nbytes
