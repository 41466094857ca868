"""`explorer.replay.rng` on its own: where the generator is put before each random op, what is
cached, and what is restored.

The parity suites check values end to end; these pin the generator states themselves against the
states eager construction passes through, op by op.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from explorer import deferred_init, materialize_module, materialize_tensor
from explorer._torch_compat.generators import cuda_state, cuda_state_fields
from explorer.record import builder
from explorer.record.fake import handle_of
from explorer.replay.philox import DeviceProperties
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


# CUDA streams: the state before a late op is the start state with the Philox offset moved by the
# increments of every op before it (explorer/replay/philox.py), with no op re-run. No GPU here: the
# recording snapshots a stand-in CUDA generator state, and the device's launch limits are given.
STAND_IN_SEED, STAND_IN_OFFSET = 20261126, 8
H100 = DeviceProperties(multi_processor_count=132, max_threads_per_multi_processor=2048)
A100 = DeviceProperties(multi_processor_count=108, max_threads_per_multi_processor=2048)
OFFSETS_FILE = Path(__file__).resolve().parent / "data" / "philox_offsets_h100_torch211.json"


def launch(numel: int, unroll: int, device: DeviceProperties = H100) -> int:
    """The offsets file's formula, written out here: blocks of 256 threads, as many as the device
    keeps resident or the elements need, each thread taking `unroll` values per 4 offsets."""
    grid = min(device.multi_processor_count * device.max_threads_per_multi_processor // 256, -(-numel // 256))
    return ((numel - 1) // (256 * grid * unroll) + 1) * 4


def measured_increment(shape: list[int]) -> int:
    """The offsets file's float32 normal_ row for `shape`."""
    rows = json.loads(OFFSETS_FILE.read_text())["rows"]
    return next(r["increment"] for r in rows if r["op"] == "normal_" and r.get("shape") == shape)


class CudaStack(nn.Module):
    """A Llama-sized embedding (4.2 GB: split for 32-bit indexing), two MLP blocks and a float64
    head on CUDA fakes; `shuffled` puts a randperm, which the offset model leaves to scratch, after
    the first block."""

    def __init__(self, shuffled: bool = False, device: str = "cuda") -> None:
        super().__init__()
        self.embed = nn.Embedding(128256, 8192, device=device)
        self.blocks = nn.ModuleList()
        for index in range(2):
            self.blocks.append(
                nn.Sequential(nn.Linear(4096, 11008, device=device), nn.Linear(11008, 4096, device=device))
            )
            if shuffled and index == 0:
                self.register_buffer("order", torch.randperm(5, device=device))
        self.head = nn.Linear(4096, 32000, device=device, dtype=torch.float64)


def cuda_stack_increments(device: DeviceProperties = H100) -> list[int]:
    """The offset each random op of `CudaStack` moves its stream by, in order (randperm left out).
    The embedding's 4.2 GB are cut in two halves for 32-bit indexing, each reserving again."""
    embed = launch(128256 * 8192, 4, device) + 2 * launch(128256 * 8192 // 2, 4, device)
    block = [
        launch(11008 * 4096, 4, device),
        launch(11008, 4, device),
        launch(4096 * 11008, 4, device),
        launch(4096, 4, device),
    ]
    return [embed, *block, *block, launch(4096 * 32000, 2, device), launch(32000, 2, device)]


@pytest.fixture
def stand_in_cuda(monkeypatch):
    """Recordings snapshot (STAND_IN_SEED, STAND_IN_OFFSET) as the start state of every CUDA generator."""
    real, stand_in = builder.capture_start_state, cuda_state(STAND_IN_SEED, STAND_IN_OFFSET)  # made here: not a fake
    monkeypatch.setattr(builder, "capture_start_state", lambda key: stand_in if key.startswith("cuda:") else real(key))


def no_scratch_run(key: str, position: int, state: torch.Tensor) -> torch.Tensor:
    raise AssertionError(f"random op {position} of {key} was run on scratch")


def test_a_late_cuda_layer_is_reached_by_arithmetic_with_no_scratch_run(stand_in_cuda) -> None:
    graph = handle_of(deferred_init(CudaStack).head.weight).graph
    increments = cuda_stack_increments()
    assert increments[0] == measured_increment([128256, 8192]) == 7776
    assert increments[1:6] == [168, 4, 168, 4, 168] and increments[-2:] == [972, 4]
    streams = RngStreams(graph, device_properties_of=lambda key: H100)
    last = len(graph.random_streams["cuda:0"]) - 1
    assert last == len(increments) - 1
    state = streams.state_before("cuda:0", last, no_scratch_run)
    assert cuda_state_fields(state) == (STAND_IN_SEED, STAND_IN_OFFSET + sum(increments[:-1]))
    after = streams.state_after("cuda:0", last, no_scratch_run)
    assert cuda_state_fields(after) == (STAND_IN_SEED, STAND_IN_OFFSET + sum(increments))
    assert cuda_state_fields(streams.state_before("cuda:0", 1, no_scratch_run)) == (
        STAND_IN_SEED,
        STAND_IN_OFFSET + 7776,
    )
    assert (streams.jumps.scratch_runs, streams.jumps.offsets) == (0, sum(increments) + 7776)


def test_an_uncovered_cuda_op_in_between_is_run_on_scratch_once(stand_in_cuda) -> None:
    graph = handle_of(deferred_init(CudaStack, True).head.weight).graph
    ops = [str(graph.ops[index].func) for index in graph.random_streams["cuda:0"]]
    shuffle = ops.index("aten.randperm.default")
    assert shuffle == 5
    increments = cuda_stack_increments()
    runs: list[int] = []

    def stand_in_randperm(key: str, position: int, state: torch.Tensor) -> torch.Tensor:
        """The stand-in generator runs randperm(5): 12, as the H100 probe measured."""
        runs.append(position)
        seed, offset = cuda_state_fields(state)
        assert (key, offset) == ("cuda:0", STAND_IN_OFFSET + sum(increments[:shuffle]))
        return cuda_state(seed, offset + 12)

    streams = RngStreams(graph, device_properties_of=lambda key: H100)
    last = len(ops) - 1
    state = streams.state_before("cuda:0", last, stand_in_randperm)
    assert cuda_state_fields(state) == (STAND_IN_SEED, STAND_IN_OFFSET + sum(increments[:-1]) + 12)
    assert runs == [shuffle] and streams.jumps.scratch_runs == 1
    streams.state_before("cuda:0", last - 1, no_scratch_run)  # from the cache: no second run
    assert runs == [shuffle]


def test_a_cuda_stream_whose_device_is_absent_runs_every_op_on_scratch(stand_in_cuda) -> None:
    graph = handle_of(deferred_init(CudaStack).head.weight).graph
    runs: list[int] = []

    def counted(key: str, position: int, state: torch.Tensor) -> torch.Tensor:
        runs.append(position)
        return state

    streams = RngStreams(graph, device_properties_of=lambda key: None)
    streams.state_before("cuda:0", 4, counted)
    assert runs == [0, 1, 2, 3] and streams.jumps.scratch_runs == 4


def test_each_cuda_stream_jumps_by_its_own_devices_launch_limits(stand_in_cuda) -> None:
    class TwoDevices(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = CudaStack(device="cuda:0")
            self.second = CudaStack(device="cuda:1")

    graph = handle_of(deferred_init(TwoDevices).first.head.weight).graph
    streams = RngStreams(graph, device_properties_of={"cuda:0": H100, "cuda:1": A100}.get)
    last = len(cuda_stack_increments()) - 1
    for key, device in (("cuda:0", H100), ("cuda:1", A100)):
        state = streams.state_before(key, last, no_scratch_run)
        assert cuda_state_fields(state) == (STAND_IN_SEED, STAND_IN_OFFSET + sum(cuda_stack_increments(device)[:-1]))
    assert launch(11008 * 4096, 4, A100) == 204 != launch(11008 * 4096, 4, H100)
