"""Eager's CPU generator after construction: the draws the real one owes, and reseeds.

Note: [Eager's generator after construction]
Eager construction draws from the default generator; deferred recording leaves it untouched. So
after `deferred_init` returns, the real generator lags eager's by the draws of the deferred random
ops, while eager code that runs meanwhile (`torch.randn`, `torch.manual_seed`) moves the real one.
A random op recorded later (`nn.init.normal_(model.w)` on a deferred model, or the constructor of a
second deferred model) must start from the state eager would have had there: the real state now,
moved on by the draws of every deferred random op since the last reseed. This ledger keeps that
list, and hears reseeds: `torch.manual_seed`, `torch.seed` and `torch.set_rng_state` (the same
functions as under `torch.random`) are wrapped from the first deferred recording on, for the rest
of the process, because the ledger outlives every scope; a wrapper calls the original, then
updates the ledger. `torch.get_rng_state` is wrapped too: a state saved while draws were owed
still owes them when it is set back (`torch.random.fork_rng` does exactly that). A reseed made
behind the wrappers (`torch.default_generator.manual_seed(s)`) is still seen when it changes the
generator's seed. Only the CPU generator is followed; CUDA streams continue as recorded.

Decisions, at a graph's start and at a random op recorded after construction, with real state S:
- nothing owed since the last reseed: S itself;
- the real generator has not moved since the last deferred random op: continue after that op (no
  restart when it is this stream's previous op; an `RngRestart(after_graph=...)` otherwise), which
  holds even across ops whose draw count depends on their values;
- otherwise S jumped over the owed draws. An op whose count depends on its values (trunc_normal_'s
  rejection sampling, randperm) is run from its eager state to measure it, while its model lives;
  when that fails too (its model is gone, or it used the cached normal sample: `normal_` of fewer
  than 16 elements), eager's state cannot be known and the op is refused.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import types
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.random

from .._torch_compat.generators import cpu_state_layout
from ..errors import DeferredInitError, MaterializationError
from ..graph import InitGraph, OpIndex, RngRestart
from .scope import outside_recording

KEY = "cpu"  # the one generator the ledger follows


@dataclass
class _Owed:
    """Consecutive random ops `first..last` of one graph's CPU stream, deferred since the last reseed.

    Holds the graph weakly and its op and tensor tables strongly: enough to count draws after the
    model is gone, not its external tensors."""

    graph: weakref.ReferenceType[InitGraph]
    ops: list
    tensors: dict
    stream: list[OpIndex]
    first: int
    last: int
    # Draws of ops first..counted_to, once counted: a later decision counts only the ops after them
    # (models built one after another without a reseed would otherwise recount every earlier op).
    counted_to: int = -1
    counted: int = 0


@dataclass
class _Ledger:
    owed: list[_Owed]
    mark: torch.Tensor | None = None  # the real state when the ledger last looked
    # Whether the real generator stood at `mark` when the last owed op was recorded: only then does
    # "unmoved since the mark" mean "unmoved since that op" (a decision that records no draw, or one
    # that found the generator moved, takes a new mark that says nothing about the owed ops).
    mark_follows_owed: bool = False
    # Whether the real generator's cached normal sample is eager's: not once eager code set it
    # while draws were owed (its value came from other words than eager's).
    cache_known: bool = True
    # get_rng_state results (by digest) → what was owed then, and whether the cache was eager's
    saved: OrderedDict[bytes, tuple[list[_Owed], bool]] = None  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        self.saved = OrderedDict()


_ledger = _Ledger(owed=[])
_lock = threading.RLock()
_SAVED_STATES = 64  # states from get_rng_state remembered with what they owed


def _seed_of(state: torch.Tensor) -> int:
    return int.from_bytes(state[:8].numpy().tobytes(), "little")  # see note [CPU generator state layout]


def _digest(state: torch.Tensor) -> bytes:
    return hashlib.blake2b(state.numpy().tobytes(), digest_size=16).digest()


def note_draw(graph: InitGraph, key: str, position: int) -> None:
    """Random op `position` of `graph`'s stream `key` was recorded: eager drew it, the real generator did not."""
    if key != KEY:
        return
    owed = _ledger.owed
    last = owed[-1] if owed else None
    if last is not None and last.last == position - 1 and last.graph() is graph:
        last.last = position  # the common case, one recording drawing in a row: no lock needed
        _ledger.mark_follows_owed = True
        return
    with _lock:
        owed = _ledger.owed
        owed.append(_Owed(weakref.ref(graph), graph.ops, graph.tensors, graph.random_streams[key], position, position))
        _ledger.mark_follows_owed = True


def forget(graph: InitGraph) -> None:
    """A recording that failed made no model: its draws are not owed (a retry starts where it did)."""
    with _lock:
        _ledger.owed = [part for part in _ledger.owed if part.graph() is not graph]


def start_of(graph: InitGraph, key: str, state: torch.Tensor, where: str) -> RngRestart | None:
    """Where `graph`'s stream `key` starts, given the real `state` now: None for `state` itself.

    Not refused when unknown: the recording may draw nothing, and inspection needs no values; the
    restart then carries the reason, and materializing a random value refuses with it."""
    if key != KEY:
        return None
    return _decide(graph, state, previous=None, where=f"the deferred recording started at {where}")


def restart_for(graph: InitGraph, key: str, position: int, state: torch.Tensor, where: str) -> RngRestart | None:
    """Where eager's state before random op `position` (recorded after construction, at `where`)
    comes from: None when it continues from the stream's previous op. Raises DeferredInitError when
    eager's state there cannot be known."""
    if key != KEY:
        return None
    restart = _decide(graph, state, previous=position - 1, where=where)
    if restart is not None and restart.unknown:
        raise DeferredInitError(restart.unknown, graph)
    return restart


def _decide(graph: InitGraph, state: torch.Tensor, previous: int | None, where: str) -> RngRestart | None:
    with _lock, outside_recording():
        ledger = _ledger
        if ledger.mark is not None and _seed_of(ledger.mark) != _seed_of(state):
            ledger.owed = []  # reseeded behind the wrappers
        moved = ledger.mark is None or not ledger.mark_follows_owed or not torch.equal(ledger.mark, state)
        owed = ledger.owed
        if not owed:
            ledger.cache_known = True
        elif ledger.mark is not None and not torch.equal(ledger.mark[_normal_cache()], state[_normal_cache()]):
            ledger.cache_known = False
        ledger.mark = state.clone()
        ledger.mark_follows_owed = not moved
        if not owed:
            return RngRestart(base=state.clone()) if previous is not None else None
        last = owed[-1]
        if not moved:
            if last.graph() is graph and previous is not None and last.last == previous:
                return None
            if last.graph() is not None:
                return RngRestart(after_graph=last.graph(), after_key=KEY, after_position=last.last)
        return _jumped(state, owed, where, ledger.cache_known)


def eager_state_now(graph: InitGraph, where: str) -> torch.Tensor:
    """The CPU generator state eager code would read now, while `graph` records (note [Reading the
    generator while recording] in record/seeding.py): past every random op deferred since the last
    reseed, which the real generator did not draw. Raises DeferredInitError when that cannot be known."""
    # replay sits above record; only this read needs it
    from ..replay.mt19937 import jump_state
    from ..replay.replay import eager_state_after

    position = len(graph.random_streams.get(KEY, []))
    restart = restart_for(graph, KEY, position, torch.default_generator.get_state(), where)
    try:
        if restart is None:  # it continues after this recording's previous random op
            return eager_state_after(graph, KEY, position - 1)
        if restart.after_graph is not None:
            return eager_state_after(restart.after_graph, restart.after_key, restart.after_position)
    except MaterializationError as error:  # an earlier state of the stream is unknown: say where it was read
        raise DeferredInitError(
            f"{where} reads the CPU generator, whose eager state there cannot be known: {error}", graph
        ) from error
    assert restart.base is not None  # restart_for raised for an unknown state
    return jump_state(restart.base, restart.jump) if restart.jump else restart.base


def _jumped(state: torch.Tensor, owed: list[_Owed], where: str, cache_known: bool) -> RngRestart:
    # replay sits above record; only this decision needs it
    from ..replay.draws import draw_count
    from ..replay.replay import eager_draw_count

    total = 0
    for part in owed:
        shim = types.SimpleNamespace(tensors=part.tensors)
        if part.counted_to < part.first - 1:
            part.counted_to, part.counted = part.first - 1, 0
        ops, stream = part.ops, part.stream
        counted_to, counted = part.counted_to, part.counted  # written back below (or before a refusal)
        for position in range(counted_to + 1, part.last + 1):
            op = ops[stream[position]]
            count = draw_count(shim, op)  # type: ignore[arg-type]  # shim: draw_count reads only .tensors
            if count is not None:
                counted_to, counted = position, counted + count
                continue
            graph = part.graph()
            if graph is not None:  # value-dependent: measured by running it
                count = eager_draw_count(graph, KEY, position)
            if count is None:
                part.counted_to, part.counted = counted_to, counted
                why = (
                    "its model is gone, so it cannot be run to count them"
                    if graph is None
                    else "running it to count them showed it uses the generator's cached normal sample "
                    "(normal_ of fewer than 16 elements) or draws more than can be counted"
                )
                return RngRestart(
                    unknown=(
                        f"{where} draws from the CPU generator, where eager code would find it past every "
                        f"random op deferred since the last torch.manual_seed; but the real generator "
                        f"moved since the last of them (eager random draws or torch.set_rng_state), and "
                        f"the deferred {op.label} (recorded at {op.source or 'an unknown line'}) takes a "
                        f"number of draws that depends on its values; {why}. So eager's state there "
                        f"cannot be known. Call torch.manual_seed(...) before that point, or do the "
                        f"eager draws after it"
                    )
                )
            counted_to, counted = position, counted + count
        part.counted_to, part.counted = counted_to, counted
        total += part.counted
    return RngRestart(base=state.clone(), jump=total, cache_known=cache_known)


def _reseeded(state: torch.Tensor | None) -> None:
    """The real generator was set: it owes what `state` owed when it was saved (nothing for a seed).

    With nothing owed, the state now is eager's; with draws owed, the next decision must jump over
    them, never continue after them (the real generator was not where it is when they were drawn)."""
    with _lock, outside_recording():
        owed, cache_known = _ledger.saved.get(_digest(state), ([], True)) if state is not None else ([], True)
        _ledger.owed = [replace(part) for part in owed]
        _ledger.mark = None if _ledger.owed else torch.default_generator.get_state()
        _ledger.mark_follows_owed = False
        _ledger.cache_known = cache_known or not _ledger.owed


def owes_nothing(state: torch.Tensor) -> None:
    """`state` is eager's own (computed, not read off the real generator): set back as bytes, it owes
    no draws, whatever a state of the same bytes owed when an earlier recording saved it."""
    with _lock, outside_recording():
        if _ledger.saved:
            _ledger.saved.pop(_digest(state), None)


def _saved(state: torch.Tensor) -> None:
    with _lock, outside_recording():
        saved = _ledger.saved
        if not _ledger.owed:
            saved.pop(_digest(state), None) if saved else None
            return
        mark = _ledger.mark
        cache_known = _ledger.cache_known and (
            mark is None or torch.equal(mark[_normal_cache()], state[_normal_cache()])
        )
        saved[_digest(state)] = ([replace(part) for part in _ledger.owed], cache_known)
        while len(saved) > _SAVED_STATES:
            saved.popitem(last=False)


_installed = False


def install_reseed_hooks() -> None:
    """Wrap torch's seeding functions so the ledger hears reseeds (once per process; see the note)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        manual_seed, seed = torch.random.manual_seed, torch.random.seed
        set_rng_state, get_rng_state = torch.random.set_rng_state, torch.random.get_rng_state

        @functools.wraps(manual_seed)
        def wrapped_manual_seed(value: Any) -> torch.Generator:
            generator = manual_seed(value)
            _reseeded(None)
            return generator

        @functools.wraps(seed)
        def wrapped_seed() -> int:
            value = seed()
            _reseeded(None)
            return value

        @functools.wraps(set_rng_state)
        def wrapped_set_rng_state(new_state: torch.Tensor) -> None:
            set_rng_state(new_state)
            _reseeded(new_state)

        @functools.wraps(get_rng_state)
        def wrapped_get_rng_state() -> torch.Tensor:
            state = get_rng_state()
            _saved(state)
            return state

        for name, function in (
            ("manual_seed", wrapped_manual_seed),
            ("seed", wrapped_seed),
            ("set_rng_state", wrapped_set_rng_state),
            ("get_rng_state", wrapped_get_rng_state),
        ):
            setattr(torch.random, name, function)
            setattr(torch, name, function)


def _normal_cache() -> slice:
    """The cached normal samples in a CPU generator state (note [CPU generator state layout])."""
    return cpu_state_layout().normal_cache
