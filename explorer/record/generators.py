"""The default generators a constructor draws from: their names and their states.

Eager construction draws each random op from the default generator of the op's device. Recording
snapshots those generators (so replay can start where eager did) and names each one by a stream
key ('cpu', 'cuda:0', ...) under which the graph numbers its random ops.
"""

from __future__ import annotations

import torch


def stream_key(device: torch.device) -> str:
    """The generator a random op on `device` draws from in eager mode ('cpu', 'cuda:0', ...)."""
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    return device.type


def default_generator(key: str) -> torch.Generator:
    if key == "cpu":
        return torch.default_generator
    if key.startswith("cuda:"):
        return torch.cuda.default_generators[int(key.split(":")[1])]
    raise ValueError(f"no default generator for device {key!r}")


def capture_start_state(key: str) -> torch.Tensor | None:
    """The generator state of `key` now, or None when that device is absent on this machine."""
    if key == "cpu":
        return torch.get_rng_state()
    if key.startswith("cuda:") and torch.cuda.is_available():
        index = int(key.split(":")[1])
        if index < torch.cuda.device_count():
            return torch.cuda.get_rng_state(index)
    return None
