"""`torch.manual_seed` called inside a deferred scope (a `%%deferred` cell that starts by seeding, a
constructor that seeds itself or each of its layers, `torch.random.fork_rng`).

Replay reproduces eager's random numbers from the generator states captured when recording began
(`InitGraph.rng_start`) plus the draws of the random ops recorded since. A reseed before the first
random op only moves that starting point, so the start states are captured again after it. A
reseed after random ops were recorded splits the CPU stream: the next random op starts from a
restart (`RngRestart`) instead of following the previous one. Inside the scope only; undone on
every exit.

Note: [Reseeding while recording]
After a reseed eager's CPU generator is in a state the real one shows: recording draws nothing, so
the real generator is exactly where the reseed put it. What each call leaves, and where the next
recorded random op starts, is what the ledger of record/rng_ledger.py already decides for ops
recorded after construction (note [Eager's generator after construction]), asked at the call:
- `torch.manual_seed(s)`, `torch.seed()`: the seeded state;
- `torch.set_rng_state(state)`: that state, jumped over the deferred draws it owed when it was
  read by `torch.get_rng_state` (a rewind: `torch.random.fork_rng` on exit gives back the state
  from before its block, past the draws recorded before the block);
- the draws recorded before the reseed are no longer owed by the real generator.
A restart is recorded at the position the next CPU random op will take (replaced by a later
reseed before that op; an op recorded after construction decides its own). `torch.manual_seed`
also reseeds CUDA generators, whose streams are not followed that way: it is refused when a CUDA
stream already has random ops, and moves the start of the others. `torch.default_generator`'s own
`manual_seed`, `set_state` and `seed` are C methods, not wrappable: the state they leave is seen at
the end of the recording, which is then refused.

Note: [Reading the generator while recording]
Recording draws nothing, so while a constructor records, the real generator lags eager's by the
draws of the random ops recorded so far (and of earlier deferred recordings it still owes).
`torch.get_rng_state()` there returns eager's state instead (the real one jumped over those draws,
or replayed up to there: `rng_ledger.eager_state_now`), so a constructor that keeps it (a buffer)
or seeds a generator of its own from it sees eager's numbers. Setting it back later is then a
reseed to a known state. `torch.default_generator.get_state()` is a C method, not wrappable: it
returns the real generator's state.

Note: wraps `torch.manual_seed` (= `torch.random.manual_seed`) and its kin, looked up at call time by callers
such as `transformers.set_seed`; re-check on upgrades (tests/explorer/record/test_deferred_block.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.random

from .._torch_compat.fake import FakeTensor
from ..errors import DeferredInitError
from ..graph import InitGraph
from . import rng_ledger
from .generators import capture_start_state
from .scope import active_scope, outside_recording
from .source import user_location


def _drawn(graph: InitGraph) -> int:
    return sum(len(ops) for ops in graph.random_streams.values())


def _recapture_start(graph: InitGraph, call: str) -> None:
    """The generator states as they are now become `graph`'s start (nothing was drawn yet): the
    real CPU state, or where the ledger says eager's is, past draws a state set back still owes (as
    at the start of a recording: `record.deferred._recording_into`)."""
    real = graph.rng_start["cpu"] = torch.default_generator.get_state()
    graph.rng_restarts.clear()  # the call, not earlier deferred recordings, now decides the start
    restart = rng_ledger.start_of(graph, "cpu", real, f"{call} at {user_location(3) or '<unknown source>'}")
    if restart is not None:
        graph.rng_restarts["cpu"] = {0: restart}
    for key in list(graph.rng_start):
        if key != "cpu":
            graph.rng_start[key] = capture_start_state(key)


def _split_streams(graph: InitGraph, call: str, reseeds_cuda: bool) -> None:
    """Random ops recorded from here on start where eager's generators are after `call`, made after
    some were recorded (note [Reseeding while recording]). Raises DeferredInitError when a CUDA
    stream with random ops would be reseeded, or eager's CPU state cannot be known."""
    where = f"{call} at {user_location(2) or '<unknown source>'}"
    if reseeds_cuda:
        for key, ops in graph.random_streams.items():
            if key != "cpu" and ops:
                raise DeferredInitError(
                    f"{where} reseeds the {key} generator, after {len(ops)} random op(s) were recorded on "
                    f"it; replay follows a CUDA stream from its start only, so eager's numbers after the "
                    "reseed could not be reproduced. Seed before deferred_init / the deferred block (or "
                    "before the first CUDA random op)",
                    graph,
                )
        for key in graph.rng_start:
            if key != "cpu" and not graph.random_streams.get(key):
                graph.rng_start[key] = capture_start_state(key)
    position = len(graph.random_streams.get("cpu", []))
    restart = rng_ledger.restart_for(graph, "cpu", position, torch.default_generator.get_state(), where)
    restarts = graph.rng_restarts.setdefault("cpu", {})
    if restart is None:
        restarts.pop(position, None)
    else:
        restarts[position] = restart
    if graph.replay_state is not None:  # a value read may have cached states from here on
        graph.replay_state.forget_states("cpu", position)


@contextlib.contextmanager
def seeding_moves_the_start(graph: InitGraph) -> Iterator[None]:
    """While the block runs, `torch.manual_seed`, `torch.seed` or `torch.set_rng_state` before any
    random op re-captures `graph`'s start states; after one, the next random op starts where it
    left eager's generator (note [Reseeding while recording])."""
    originals = torch.random.manual_seed, torch.random.seed, torch.random.get_rng_state, torch.random.set_rng_state
    original_manual_seed, original_seed, original_get_state, original_set_state = originals
    # Note: [States handed out while recording]
    # `torch.get_rng_state()` while recording hands out eager's state, computed (the real generator
    # drew nothing). Given back (`torch.random.fork_rng` on exit), those bytes set the real generator
    # at eager's state there, owing nothing: the ledger forgets what an earlier recording's state of
    # the same bytes owed (`rng_ledger.owes_nothing`), which a second recording of the same
    # constructor would otherwise take as owed. Setting eager's state itself, not the real state
    # with the draws owed since, keeps a draw whose count cannot be known (a `randn` of fewer than 16
    # elements) out of the way; the real generator is then left where eager's was at that point.
    # states handed out by get_rng_state, with the draws and the calls here made by then
    read_at: dict[int, tuple[torch.Tensor, int, int]] = {}
    # the real CPU state after the last of these calls (recording draws nothing), and how many
    left: list[torch.Tensor | None] = [graph.rng_start["cpu"]]
    calls = [0]

    def moved(call: str, reseeds_cuda: bool) -> None:
        if _drawn(graph):
            _split_streams(graph, call, reseeds_cuda)
        else:
            _recapture_start(graph, call)
        left[0] = torch.default_generator.get_state()
        calls[0] += 1

    def manual_seed(seed: int) -> torch.Generator:
        _refuse_a_generator_moved_directly(left[0])
        generator = original_manual_seed(seed)
        moved(f"torch.manual_seed({seed})", reseeds_cuda=True)
        return generator

    def seed() -> int:
        _refuse_a_generator_moved_directly(left[0])
        value = original_seed()
        moved("torch.seed()", reseeds_cuda=True)
        return value

    def get_rng_state() -> torch.Tensor:
        _refuse_a_generator_moved_directly(left[0])
        state = original_get_state()  # the ledger hears it: a state read while draws were owed
        if graph.random_streams.get("cpu") or graph.rng_restarts.get("cpu"):
            state = _eager_state_now(graph, f"torch.get_rng_state at {user_location(2) or '<unknown source>'}")
            rng_ledger.owes_nothing(state)
        read_at[id(state)] = (state, _drawn(graph), calls[0])
        return state

    def set_rng_state(new_state: torch.Tensor) -> None:
        _refuse_a_generator_moved_directly(left[0])
        read = read_at.get(id(new_state))
        if read is not None and read[0] is new_state and read[1:] == (_drawn(graph), calls[0]):
            return  # a no-op in eager: nothing was drawn or set since it was read
        original_set_state(_true_value(new_state))  # note [States handed out while recording]
        moved("torch.set_rng_state", reseeds_cuda=False)

    replaced = manual_seed, seed, get_rng_state, set_rng_state
    names = ("manual_seed", "seed", "get_rng_state", "set_rng_state")
    for name, function in zip(names, replaced):
        setattr(torch, name, function)
        setattr(torch.random, name, function)
    try:
        yield
        _refuse_a_generator_moved_directly(left[0])
    finally:
        for name, function in zip(names, originals):
            setattr(torch, name, function)
            setattr(torch.random, name, function)


@contextlib.contextmanager
def eager_state_reads(graph: InitGraph) -> Iterator[None]:
    """While the block runs (a `deferred(model)` block, extending finished `graph`),
    `torch.get_rng_state()` returns eager's state (note [Reading the generator while recording]);
    reseeds there are the ledger's to hear, as after construction."""
    original = torch.random.get_rng_state

    def get_rng_state() -> torch.Tensor:
        original()  # the ledger hears the read
        where = f"torch.get_rng_state at {user_location(2) or '<unknown source>'}"
        with outside_recording():
            state = rng_ledger.eager_state_now(graph, where)
        rng_ledger.owes_nothing(state)  # eager's own: set back as bytes, it owes nothing
        return state

    torch.get_rng_state = torch.random.get_rng_state = get_rng_state
    try:
        yield
    finally:
        torch.get_rng_state = torch.random.get_rng_state = original


def _true_value(state: torch.Tensor) -> torch.Tensor:
    """A state the constructor computed (`get_rng_state().clone()` is a fake): its real bytes."""
    scope = active_scope()
    if scope is None or not isinstance(state, FakeTensor):
        return state
    return scope.read_value(state)


def _eager_state_now(graph: InitGraph, where: str) -> torch.Tensor:
    """note [Reading the generator while recording]"""
    with outside_recording():
        return rng_ledger.eager_state_now(graph, where)


def _refuse_a_generator_moved_directly(left: torch.Tensor | None) -> None:
    """Recording draws nothing from the CPU generator, so a state other than the one the calls
    above left (`left`) was set on the generator object itself."""
    with outside_recording():  # not an op of the model
        moved = left is not None and not torch.equal(torch.default_generator.get_state(), left)
    if moved:
        raise DeferredInitError(
            "the CPU generator's state was changed while recording by a call on the generator itself "
            "(torch.default_generator.manual_seed, .set_state or .seed), which the recording does not see, "
            "so replay could not reproduce eager's numbers. Call torch.manual_seed / torch.set_rng_state "
            "instead, or seed before deferred_init"
        )
