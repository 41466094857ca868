"""`torch.manual_seed` called inside a deferred scope (a `%%deferred` cell that starts by seeding, a
constructor that seeds itself).

Replay reproduces eager's random numbers from the generator states captured when recording began
(`InitGraph.rng_start`) plus the draws of the random ops recorded since. A reseed before the first
random op only moves that starting point, so the start states are captured again after it. A
reseed after random ops were recorded would split the stream in two, which replay does not model:
it is refused with a message saying to seed before the block. Inside the scope only; undone on
every exit.

Note: wraps `torch.manual_seed` (= `torch.random.manual_seed`), looked up at call time by callers
such as `transformers.set_seed`; re-check on upgrades (tests/explorer/record/test_deferred_block.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.random

from ..errors import DeferredInitError
from ..graph import InitGraph
from .generators import capture_start_state


@contextlib.contextmanager
def seeding_moves_the_start(graph: InitGraph) -> Iterator[None]:
    """While the block runs, `torch.manual_seed` before any random op re-captures `graph`'s start states."""
    original = torch.random.manual_seed

    def manual_seed(seed: int) -> torch.Generator:
        drawn = sum(len(ops) for ops in graph.random_streams.values())
        if drawn:
            raise DeferredInitError(
                f"torch.manual_seed({seed}) was called while recording, after {drawn} random op"
                f"{'s' * (drawn != 1)} had been recorded; replay could not reproduce eager's numbers. "
                "Seed before deferred_init / the deferred block (or before the first random op)"
            )
        generator = original(seed)
        graph.rng_start["cpu"] = torch.default_generator.get_state()
        graph.rng_restarts.clear()  # the seed, not earlier deferred recordings, now decides the start
        for key in list(graph.rng_start):
            if key != "cpu":
                graph.rng_start[key] = capture_start_state(key)
        return generator

    torch.manual_seed = torch.random.manual_seed = manual_seed
    try:
        yield
    finally:
        torch.manual_seed = torch.random.manual_seed = original
