"""`save_checkpoint`: a deferred model written in eager's exact values, a shard at a time.

A model that never fits in memory can still be written: tensors are materialized a shard at a
time (`materialize_tensor`, which leaves the module deferred), written, and dropped, so memory
holds about one shard. The layout is Hugging Face's: `model.safetensors`, or shards
`model-0000k-of-0000n.safetensors` plus `model.safetensors.index.json`, tensors tied to each other
stored once (under their first name), so `from_pretrained(directory)` loads it (the model's config
is written beside it when it has one). Every file is written under a temporary name and renamed
when complete: a cancel or a crash leaves no partial file under a final name, and a full disk
raises a clear error with nothing final half written.

Not yet: `format="dcp"` and writing from several ranks (each its own rows).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .materialize import materialize_tensor

# progress(done_tensors, total_tensors, done_bytes, total_bytes); may raise to cancel.
SaveProgress = Callable[[int, int, int, int], None]
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(size: int | str) -> int:
    """Bytes in `size`: an int, or "5GB" / "500MB" / "2GiB" as Hugging Face spells shard sizes."""
    if isinstance(size, int):
        return size
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*", str(size).upper())
    if found is None:
        raise ValueError(f"max_shard_size={size!r}: expected bytes as an int or a size such as '5GB' or '500MB'")
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def save_checkpoint(module: nn.Module, directory: str | os.PathLike, *, max_shard_size: int | str = "5GB",
                    format: str = "safetensors", dtype: torch.dtype | None = None,
                    progress: SaveProgress | None = None) -> list[Path]:
    """Write `module`'s state dict to `directory` with the values eager construction (and the calls
    recorded since) would give, materializing one shard at a time; the module stays as it is
    (deferred tensors stay deferred). `dtype` converts floating-point tensors on the way.

    Returns the files written. Raises MaterializationError when a tensor cannot be materialized
    (nothing is left under a final name for the shard being written), OSError subclasses from the
    disk with the file named, ValueError for a bad `max_shard_size` or `format`.
    """
    if format != "safetensors":
        raise ValueError(f"format={format!r}: save_checkpoint writes 'safetensors' (DCP is not built yet)")
    from safetensors.torch import save_file

    limit = parse_size(max_shard_size)
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    tensors = _stored_once(module)
    shards = _shards(tensors, limit, dtype)
    total_bytes = sum(_nbytes(t, dtype) for t in tensors.values())
    names = _shard_names(len(shards))
    done, done_bytes, written = 0, 0, []
    for name, keys in zip(names, shards):
        values = {key: _converted(materialize_tensor(tensors[key]), dtype) for key in keys}
        path = target / name
        _atomic(path, lambda temporary: save_file(values, str(temporary), metadata={"format": "pt"}))
        written.append(path)
        done += len(keys)
        done_bytes += sum(value.numel() * value.element_size() for value in values.values())
        del values
        if progress is not None:
            progress(done, len(tensors), done_bytes, total_bytes)
    if len(shards) > 1:
        index = {"metadata": {"total_size": total_bytes},
                 "weight_map": {key: name for name, keys in zip(names, shards) for key in keys}}
        path = target / "model.safetensors.index.json"
        _atomic(path, lambda temporary: temporary.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n"))
        written.append(path)
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "save_pretrained"):
        config.save_pretrained(target)
    return written


def _stored_once(module: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with tensors tied to an earlier name left out (as `save_pretrained` stores them)."""
    seen: dict[tuple, str] = {}
    kept: dict[str, torch.Tensor] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        identity = (id(tensor),)
        if identity in seen:
            continue
        seen[identity] = name
        kept[name] = tensor
    return kept


def _nbytes(tensor: torch.Tensor, dtype: torch.dtype | None) -> int:
    target = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    return tensor.numel() * target.itemsize


def _shards(tensors: dict[str, torch.Tensor], limit: int, dtype: torch.dtype | None) -> list[list[str]]:
    """Keys grouped in state-dict order into shards of at most `limit` bytes (a bigger tensor alone)."""
    shards: list[list[str]] = [[]]
    size = 0
    for key, tensor in tensors.items():
        nbytes = _nbytes(tensor, dtype)
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    return shards if shards[0] else []


def _shard_names(count: int) -> list[str]:
    if count <= 1:
        return ["model.safetensors"] * count
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def _converted(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    tensor = tensor.detach()
    if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    return tensor.contiguous()


def _atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Write through `write(temporary)` then rename to `path`: never a partial file under `path`."""
    temporary = path.with_name(f".{path.name}.partial")
    try:
        write(temporary)
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise type(error)(error.errno, f"writing {path} failed: {error.strerror or error}") from error
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
