"""Random-number parity between replay and eager construction.

Eager construction draws every random op, in order, from the default generator of the op's device.
`deferred_init` snapshots those generators when it starts and numbers each random op in its
device's stream. To replay random op k with rng="eager", the generator is set to the state it had
just before op k. That state is reached from the nearest cached state before k: on the CPU by
*jumping* the Mersenne Twister over the draws of the ops in between (`draws.draw_count`,
`mt19937.jump_state`: milliseconds, whatever the distance); on a CUDA stream by adding the Philox
offset increments of the ops in between to the offset, the seed unchanged
(`philox.StreamIncrements`, with the launch limits of the device the stream's ops run on). An op
whose count or increment is not known in advance (value-dependent, reading the cached normal
sample, not modelled, or its CUDA device absent here) is re-run on a scratch tensor of its recorded
layout instead; an op whose count may depend on its inputs' values (`poisson`, `rrelu`: note [Draws
fixed by sizes] in graph.py) is re-run on eager's values of them, replayed for it.
Every state reached is cached, so a later click on an earlier layer starts from a
known state. With rng="fast" each random op instead gets a seed derived from the start state and
its position, so values do not depend on what else is materialized or in which order.

A random op given a generator of the constructor's own carries that generator's state instead
(note [A constructor's own generators] in record/private_generators.py): `own_generator` makes a
new generator in it, so the op draws eager's values in either mode.

A `RngSession` holds the generators a replay draws from: a CPU generator of its own (note [Replay
draws from generators of its own]), and the default generators it had to move, whose states it
puts back when it ends, whatever happens.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, cast, get_args

import torch

from .._torch_compat.dispatch import OpOverload
from ..errors import MaterializationError
from ..graph import GeneratorState, InitGraph, OpIndex, RngRestart, accepts_generator
from ..record.generators import default_generator, state_of
from .draws import draw_count
from .mt19937 import jump_state
from .philox import DeviceProperties, StreamIncrements, advanced_state, device_properties

# How replay reaches random values: "eager" reproduces eager construction bit for bit (each random op
# draws from the generator state eager construction had before it); "fast" seeds each random op from
# its position alone (reproducible, independent of order, not eager's values).
RngMode = Literal["eager", "fast"]
RNG_MODES: tuple[RngMode, ...] = get_args(RngMode)

# (graph, stream key, position) → eager's generator state right after that random op of that graph.
StateAfter = Callable[[InitGraph, str, int], torch.Tensor]

# Stream key ('cuda:1') → the launch limits of that device, None where it is absent.
DevicePropertiesOf = Callable[[str], DeviceProperties | None]

# Replays move the process-wide default generators: one at a time.
GENERATOR_LOCK = threading.RLock()


@dataclass
class JumpStats:
    """How eager states were reached for one graph: jumps (how many, how far, how long) and
    scratch runs."""

    count: int = 0
    draws: int = 0  # 32-bit draws CPU jumps went over
    seconds: float = 0.0
    scratch_runs: int = 0  # ops of unknown draw count or offset increment run on scratch instead
    offsets: int = 0  # Philox offset CUDA jumps added

    def add(self, draws: int, seconds: float) -> None:
        self.count += 1
        self.draws += draws
        self.seconds += seconds

    def add_offset(self, offset: int, seconds: float) -> None:
        self.count += 1
        self.offsets += offset
        self.seconds += seconds


class RngStreams:
    """Per-graph cache of generator states before each random op (state k = before the k-th op)."""

    def __init__(
        self,
        graph: InitGraph,
        state_after: StateAfter | None = None,
        device_properties_of: DevicePropertiesOf = device_properties,
    ) -> None:
        self.graph = graph
        self._state_after = state_after
        self._device_properties_of = device_properties_of
        self._states: dict[str, dict[int, torch.Tensor]] = {}
        self._known: dict[str, list[int]] = {}  # cached positions of each stream, sorted
        self._steps: dict[str, list[int | None]] = {}
        self._devices: dict[str, StreamIncrements] = {}  # per CUDA stream, on its device's launch limits
        self._salts: dict[str, int] = {}
        self.jumps = JumpStats()

    def cache(self, key: str) -> dict[int, torch.Tensor]:
        """States of stream `key` by position; position 0 is the state when deferred_init started
        (unless a restart says otherwise: `restarts`)."""
        states = self._states.get(key)
        if states is None:
            if 0 in self.restarts(key):
                states, self._known[key] = {}, []
            else:
                # None only for a device absent when recording, whose streams check_replayable refuses
                states, self._known[key] = {0: cast(torch.Tensor, self.graph.rng_start[key])}, [0]
            self._states[key] = states
        return states

    def forget_from(self, key: str, position: int) -> None:
        """Drop cached states at positions >= `position` of stream `key`."""
        states = self._states.get(key)
        if states is None:
            return
        for stale in [p for p in states if p >= position]:
            del states[stale]
        self._known[key] = [p for p in self._known[key] if p < position]

    def restarts(self, key: str) -> dict[int, RngRestart]:
        """Positions of stream `key` whose state does not follow from the previous op (note
        [Eager's generator after construction]), and where each state comes from."""
        return self.graph.rng_restarts.get(key, {})

    def _check_cache_readers(self, key: str, position: int) -> None:
        """Refuse to reach op `position` from a restart whose cached normal sample is not eager's
        when an op from there to `position` may read it (draw count unknown: normal_ below 16
        elements, and ops run on scratch)."""
        restarts = self.restarts(key)
        start = max((p for p in restarts if p <= position), default=None)
        if start is None or restarts[start].cache_known:
            return
        ops = self.graph.random_streams.get(key, [])
        for index in range(start, min(position + 1, len(ops))):
            if self.draws(key, index) is None:
                op = self.graph.ops[ops[index]]
                raise MaterializationError(
                    f"{op.label} (recorded at {op.source or 'an unknown line'}) may read the CPU "
                    "generator's cached normal sample, and eager code set that sample (a torch.randn "
                    "or normal_ of fewer than 16 elements, or torch.set_rng_state) while the generator "
                    "owed deferred draws, so eager's value of it is not known here. Call "
                    "torch.manual_seed(...) before recording this op, or materialize before those eager draws"
                )

    def _restart_state(self, key: str, position: int) -> torch.Tensor:
        restart = self.restarts(key)[position]
        if restart.unknown:
            raise MaterializationError(restart.unknown)
        if restart.after_graph is not None:
            if self._state_after is None:
                raise MaterializationError(
                    f"random op {position} of the {key} stream continues another "
                    "recording, which this replay cannot reach"
                )
            state = self._state_after(restart.after_graph, restart.after_key, restart.after_position)
        else:
            assert restart.base is not None
            state = self._jump(key, restart.base, restart.jump) if restart.jump else restart.base
        self.remember(key, position, state)
        return state

    def remember(self, key: str, position: int, state: torch.Tensor) -> None:
        cache = self.cache(key)
        if position not in cache:
            cache[position] = state
            bisect.insort(self._known.setdefault(key, [0]), position)

    def draws(self, key: str, position: int) -> int | None:
        """32-bit draws random op `position` of CPU stream `key` takes; None: not known (or not CPU)."""
        return self.step(key, position) if key == "cpu" else None

    def step(self, key: str, position: int) -> int | None:
        """How far random op `position` moves stream `key`'s generator, when known in advance: 32-bit
        draws on the CPU (`draws.draw_count`), the Philox offset on CUDA (`philox.StreamIncrements`,
        on the launch limits of that device); None: not known, the op is run on scratch."""
        steps = self._steps.setdefault(key, [])
        if len(steps) <= position:  # the stream grows while the constructor still runs (value reads)
            graph_ops = self.graph.ops
            ops = [graph_ops[index] for index in self.graph.random_streams.get(key, [])[len(steps) : position + 1]]
            if key == "cpu":
                steps.extend([draw_count(self.graph, op) for op in ops])
            elif key.startswith("cuda:"):
                increments = self._increments(key)
                steps.extend([increments(op) for op in ops])
            else:
                steps.extend([None] * len(ops))
        return steps[position]

    def _increments(self, key: str) -> StreamIncrements:
        increments = self._devices.get(key)
        if increments is None:
            increments = self._devices[key] = StreamIncrements(self.graph, self._device_properties_of(key))
        return increments

    def state_before(
        self, key: str, position: int, run_scratch: Callable[[str, int, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """The state of stream `key` before random op `position`: from the nearest cached state,
        jumping over ops of known draw count and running the others (`run_scratch(key, p, state)`
        returns the state after op p)."""
        cache = self.cache(key)
        self._check_cache_readers(key, position)
        if position in cache:
            return cache[position]
        known = self._known[key]
        found = bisect.bisect_right(known, position)
        at = known[found - 1] if found else -1
        restart = max((p for p in self.restarts(key) if at < p <= position), default=None)
        if restart is not None:
            at = restart
            state = self._restart_state(key, restart)
        elif at < 0:
            raise AssertionError(f"stream {key} has neither a start state nor a restart at 0")
        else:
            state = cache[at]
        pending = 0
        if at < position:
            self.step(key, position - 1)  # every step up to `position`, worked out in one pass
        steps = self._steps.get(key, [])
        while at < position:
            ahead = steps[at:position]
            run = ahead.index(None) if None in ahead else len(ahead)
            if run:  # ops of known steps, summed at once (a late layer has a thousand before it)
                pending, at = pending + sum(cast("list[int]", ahead[:run])), at + run
                continue
            if pending:
                state, pending = self._jump(key, state, pending), 0
                self.remember(key, at, state)
            state = run_scratch(key, at, state)
            self.jumps.scratch_runs += 1
            at += 1
            self.remember(key, at, state)
        if pending:
            state = self._jump(key, state, pending)
        self.remember(key, position, state)
        return state

    def state_after(
        self, key: str, position: int, run_scratch: Callable[[str, int, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """The state of stream `key` right after random op `position` — not the state before
        `position + 1`, which a restart there may put elsewhere."""
        state = self.state_before(key, position, run_scratch)
        count = self.step(key, position)
        return self._jump(key, state, count) if count is not None else run_scratch(key, position, state)

    def _jump(self, key: str, state: torch.Tensor, distance: int) -> torch.Tensor:
        """`state` of stream `key` moved `distance` ahead: draws on the CPU, offset on CUDA."""
        started = time.perf_counter()
        if key == "cpu":
            jumped = jump_state(state, distance)
            self.jumps.add(distance, time.perf_counter() - started)
        else:
            jumped = advanced_state(state, distance)
            self.jumps.add_offset(distance, time.perf_counter() - started)
        return jumped

    def fast_seed(self, key: str, position: int) -> int:
        """A seed for random op `position` of stream `key`, fixed by the start state alone."""
        salt = self._salts.get(key)
        if salt is None:
            start = self.graph.rng_start.get(key)
            raw = start.numpy().tobytes() if start is not None else key.encode()
            salt = self._salts[key] = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")
        digest = hashlib.blake2b(f"{salt}:{key}:{position}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & ((1 << 63) - 1)


# Note: [Replay draws from generators of its own]
# A replay that set the process-wide CPU generator and drew from it would lose its place whenever
# other code draws meanwhile (a notebook cell while the explorer's Materialize bar runs in its
# thread): `GENERATOR_LOCK` is a lock user code never takes. So a CPU random op that takes a
# `generator=` draws from a generator of the session's own, set to eager's state, and the
# process's generator is never touched. Ops without a generator argument (the dropout family) and
# CUDA streams still use the device's default generator, saved and put back at the end; `to_fx`
# programs, which call the recorded ops as they are, ask for that too (`own_generators=False`).
ScratchRun = Callable[[OpIndex, dict], None]  # (random op, keyword arguments adding its generator)


class RngSession:
    """The generators one replay draws from (note [Replay draws from generators of its own]); the
    default generators it moved are put back afterwards."""

    def __init__(
        self, streams: RngStreams, mode: RngMode, run_scratch: ScratchRun, *, own_generators: bool = True
    ) -> None:
        self.streams = streams
        self.mode = mode
        # With rng="fast", random ops that a value-dependent shape was computed from still draw
        # eager's numbers (graph.value_feeding_random_ops), so shapes match the recording.
        graph = streams.graph
        self.eager_anyway = {graph.ops[i].stream for i in graph.value_feeding_random_ops()} if mode == "fast" else set()
        self.run_scratch = run_scratch
        self._own_generators = own_generators
        self._own: dict[str, torch.Generator] = {}
        self._saved: dict[str, torch.Tensor] = {}
        self._position: dict[tuple[str, int], int] = {}  # (stream, id(generator)) → where it is, if we set it
        self._drawing_now: dict[str, torch.Generator] = {}  # stream → the generator its current op draws from

    def __enter__(self) -> RngSession:
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
            self._saved[key] = state_of(generator)
        return generator

    def _drawing(self, key: str, func: OpOverload | None) -> tuple[torch.Generator, dict]:
        """The generator random op `func` draws from on `key`'s device, and the keyword arguments
        that make it draw from it (note [Replay draws from generators of its own])."""
        if self._own_generators and key == "cpu" and func is not None and accepts_generator(func):
            generator = self._own.get(key)
            if generator is None:
                generator = self._own[key] = torch.Generator()
            return generator, {"generator": generator}
        return self._generator(key), {}

    def before_random_op(self, key: str, position: int, exec_key: str, func: OpOverload | None = None) -> dict:
        """Put the generator that will run random op `position` (`func`) of stream `key` where it
        must be; returns the keyword arguments that make the op draw from it."""
        if self.mode == "fast" and (key, position) not in self.eager_anyway:
            generator, extra = self._drawing(exec_key, func)
            generator.manual_seed(self.streams.fast_seed(key, position))
            return extra
        generator, extra = self._drawing(key, func)
        self._drawing_now[key] = generator
        if self._position.get((key, id(generator))) != position:
            generator.set_state(self.state_before(key, position))
            self._position[(key, id(generator))] = position
        return extra

    def state_before(self, key: str, position: int) -> torch.Tensor:
        """Eager's state of stream `key` before random op `position` (the generators of `key` may
        be moved on the way, and are then no longer at any known position)."""
        return self.streams.state_before(key, position, self._scratch_step)

    def state_after(self, key: str, position: int) -> torch.Tensor:
        """Eager's state of stream `key` right after random op `position`."""
        return self.streams.state_after(key, position, self._scratch_step)

    def private_generator(self, key: str, position: int) -> torch.Generator | None:
        """A new generator in eager's state before CPU random op `position`, for an op run off the
        session's generator (a parallel fill); None when the op's draw count is not known, since
        the ops after it would then need it run on the session's generator."""
        if key != "cpu" or self.streams.draws(key, position) is None:
            return None
        generator = torch.Generator()
        generator.set_state(self.state_before(key, position))
        return generator

    def fill_generator(self, key: str, position: int) -> torch.Generator | None:
        """The generator a parallel fill of random op `position` draws from (None: run it here)."""
        if self.mode == "fast" and (key, position) not in self.eager_anyway:
            generator = torch.Generator()
            generator.manual_seed(self.streams.fast_seed(key, position))
            return generator
        return self.private_generator(key, position)

    def _scratch_step(self, key: str, position: int, state: torch.Tensor) -> torch.Tensor:
        index = self.streams.graph.random_streams[key][position]
        generator, extra = self._drawing(key, self.streams.graph.ops[index].func)
        generator.set_state(state)
        for moved in [slot for slot in self._position if slot[0] == key]:
            del self._position[moved]
        self.run_scratch(index, extra)
        return state_of(generator)

    def after_random_op(self, key: str, position: int) -> None:
        if self.mode == "fast" and (key, position) not in self.eager_anyway:
            return
        generator = self._drawing_now.get(key) or self._generator(key)
        if position + 1 in self.streams.restarts(key):
            self._position.pop((key, id(generator)), None)  # the next op starts elsewhere
            return
        self._position[(key, id(generator))] = position + 1
        cache = self.streams.cache(key)
        if position + 1 not in cache:
            self.streams.remember(key, position + 1, state_of(generator))


def own_generator(recorded: GeneratorState, exec_device: torch.device) -> torch.Generator | None:
    """A new generator for a random op recorded with a constructor's own generator, run on
    `exec_device`: in the recorded state when that is the recorded device type (eager's values),
    seeded from that state on another type (rng="fast" on another device), None on meta."""
    if exec_device.type == "meta":
        return None
    generator = torch.Generator(device=exec_device)
    if exec_device.type == torch.device(recorded.device).type:
        generator.set_state(recorded.state)
    else:
        digest = hashlib.blake2b(recorded.state.numpy().tobytes(), digest_size=8).digest()
        generator.manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))
    return generator
