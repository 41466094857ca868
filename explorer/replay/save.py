"""`save_checkpoint`: a deferred model written in eager's exact values, a tensor at a time.

A model that never fits in memory can still be written: each tensor is materialized
(`materialize_tensor`, which leaves the module deferred), written, and dropped before the next, so
memory holds about one tensor. Two layouts:

- `format="safetensors"` (replay/save_safetensors.py): Hugging Face's, `model.safetensors` or
  shards plus `model.safetensors.index.json`, ties stored once, the model's config beside it, so
  `from_pretrained(directory)` loads it;
- `format="dcp"` (replay/save_dcp.py): a `torch.distributed.checkpoint` directory that `dcp.load`
  reads into any sharding. With a process group of several ranks, every rank calls it and writes
  its own shards (the local parts of DTensors after `fully_shard_deferred`, or its `Shard(0)` rows
  of a still-deferred tensor, drawn alone where possible).

Tensors read from a checkpoint while recording (`from_pretrained`, `load_checkpoint` under
`deferred_init`) are copied through from their files, converted when `dtype` is given; those of a
Hub shard (record/hub_open.py) are streamed from the Hub into the safetensors file a piece at a time,
never whole in memory nor in the range cache (replay/save_hub.py). Every file
is written under a temporary name and renamed when complete (replay/save_files.py): a cancel or a
crash leaves no partial file under a final name, and a full disk raises an OSError naming the file
and the bytes it needed.
"""

from __future__ import annotations

import copy
import os
import re
import warnings
from pathlib import Path
from typing import Literal, get_args

import torch
from torch import nn

from .materialize import materialize_tensor
from .rng import RngMode
from .routing import DeviceMap, route_devices
from .save_progress import ProgressOption, SaveProgress, SaveReport
from .save_safetensors import stored_once, write_safetensors
from .slices import WholeBaseWarning

__all__ = ["SaveFormat", "SaveProgress", "parse_size", "save_checkpoint"]

SaveFormat = Literal["safetensors", "dcp"]
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(size: int | str) -> int:
    """Bytes in `size`: an int, or "5GB" / "500MB" / "2GiB" as Hugging Face spells shard sizes."""
    if isinstance(size, int):
        return size
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*", str(size).upper())
    if found is None:
        raise ValueError(f"max_shard_size={size!r}: expected bytes as an int or a size such as '5GB' or '500MB'")
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def save_checkpoint(
    module: nn.Module,
    directory: str | os.PathLike,
    *,
    max_shard_size: int | str = "5GB",
    format: SaveFormat = "safetensors",
    dtype: torch.dtype | None = None,
    progress: ProgressOption = None,
    rng: RngMode = "eager",
    device: DeviceMap = None,
) -> list[Path]:
    """Write `module`'s state dict to `directory` with the values eager construction (and the calls
    recorded since) would give, materializing one tensor at a time; the module stays as it is
    (deferred tensors stay deferred). `dtype` converts floating-point tensors on the way.

    `format`: "safetensors" (Hugging Face's layout, shards of at most `max_shard_size`) or "dcp"
    (a torch.distributed.checkpoint directory; collective when a process group of several ranks is
    initialized: every rank calls it and writes its own shards). `progress`: a function
    `(done_tensors, total_tensors, done_bytes, total_bytes)` that may raise to cancel, True for a
    tqdm bar, False for none, None for a bar when stderr is a terminal. `rng` and `device` as for
    `materialize_tensor`: how and where each tensor is made before it is written (a model recorded
    on `cuda` is saved on a machine without one with `device="cpu", rng="fast"`).

    Returns the files written. Raises MaterializationError when a tensor cannot be materialized,
    an OSError subclass naming the file and the bytes it needed when the disk refuses a write
    (nothing partial is left under a final name, and files completed before are intact),
    ValueError for a bad `max_shard_size`, `format` or `dtype`, or a sharded module saved as
    safetensors.
    """
    if format not in get_args(SaveFormat):
        raise ValueError(f"format={format!r}: save_checkpoint writes one of {list(get_args(SaveFormat))}")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype={dtype!r}: expected a floating-point torch.dtype or None")
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype!r}: expected a floating-point torch.dtype (it converts floating-point tensors)")
    route_devices(device, rng)  # a bad `device` or `rng` is refused before any file is written
    limit = parse_size(max_shard_size)
    target = Path(directory)
    state = module.state_dict(keep_vars=True)
    report = SaveReport(progress, f"saving {target.name or target}")

    def materialize(name: str, tensor: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():
            # a view buffer is stored as its own tensor: making its base is expected here
            warnings.simplefilter("ignore", WholeBaseWarning)
            return materialize_tensor(tensor, device=device, rng=rng)

    try:
        if format == "dcp":
            # torch.distributed.checkpoint is imported only when asked for
            from .save_dcp import write_dcp

            target.mkdir(parents=True, exist_ok=True)
            return write_dcp(state, target, dtype, materialize, report, rng, device)
        _refuse_sharded(state)
        _refuse_non_tensors(state)
        target.mkdir(parents=True, exist_ok=True)
        written = write_safetensors(stored_once(state), target, limit, dtype, materialize, report)
    finally:
        report.close()
    return written + _write_configs(module, target, dtype)


def _write_configs(module: nn.Module, target: Path, dtype: torch.dtype | None) -> list[Path]:
    """A Hugging Face model's `config.json` (and `generation_config.json` when it generates), as
    `save_pretrained` writes them: the config names the dtype the weights were written in and the
    model's class. Written from a copy: the model's config is left as it was."""
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "save_pretrained"):
        return []
    config = copy.deepcopy(config)
    written_dtype = dtype if dtype is not None else _first_floating_dtype(module)
    if written_dtype is not None:
        field = "torch_dtype" if "torch_dtype" in vars(config) and "dtype" not in vars(config) else "dtype"
        setattr(config, field, str(written_dtype).removeprefix("torch."))  # transformers 4 names it torch_dtype
    config.architectures = [type(module).__name__]
    config.save_pretrained(target)
    written = [target / "config.json"]
    generation = getattr(module, "generation_config", None)
    can_generate = getattr(module, "can_generate", None)
    if generation is not None and callable(can_generate) and can_generate():
        generation.save_pretrained(target)
        written.append(target / "generation_config.json")
    return written


def _first_floating_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype `PreTrainedModel.dtype` reports: that of the first floating parameter."""
    for tensor in module.parameters():
        if tensor.is_floating_point():
            return tensor.dtype
    return None


def _refuse_non_tensors(state: dict) -> None:
    """A state-dict entry that is no tensor (a module's `get_extra_state()`) has no place in a
    safetensors file: refused, naming it, before any file is written."""
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"{name!r} is a {type(value).__name__}, not a tensor (a module's extra state), which safetensors "
                'cannot store: save with format="dcp", which keeps it'
            )


def _refuse_sharded(state: dict[str, torch.Tensor]) -> None:
    from torch.distributed.tensor import DTensor

    for name, tensor in state.items():
        if isinstance(tensor, DTensor):
            raise ValueError(  # not TypeError: the module is fine; the format asked for does not fit it
                f"{name!r} is a DTensor sharded over ranks; format='safetensors' writes whole tensors "
                "from one process: save it with format='dcp' (every rank writes its own shards)"
            )
