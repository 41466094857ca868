"""Random-number parity between replay and eager construction.

Eager construction draws every random op, in order, from the default generator of the op's device.
`deferred_init` snapshots those generators when it starts and numbers each random op in its
device's stream. To replay random op k with rng="eager", the generator is set to the state it had
just before op k: states are cached as replay passes them, and a missing one is reached by
re-running the skipped random ops on scratch tensors of the recorded layout (what matters is how
many numbers each op draws, not where they go). With rng="fast" each random op instead gets a
seed derived from the start state and its position, so values do not depend on what else is
materialized or in which order, and dead writes can be skipped.

A `RngSession` owns the default generators while a replay runs and puts back the user's states
when it ends, whatever happens.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Callable, Literal, get_args

import torch

from ..graph import InitGraph, OpIndex
from ..record.generators import default_generator

# How replay reaches random values: "eager" reproduces eager construction bit for bit (each random op
# draws from the generator state eager construction had before it); "fast" seeds each random op from
# its position alone (reproducible, independent of order, not eager's values).
RngMode = Literal["eager", "fast"]
RNG_MODES: tuple[RngMode, ...] = get_args(RngMode)

# Replays move the process-wide default generators: one at a time.
GENERATOR_LOCK = threading.RLock()


class RngStreams:
    """Per-graph cache of generator states before each random op (state k = before the k-th op)."""

    def __init__(self, graph: InitGraph) -> None:
        self.graph = graph
        self._states: dict[str, dict[int, torch.Tensor]] = {}
        self._salts: dict[str, int] = {}

    def cache(self, key: str) -> dict[int, torch.Tensor]:
        """States of stream `key` by position; position 0 is the state when deferred_init started."""
        states = self._states.get(key)
        if states is None:
            states = self._states[key] = {0: self.graph.rng_start[key]}
        return states

    def fast_seed(self, key: str, position: int) -> int:
        """A seed for random op `position` of stream `key`, fixed by the start state alone."""
        salt = self._salts.get(key)
        if salt is None:
            start = self.graph.rng_start.get(key)
            raw = start.numpy().tobytes() if start is not None else key.encode()
            salt = self._salts[key] = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")
        digest = hashlib.blake2b(f"{salt}:{key}:{position}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class RngSession:
    """Holds the default generators during one replay and restores them afterwards."""

    def __init__(self, streams: RngStreams, mode: RngMode, run_scratch: Callable[[OpIndex], None]) -> None:
        self.streams = streams
        self.mode = mode
        self.run_scratch = run_scratch
        self._saved: dict[str, torch.Tensor] = {}
        self._position: dict[str, int] = {}  # where each generator is now, if we set it

    def __enter__(self) -> "RngSession":
        GENERATOR_LOCK.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for key, state in self._saved.items():
                default_generator(key).set_state(state)
        finally:
            GENERATOR_LOCK.release()

    def _generator(self, key: str) -> torch.Generator:
        generator = default_generator(key)
        if key not in self._saved:
            self._saved[key] = generator.get_state()
        return generator

    def before_random_op(self, key: str, position: int, exec_key: str) -> None:
        """Put the generator that will run random op `position` of stream `key` where it must be."""
        if self.mode == "fast":
            self._generator(exec_key).manual_seed(self.streams.fast_seed(key, position))
            return
        generator = self._generator(key)
        if self._position.get(key) == position:
            return
        cache = self.streams.cache(key)
        start = max(k for k in cache if k <= position)
        generator.set_state(cache[start])
        for skipped in range(start, position):
            self.run_scratch(self.streams.graph.random_streams[key][skipped])
            cache.setdefault(skipped + 1, generator.get_state())
        self._position[key] = position

    def after_random_op(self, key: str, position: int) -> None:
        if self.mode == "fast":
            return
        self._position[key] = position + 1
        cache = self.streams.cache(key)
        if position + 1 not in cache:
            cache[position + 1] = default_generator(key).get_state()
