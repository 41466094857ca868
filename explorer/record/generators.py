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


# Note: [Generator states are kept as copies]
# Replay keeps generator states for later: the state a session restores at its end, eager's state
# after each random op it ran (cached per graph for later materializations). On a GPU machine with
# torch 2.11, CUDA states kept as `get_state()` returned them did not stay put: after a replay the
# CUDA generator was left advanced by the replayed draws, and a later materialization of an
# earlier layer started from wrong states (its values differed from eager's). Keeping copies made
# every check of benchmarks/cuda_parity.py pass there. So every kept state is copied when taken;
# a copy costs microseconds (5 KB for the CPU generator, 16 bytes for CUDA's).
# tests/explorer/replay/test_rng.py pins it with a stand-in whose state tensor follows the generator.
def state_of(generator: torch.Generator) -> torch.Tensor:
    """A copy of `generator`'s state now, safe to keep (see note [Generator states are kept as copies])."""
    return generator.get_state().clone()


def capture_start_state(key: str) -> torch.Tensor | None:
    """The generator state of `key` now, or None when that device is absent on this machine."""
    if key == "cpu":
        return torch.get_rng_state()
    if key.startswith("cuda:") and torch.cuda.is_available():
        index = int(key.split(":")[1])
        if index < torch.cuda.device_count():
            return torch.cuda.get_rng_state(index)
    return None
