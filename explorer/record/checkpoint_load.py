"""`load_checkpoint`: a safetensors checkpoint loaded into any module, deferred or not.

On a deferred module the load is recorded into the module's own recording: each tensor is a read
op (record/checkpoint_reads.py), copied into its parameter or buffer as `load_state_dict` copies
(converting dtype), so the initialisation it overwrites becomes a dead write that replay skips,
and nothing is read until materialization. On an eager module it is `load_state_dict` of the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError
from .checkpoint_reads import RecordedSafeOpen, original_safe_open
from .deferred import deferred
from .fake import is_fake

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


def checkpoint_files(path: str | os.PathLike) -> dict[str, Path]:
    """Key → safetensors file, for a file, or a directory with `model.safetensors` or a sharded
    `model.safetensors.index.json`. Raises CheckpointError naming what is missing."""
    path = Path(path)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise CheckpointError(f"{path}: load_checkpoint reads safetensors files (.safetensors); "
                                  f"for other formats load them and call module.load_state_dict")
        return {key: path for key in _keys(path)}
    if (path / _INDEX).is_file():
        try:
            weight_map = json.loads((path / _INDEX).read_text())["weight_map"]
        except (ValueError, KeyError) as error:
            raise CheckpointError(f"{path / _INDEX}: not a safetensors index ({type(error).__name__}: {error})") from error
        files = {key: path / shard for key, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise CheckpointError(f"{path / _INDEX} names shard {shard.name}, which is not in {path}")
        return files
    if (path / _SINGLE).is_file():
        return {key: path / _SINGLE for key in _keys(path / _SINGLE)}
    raise CheckpointError(f"{path}: no safetensors checkpoint here (a .safetensors file, or a directory "
                          f"with {_SINGLE} or {_INDEX})")


def _keys(file: Path) -> list[str]:
    try:
        with original_safe_open()(str(file), framework="pt") as handle:
            return list(handle.keys())
    except Exception as error:  # SafetensorError: a truncated or foreign file
        raise CheckpointError(f"{file}: not a readable safetensors file ({type(error).__name__}: {error})") from error


def load_checkpoint(module: nn.Module, path: str | os.PathLike, *, strict: bool = True) -> nn.Module:
    """Load the safetensors checkpoint at `path` into `module` as `module.load_state_dict` would.

    A deferred module stays deferred: the load is recorded (a read op per tensor, copied into its
    parameter or buffer), the init it overwrites is skipped at materialization, and bytes are read
    only for what is materialized. Tensors already materialized are loaded for real. Keys are checked first, from headers only: with `strict`, a key
    missing from the checkpoint or not in the module raises CheckpointError naming it, and nothing is
    loaded. Returns `module`.
    """
    files = checkpoint_files(path)
    expected = set(module.state_dict(keep_vars=True))
    missing, unexpected = sorted(expected - set(files)), sorted(set(files) - expected)
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"{path} does not fit {type(module).__name__}: "
            + "; ".join(part for part in (
                f"missing {len(missing)} key(s): {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}" if missing else "",
                f"unexpected {len(unexpected)} key(s): {', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}"
                if unexpected else "") if part)
            + " (strict=False loads the keys both have)")
    current = module.state_dict(keep_vars=True)
    deferred_keys = {key: file for key, file in files.items() if key in expected and is_fake(current[key])}
    real_keys = {key: file for key, file in files.items() if key in expected and key not in deferred_keys}
    if real_keys:  # already materialized (or never deferred): loaded for real, as load_state_dict does
        module.load_state_dict(_read(real_keys, original_safe_open()), strict=False)
    if deferred_keys:
        with deferred(module):
            module.load_state_dict(_read(deferred_keys, RecordedSafeOpen), strict=False)
    return module


def _read(files: dict[str, Path], opener: Any) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for key, file in files.items():
        by_file.setdefault(file, []).append(key)
    for file, keys in by_file.items():
        with opener(str(file), framework="pt") as handle:
            for key in keys:
                state[key] = handle.get_tensor(key)
    return state
