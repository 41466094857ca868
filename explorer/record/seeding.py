"""`torch.manual_seed` called inside a deferred scope (a `%%deferred` cell that starts by seeding, a
constructor that seeds itself).

Replay reproduces eager's random numbers from the generator states captured when recording began
(`InitGraph.rng_start`) plus the draws of the random ops recorded since. A reseed before the first
random op only moves that starting point, so the start states are captured again after it. A
reseed after random ops were recorded would split the stream in two, which replay does not model:
it is refused with a message saying to seed before the block. Inside the scope only; undone on
every exit.

Note: [Rewinding the generator while recording]
`torch.set_rng_state` (and `torch.random.fork_rng`, which restores the state it read on exit) can
rewind the generator: in eager, the draws after it repeat earlier ones. Replay's stream only moves
forward, so a rewind after random ops were recorded would replay other numbers than eager's,
silently. It is refused instead, unless nothing was drawn since the state was read (a no-op). Before
the first random op it moves the start like a seed. `torch.default_generator.set_state`, `.seed`
and `.manual_seed` called on the generator object itself are C methods, not wrappable: the state
they leave is seen at the end of the recording, which is then refused; not a rewind made that way
to the state the recording started from (recording draws nothing, so that state is unchanged).

Note: wraps `torch.manual_seed` (= `torch.random.manual_seed`) and its kin, looked up at call time by callers
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
from .scope import outside_recording


def _drawn(graph: InitGraph) -> int:
    return sum(len(ops) for ops in graph.random_streams.values())


def _recapture_start(graph: InitGraph) -> None:
    """The generator states as they are now become `graph`'s start (nothing was drawn yet)."""
    graph.rng_start["cpu"] = torch.default_generator.get_state()
    graph.rng_restarts.clear()  # the seed, not earlier deferred recordings, now decides the start
    for key in list(graph.rng_start):
        if key != "cpu":
            graph.rng_start[key] = capture_start_state(key)


@contextlib.contextmanager
def seeding_moves_the_start(graph: InitGraph) -> Iterator[None]:
    """While the block runs, `torch.manual_seed`, `torch.seed` or `torch.set_rng_state` before any
    random op re-captures `graph`'s start states; after one, they are refused (note [Rewinding the
    generator while recording])."""
    originals = torch.random.manual_seed, torch.random.seed, torch.random.get_rng_state, torch.random.set_rng_state
    original_manual_seed, original_seed, original_get_state, original_set_state = originals
    read_at: dict[int, tuple[torch.Tensor, int]] = {}  # states handed out by get_rng_state, and when

    def refuse_after_draws(call: str) -> None:
        if drawn := _drawn(graph):
            raise DeferredInitError(
                f"{call} was called while recording, after {drawn} random op{'s' * (drawn != 1)} had been "
                "recorded; replay could not reproduce eager's numbers. Seed before deferred_init / the "
                "deferred block (or before the first random op)"
            )

    def manual_seed(seed: int) -> torch.Generator:
        refuse_after_draws(f"torch.manual_seed({seed})")
        generator = original_manual_seed(seed)
        _recapture_start(graph)
        return generator

    def seed() -> int:
        refuse_after_draws("torch.seed()")
        value = original_seed()
        _recapture_start(graph)
        return value

    def get_rng_state() -> torch.Tensor:
        state = original_get_state()
        read_at[id(state)] = (state, _drawn(graph))
        return state

    def set_rng_state(new_state: torch.Tensor) -> None:
        drawn = _drawn(graph)
        read = read_at.get(id(new_state))
        if drawn and not (read is not None and read[0] is new_state and read[1] == drawn):
            if read is not None and read[0] is new_state:
                when = f"{drawn - read[1]} random op(s) after that state was read"
            else:
                when = f"after {drawn} random op(s) had been recorded"
            raise DeferredInitError(
                f"torch.set_rng_state was called while recording, {when}. It rewinds the generator "
                "(torch.random.fork_rng does so on exit), which replay does not model: eager's numbers could "
                "not be reproduced. Draw without rewinding inside the constructor, or seed before deferred_init"
            )
        original_set_state(new_state)
        if not drawn:
            _recapture_start(graph)

    replaced = manual_seed, seed, get_rng_state, set_rng_state
    names = ("manual_seed", "seed", "get_rng_state", "set_rng_state")
    for name, function in zip(names, replaced):
        setattr(torch, name, function)
        setattr(torch.random, name, function)
    try:
        yield
        _refuse_a_generator_moved_directly(graph)
    finally:
        for name, function in zip(names, originals):
            setattr(torch, name, function)
            setattr(torch.random, name, function)


def _refuse_a_generator_moved_directly(graph: InitGraph) -> None:
    """Recording draws nothing from the CPU generator, and the calls above re-capture the start, so
    a state other than the start at the end was set on the generator object itself."""
    start = graph.rng_start["cpu"]
    with outside_recording():  # not an op of the model
        moved = start is not None and not torch.equal(torch.default_generator.get_state(), start)
    if moved:
        raise DeferredInitError(
            "the CPU generator's state was changed while recording by a call on the generator itself "
            "(torch.default_generator.manual_seed, .set_state or .seed), which the recording does not see, "
            "so replay could not reproduce eager's numbers. Call torch.manual_seed / torch.set_rng_state "
            "instead (before the first random op), or seed before deferred_init"
        )
