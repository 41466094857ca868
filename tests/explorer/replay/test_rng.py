"""`explorer.replay.rng` on its own: where the generator is put before each random op, what is
cached, and what is restored.

The parity suites check values end to end; these pin the generator states themselves against the
states eager construction passes through, op by op.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explorer import deferred_init, materialize_module, materialize_tensor
from explorer.record.fake import handle_of
from explorer.replay.replay import Replay
from explorer.replay.rng import RNG_MODES, RngSession, RngStreams
from explorer.replay.routing import route_devices


class Draws(nn.Module):
    """Seven random ops of different kinds, sizes and dtypes, in a known order."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.empty(5).uniform_())
        self.b = nn.Parameter(torch.empty(17, dtype=torch.float64).normal_())
        self.register_buffer("c", torch.randn(3, 7))
        self.register_buffer("d", torch.randint(0, 10, (40,)))
        self.e = nn.Parameter(torch.empty(33, dtype=torch.bfloat16).uniform_(-1, 1))
        self.register_buffer("f", torch.rand(2, 2).bernoulli_(0.5))


def eager_states(seed: int) -> list[torch.Tensor]:
    """The CPU generator state before each random op of `Draws`, and after the last."""
    states: list[torch.Tensor] = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if torch.Tag.nondeterministic_seeded in func.tags:
                states.append(torch.get_rng_state())
            return func(*args, **(kwargs or {}))

    torch.manual_seed(seed)
    with Spy():
        Draws()
    states.append(torch.get_rng_state())
    return states


@pytest.fixture
def deferred(restore_rng):
    torch.manual_seed(1234)
    module = deferred_init(Draws)
    graph = handle_of(module.a).graph
    return module, graph


def session(graph, mode="eager") -> tuple[RngSession, RngStreams]:
    streams = RngStreams(graph)
    replay = Replay(graph, route_devices(None, mode), remember=False)
    return RngSession(streams, mode, replay.run_scratch), streams


def test_every_random_op_is_numbered_in_the_cpu_stream(deferred) -> None:
    _, graph = deferred
    assert list(graph.random_streams) == ["cpu"]
    assert len(graph.random_streams["cpu"]) == len(eager_states(1234)) - 1


def test_state_before_each_op_is_the_eager_state_before_it(deferred, restore_rng) -> None:
    _, graph = deferred
    expected = eager_states(1234)
    rng, _ = session(graph)
    with rng:
        for position in reversed(range(len(expected) - 1)):  # far first, then back: cache or re-reach
            rng.before_random_op("cpu", position, "cpu")
            assert torch.equal(torch.get_rng_state(), expected[position]), f"position {position}"


def test_states_reached_are_cached_and_reused_without_jumping_again(deferred) -> None:
    _, graph = deferred
    expected = eager_states(1234)
    rng, streams = session(graph)
    with rng:
        rng.before_random_op("cpu", 5, "cpu")
    cache = streams.cache("cpu")
    assert {0, 5} <= set(cache)
    for position, state in cache.items():
        assert torch.equal(state, expected[position]), f"position {position}"
    jumps = streams.jumps.count
    assert jumps >= 1  # uniform_, normal_ (17 float64), rand: all of known count
    again = RngSession(streams, "eager", Replay(graph, route_devices(None, "eager"), remember=False).run_scratch)
    with again:
        again.before_random_op("cpu", 5, "cpu")
        assert torch.equal(torch.get_rng_state(), expected[5])
    assert streams.jumps.count == jumps


def test_draw_counts_of_the_recorded_ops(deferred) -> None:
    _, graph = deferred
    streams = RngStreams(graph)
    counts = [streams.draws("cpu", p) for p in range(7)]
    # uniform_ 5; normal_ 17 float64: 2 x (17 + 16-value tail); randn 21: 21 + 16; randint 40;
    # bfloat16 uniform_ 33; rand 4; bernoulli_(0.5) on 4: 2 per element, or MKL's one seed draw.
    assert counts[:6] == [5, 2 * (17 + 16), 21 + 16, 40, 33, 4]
    assert counts[6] in (8, 1)


class SmallNormals(nn.Module):
    """normal_ below 16 elements reads and writes the cached normal sample: its count is unknown."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.empty(100).uniform_())
        self.b = nn.Parameter(torch.empty(3).normal_())
        self.c = nn.Parameter(torch.empty(1000).uniform_())
        self.d = nn.Parameter(torch.empty(5, dtype=torch.float64).normal_())
        self.e = nn.Parameter(torch.empty(64).normal_())


def test_ops_of_unknown_draw_count_are_run_on_scratch_and_the_rest_jumped(restore_rng) -> None:
    torch.manual_seed(77)
    expected = [p.detach().clone() for p in SmallNormals().parameters()]
    torch.manual_seed(77)
    module = deferred_init(SmallNormals)
    graph = handle_of(module.a).graph
    streams = RngStreams(graph)
    assert [streams.draws("cpu", p) for p in range(5)] == [100, None, 1000, None, 64]
    rng = RngSession(streams, "eager", Replay(graph, route_devices(None, "eager"), remember=False).run_scratch)
    with rng:
        rng.before_random_op("cpu", 4, "cpu")
        drawn = torch.empty(64).normal_()
    assert torch.equal(drawn, expected[4])
    assert streams.jumps.count >= 1
    assert {1, 2, 3, 4} <= set(streams.cache("cpu"))  # before and after each scratch run


def test_the_users_generator_state_is_restored_after_a_session(deferred) -> None:
    _, graph = deferred
    torch.manual_seed(99)
    before = torch.get_rng_state()
    rng, _ = session(graph)
    with rng:
        rng.before_random_op("cpu", 3, "cpu")
        torch.rand(10)
    assert torch.equal(torch.get_rng_state(), before)


def test_the_users_generator_state_is_restored_when_the_replay_fails(deferred) -> None:
    _, graph = deferred
    torch.manual_seed(7)
    before = torch.get_rng_state()
    rng, _ = session(graph)
    with pytest.raises(RuntimeError, match="boom"):
        with rng:
            rng.before_random_op("cpu", 2, "cpu")
            raise RuntimeError("boom")
    assert torch.equal(torch.get_rng_state(), before)


def test_fast_seeds_depend_on_start_state_stream_and_position_only(deferred, restore_rng) -> None:
    _, graph = deferred
    first, second = RngStreams(graph), RngStreams(graph)
    seeds = [first.fast_seed("cpu", p) for p in range(6)]
    assert seeds == [second.fast_seed("cpu", p) for p in reversed(range(6))][::-1]  # order-free
    assert len(set(seeds)) == 6
    assert first.fast_seed("cuda:0", 0) != seeds[0]
    torch.manual_seed(4321)
    other = handle_of(deferred_init(Draws).a).graph
    assert RngStreams(other).fast_seed("cpu", 0) != seeds[0]


def test_fast_mode_seeds_the_executing_generator(deferred, restore_rng) -> None:
    _, graph = deferred
    rng, streams = session(graph, "fast")
    with rng:
        rng.before_random_op("cpu", 3, "cpu")
        drawn = torch.rand(4)
    torch.manual_seed(streams.fast_seed("cpu", 3))
    assert torch.equal(drawn, torch.rand(4))


def test_rng_modes_are_the_two_documented_ones() -> None:
    assert RNG_MODES == ("eager", "fast")


class LiveStateGenerator:
    """Stands in for a default generator whose `get_state()` hands back one tensor that keeps
    following the generator (refreshed in place at every later `get_state()`): how the CUDA
    generator behaved on a GPU machine (note [Generator states are kept as copies])."""

    def __init__(self, real: torch.Generator) -> None:
        self.real = real
        self.live: torch.Tensor | None = None

    def get_state(self) -> torch.Tensor:
        state = self.real.get_state()
        if self.live is None:
            self.live = state
        else:
            self.live.copy_(state)
        return self.live

    def set_state(self, state: torch.Tensor) -> None:
        self.real.set_state(state)

    def manual_seed(self, seed: int) -> None:
        self.real.manual_seed(seed)


def test_states_kept_by_a_replay_are_copies_so_a_live_state_tensor_changes_nothing(restore_rng, monkeypatch) -> None:
    torch.manual_seed(5)
    eager = SmallNormals()  # scratch runs and cached states: every kind of kept state
    torch.manual_seed(5)
    module = deferred_init(SmallNormals)
    stand_in = LiveStateGenerator(torch.default_generator)
    monkeypatch.setattr("explorer.replay.rng.default_generator", lambda key: stand_in)
    torch.manual_seed(11)
    before = torch.get_rng_state()
    for name in ("e", "c", "a", "d", "b"):  # last first: later states come from scratch runs
        materialize_tensor(getattr(module, name))
    materialize_module(module)
    assert torch.equal(torch.get_rng_state(), before)
    for name, value in eager.named_parameters():
        assert torch.equal(getattr(module, name), value), name
