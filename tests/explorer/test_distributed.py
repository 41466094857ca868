"""Deferred modules sharded over several CPU processes (gloo on 127.0.0.1): FSDP2 and DTensor.

Each launch forks `world_size` ranks running `distributed_worker.run_rank` (gloo, 127.0.0.1, a
free port, 30 s process-group timeout), under a wall-clock timeout after which every one is
killed; one launch runs several scenarios, and all launches run at once. The worker saves the gathered state
and per-rank facts; the assertions below compare them with eager construction made here.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from explorer import deferred_init
from tests.support import distributed_worker as worker
from tests.support.hf_configs import HF_BY_NAME, build_eager
from tests.support.ports import free_port

LAUNCH_TIMEOUT_S = 120  # a guard against hangs on a loaded machine, not a timing check
# What a rank may allocate beyond its own shards and one full tensor: FSDP/DTensor bookkeeping,
# allocator slack, gloo buffers, the Python objects of replay.
RSS_OVERHEAD_BYTES = 16 * 2**20


@dataclass
class Launch:
    out: Path
    world_size: int
    returncodes: list[int]
    logs: list[str]
    seconds: float

    def saved(self, scenario: str) -> dict:
        return torch.load(self.out / f"{scenario}.pt")

    def info(self, scenario: str, rank: int) -> dict:
        return json.loads((self.out / f"{scenario}-rank{rank}.json").read_text())



class Ranks:
    """`world_size` ranks forked from this process (torch is already imported here, which saves
    each rank seconds of import); `wait()` kills them all, by pid, if they outlive the timeout, so
    no test leaves a process behind."""

    def __init__(self, out: Path, world_size: int, scenarios: list[str]) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.world_size, self.scenarios = out, world_size, scenarios
        port = free_port()
        context = multiprocessing.get_context("fork")
        self.started = time.monotonic()
        self.processes = [
            context.Process(target=worker.run_rank, name=f"rank{rank}", daemon=True,
                            args=(rank, world_size, port, out, scenarios, out / f"log-rank{rank}.txt"))
            for rank in range(world_size)
        ]
        for process in self.processes:
            process.start()

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join()

    def wait(self) -> Launch:
        for process in self.processes:
            process.join(timeout=max(1.0, LAUNCH_TIMEOUT_S - (time.monotonic() - self.started)))
        if any(process.is_alive() for process in self.processes):
            self.kill()
            pytest.fail(f"ranks still running after {LAUNCH_TIMEOUT_S}s: {self.scenarios} hung")
        logs = [(self.out / f"log-rank{rank}.txt").read_text() for rank in range(self.world_size)]
        return Launch(self.out, self.world_size, [p.exitcode for p in self.processes], logs,
                      time.monotonic() - self.started)


def _check_ok(run: Launch) -> Launch:
    assert run.returncodes == [0] * run.world_size, "\n".join(run.logs)
    return run


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Launch]:
    """Every launch of this module, started at once (they overlap their torch imports)."""
    started = {
        # memory first, while the allocator is fresh
        "two": Ranks(tmp_path_factory.mktemp("ws2"), 2,
                     ["memory", "llama-eager", "llama-fast", "tied-fsdp", "tied-dtensor", "tied-dtensor-2d", "tied-outside-units",
                      "vit-fsdp",
                      "failing-rank-1", "refused-then-sharded"]),
        "one": Ranks(tmp_path_factory.mktemp("ws1"), 1,
                     ["llama-eager", "llama-fast", "tied-fsdp", "partly-materialized", "partly-materialized-dtensor",
                      "placement-mistakes"]),
        "exit": Ranks(tmp_path_factory.mktemp("exit"), 2, ["exiting-rank-1"]),
    }
    try:
        return {name: ranks.wait() for name, ranks in started.items()}
    finally:
        for ranks in started.values():
            ranks.kill()  # only those still running: after a timeout elsewhere


@pytest.fixture(scope="module")
def two_ranks(launches: dict[str, Launch]) -> Launch:
    return _check_ok(launches["two"])


@pytest.fixture(scope="module")
def one_rank(launches: dict[str, Launch]) -> Launch:
    return _check_ok(launches["one"])


@pytest.fixture(params=[1, 2], ids=["world1", "world2"])
def run(request: pytest.FixtureRequest) -> Launch:
    return request.getfixturevalue({1: "one_rank", 2: "two_ranks"}[request.param])


def _assert_bitwise_equal(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name


def _eager_tied() -> torch.nn.Module:
    torch.manual_seed(worker.SEED)
    return worker.tied_sequential()


# -- values --------------------------------------------------------------------------------------
def test_fsdp_llama_gathers_to_eager_bitwise(run: Launch) -> None:
    eager = build_eager(HF_BY_NAME["llama"], seed=worker.SEED)
    saved = run.saved("llama-eager")
    _assert_bitwise_equal(saved["state"], eager.state_dict())
    with torch.no_grad():
        assert torch.equal(saved["logits"], eager.eval()(**worker.llama_input()).logits)


def test_fsdp_llama_shards_each_layer_along_dim_0(two_ranks: Launch) -> None:
    shapes = [two_ranks.info("llama-eager", rank)["local_shapes"] for rank in (0, 1)]
    # q_proj 32x32 -> 16 rows each; k_proj 16x32 (2 kv heads of 8) -> 8 rows each; norm 32 -> 16
    for rank_shapes in shapes:
        assert rank_shapes["model.layers.0.self_attn.q_proj.weight"] == [16, 32]
        assert rank_shapes["model.layers.1.self_attn.k_proj.weight"] == [8, 32]
        assert rank_shapes["model.norm.weight"] == [16]
        assert rank_shapes["model.embed_tokens.weight"] == [48, 32]


def test_fast_rng_gives_same_model_for_world_sizes_1_and_2(one_rank: Launch, two_ranks: Launch) -> None:
    one, two = one_rank.saved("llama-fast")["state"], two_ranks.saved("llama-fast")["state"]
    _assert_bitwise_equal(two, one)
    eager = build_eager(HF_BY_NAME["llama"], seed=worker.SEED).state_dict()
    assert not torch.equal(one["model.layers.0.mlp.up_proj.weight"], eager["model.layers.0.mlp.up_proj.weight"])


def test_fsdp_tied_sequential_with_buffers_gathers_to_eager_bitwise(run: Launch) -> None:
    eager = _eager_tied()
    saved = run.saved("tied-fsdp")
    _assert_bitwise_equal(saved["state"], eager.state_dict())
    with torch.no_grad():
        assert torch.equal(saved["output"], eager.eval()(worker.tied_input()))


def test_a_tie_outside_every_fsdp_unit_stays_one_parameter_with_eagers_values(two_ranks: Launch) -> None:
    # to_empty gives each slot of a plain parameter its own (uninitialized) tensor: the head must
    # take the embedding's filled parameter back, as eager's model holds one
    eager = _eager_tied()
    saved = two_ranks.saved("tied-outside-units")
    _assert_bitwise_equal(saved["state"], eager.state_dict())
    with torch.no_grad():
        assert torch.equal(saved["output"], eager.eval()(worker.tied_input()))
    assert [two_ranks.info("tied-outside-units", rank)["tied"] for rank in (0, 1)] == [True, True]


def test_placements_that_fit_no_parameter_are_refused_naming_it_and_change_nothing(one_rank: Launch) -> None:
    info = one_rank.info("placement-mistakes", 0)
    prefix, unchanged = "  rank 0: MaterializationError: placements ", " (the module is unchanged, still deferred)"
    assert info["too many"] == (
        prefix + "for '1.weight' give 2 entries for a 1-dimensional mesh: one per mesh dimension" + unchanged
    )
    assert info["no such dim"] == prefix + "for '1.weight' shard dimension 2 of a 2-d parameter of shape (8, 8)" + unchanged
    assert info["typo"] == (
        prefix + "name '1.wieght', which is no parameter of the module (did you mean '1.weight'?)" + unchanged
    )
    assert info["tied second name"] == (
        prefix + "name '5.weight', a parameter tied to '0.weight': give its placements under '0.weight', its first name"
        + unchanged
    )
    assert info["partial"] == (
        prefix + "for '4.weight' are (Partial(sum),): only Shard, Replicate and FSDP2-over-TP placements can be "
        "materialized (a Partial or a lone strided shard gives no block of the tensor to draw)" + unchanged
    )
    labels = ("too many", "no such dim", "typo", "tied second name", "partial")
    assert [info[f"{label} deferred"] for label in labels] == [True] * 5
    assert info["flaky"] == "  rank 0: RuntimeError: placement service unavailable" + unchanged
    assert info["flaky deferred"] == [True] * len(_eager_tied().state_dict())
    assert info["flaky tied"] is True


def test_fsdp_keeps_tied_weights_one_parameter_and_views_of_buffers(run: Launch) -> None:
    for rank in range(run.world_size):
        info = run.info("tied-fsdp", rank)
        assert info["tied"] is True
        assert info["window_shares_table"] is True


def test_plan_devices_with_world_size_predicts_each_ranks_bytes_exactly(run: Launch) -> None:
    # planned on the deferred module before sharding; measured as the local storages (FSDP2's padded
    # shards, buffers) each rank holds afterwards: tied head, uneven rows, a view of a buffer
    for scenario in ["tied-fsdp", "memory"] if run.world_size == 2 else ["tied-fsdp"]:
        for rank in range(run.world_size):
            info = run.info(scenario, rank)
            assert info["planned_bytes"] == info["own_bytes"], (scenario, rank)
    if run.world_size == 2:
        sharded = 6 * 8 + 2 * (4 * 8 + 4) + 2 + 2  # 6 of 11 embedding rows (padded), linears, BN affine
        whole = 8 + 3 + 3  # Noise.table (its window is a view), BN running mean and var
        assert run.info("tied-fsdp", 1)["planned_bytes"] == (sharded + whole) * 4 + 8  # + int64 counter


def test_fsdp_shards_uneven_rows_as_torch_chunk(two_ranks: Launch) -> None:
    # 11 embedding rows over 2 ranks: 6 and 5 (the tied head has no name of its own)
    assert two_ranks.info("tied-fsdp", 0)["local_shapes"]["0.weight"] == [6, 8]
    assert two_ranks.info("tied-fsdp", 1)["local_shapes"]["0.weight"] == [5, 8]
    assert "5.weight" not in two_ranks.info("tied-fsdp", 0)["local_shapes"]


def test_dtensor_placements_given_gather_to_eager_bitwise(two_ranks: Launch) -> None:
    _assert_bitwise_equal(two_ranks.saved("tied-dtensor")["state"], _eager_tied().state_dict())
    for rank, rows in ((0, 6), (1, 5)):
        info = two_ranks.info("tied-dtensor", rank)
        assert info["tied"] is True
        assert info["local_shapes"]["0.weight"] == [rows, 8]
        assert info["local_shapes"]["1.weight"] == [8, 4]
        assert info["local_shapes"]["4.weight"] == [8, 8]
        assert info["placements"]["1.weight"] == "(Shard(dim=1),)"
        assert info["placements"]["4.weight"] == "(Replicate(),)"


def test_parameters_left_out_are_replicated_over_every_dimension_of_a_2d_mesh(two_ranks: Launch) -> None:
    _assert_bitwise_equal(two_ranks.saved("tied-dtensor-2d")["state"], _eager_tied().state_dict())
    for rank in (0, 1):
        info = two_ranks.info("tied-dtensor-2d", rank)
        assert info["placements"]["1.weight"] == "(Replicate(), Shard(dim=1))"
        assert info["placements"]["4.weight"] == info["placements"]["0.weight"] == "(Replicate(), Replicate())"
        assert info["local_shapes"]["1.weight"] == [8, 4] and info["local_shapes"]["4.weight"] == [8, 8]


def test_fsdp_timm_vit_drawn_by_rows_gathers_to_eager_bitwise(two_ranks: Launch) -> None:
    torch.manual_seed(worker.SEED)
    eager = worker.small_vit()
    _assert_bitwise_equal(two_ranks.saved("vit-fsdp")["state"], eager.state_dict())
    count = len(list(eager.parameters()))
    for rank in (0, 1):
        info = two_ranks.info("vit-fsdp", rank)
        assert info["planned"] == {"rows": count}
        assert info["drawn"] == [True] * count


# -- memory --------------------------------------------------------------------------------------
def test_each_rank_allocates_its_shards_plus_one_full_tensor(two_ranks: Launch) -> None:
    for rank in (0, 1):
        info = two_ranks.info("memory", rank)
        assert info["full_bytes"] == 8 * (2048 * 2048 + 2048) * 4
        assert info["own_bytes"] == info["full_bytes"] // 2
        bound = info["own_bytes"] + info["largest"] + RSS_OVERHEAD_BYTES
        assert info["growth"] <= bound, (rank, info)
        assert bound < info["full_bytes"]  # so the bound does rule out materializing everything


# -- failures ------------------------------------------------------------------------------------
def test_a_failing_rank_raises_on_every_rank_and_every_module_stays_deferred(two_ranks: Launch) -> None:
    for rank in (0, 1):
        info = two_ranks.info("failing-rank-1", rank)
        assert info["failed_ranks"] == [1]
        assert info["error"].startswith("materialization failed on rank 1\n  rank 1: MaterializationError: ")
        assert "was modified in place after deferred_init" in info["error"], info["error"]
        assert info["error"].endswith("(the module is unchanged, still deferred)")
        # found before any rank changed its module: the healthy rank 0's too is as it was
        assert info["class"] == "Sequential"
        assert info["deferred"] == [True] * len(_eager_tied().state_dict())


def test_refusals_change_nothing_and_the_same_module_then_shards_to_eager(two_ranks: Launch) -> None:
    for rank in (0, 1):
        info = two_ranks.info("refused-then-sharded", rank)
        assert info["messages"]["device"] == (
            "materialization failed on ranks 0, 1\n"
            + "".join(f"  rank {r}: MaterializationError: cannot materialize onto cuda:7: device cuda:7 is not "
                      f"available (this machine has 0 CUDA devices) (the module is unchanged, still deferred)"
                      + ("\n" if r == 0 else "") for r in (0, 1))
        ), info["messages"]["device"]
        assert info["messages"]["shard"].endswith(
            "  rank 1: AttributeError: 'Sequential' object has no attribute 'layers' "
            "(the module is unchanged, still deferred)"
        )
        assert info["deferred"] == {"device": ["Sequential", True, True], "shard": ["Sequential", True, True]}
        assert "reshard_after_forward should be a bool or an int" in info["messages"]["option"]
        assert info["messages"]["option"].endswith(
            "not sometimes (the module is unusable: fully_shard had begun changing it, and its parameters are "
            "not filled; build it again with deferred_init)"
        )
    _assert_bitwise_equal(two_ranks.saved("refused-then-sharded")["state"], _eager_tied().state_dict())


def test_a_rank_that_exits_does_not_leave_the_others_waiting(launches: dict[str, Launch]) -> None:
    run = launches["exit"]
    assert run.returncodes[1] == 3
    assert run.returncodes[0] == 0, run.logs[0]
    info = run.info("exiting-rank-1", 0)
    assert info["failed_ranks"] == [-1]
    assert info["error"].startswith("could not agree with the other ranks whether materialization succeeded")


def test_fsdp_and_dtensor_refuse_a_module_with_materialized_tensors_naming_themselves(one_rank: Launch) -> None:
    info = one_rank.info("partly-materialized", 0)
    assert info["failed_ranks"] == [0]
    assert info["error"] == (
        "materialization failed on rank 0\n  rank 0: MaterializationError: '3.weight' is already "
        "materialized; fully_shard_deferred takes modules whose parameters and buffers are all still "
        "deferred (materialize nothing before it, or shard this module with "
        "torch.distributed.fsdp.fully_shard directly) (the module is unchanged, still deferred)"
    )
    assert one_rank.info("partly-materialized-dtensor", 0)["error"] == (
        "materialization failed on rank 0\n  rank 0: MaterializationError: '3.weight' is already "
        "materialized; distribute_deferred takes modules whose parameters and buffers are all still "
        "deferred (materialize nothing before it, or distribute its tensors with "
        "torch.distributed.tensor.distribute_tensor directly) (the module is unchanged, still deferred)"
    )


# -- placements (no ranks needed) ------------------------------------------------------------------
def test_fsdp_over_tp_placement_is_one_block_of_rows_but_tp_over_fsdp_is_not() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    from explorer.distributed import _one_block

    assert _one_block((_StridedShard(0, split_factor=2), Shard(0)))  # what fully_shard makes of ColwiseParallel
    assert _one_block((Shard(0), Shard(1), Replicate()))
    assert not _one_block((Shard(0), _StridedShard(0, split_factor=2)))  # rows interleave: no (shape, offset)
    assert not _one_block((_StridedShard(0, split_factor=2), Shard(1)))
    assert not _one_block((Partial(),))


# -- the plan ------------------------------------------------------------------------------------
class Mixed(torch.nn.Module):
    """One parameter per answer of shard_fill_plan."""

    def __init__(self) -> None:
        super().__init__()
        import timm.layers

        self.embed = torch.nn.Embedding(13, 8, padding_idx=2)  # normal_, then the padding row zeroed
        self.proj = torch.nn.Linear(8, 16)
        timm.layers.trunc_normal_(self.proj.weight, std=0.02)  # uniform_, then pointwise ops
        torch.nn.init.zeros_(self.proj.bias)
        self.rotation = torch.nn.Parameter(torch.nn.init.orthogonal_(torch.empty(16, 16)))
        self.scale = torch.nn.Parameter(torch.tensor(2.0))
        self.head = torch.nn.Linear(8, 13, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter


def test_shard_fill_plan_says_what_each_rank_makes_alone_and_what_whole() -> None:
    from explorer.distributed import shard_fill_plan

    plan = shard_fill_plan(deferred_init(Mixed))
    assert list(plan.columns) == ["parameter", "shape", "dtype", "bytes", "made", "source", "reason"]
    assert plan.to_dict("records") == [  # module order: the root's own parameters first
        {"parameter": "rotation", "shape": (16, 16), "dtype": "float32", "bytes": 1024, "made": "whole",
         "source": "", "reason": "the value is not one random fill or constant of the whole storage "
                                 "(ops: aten.empty.memory_format, aten.copy_.default, aten.mul_.Tensor)"},
        {"parameter": "scale", "shape": (), "dtype": "float32", "bytes": 4, "made": "whole", "source": "",
         "reason": "a 0-d tensor has no rows"},
        {"parameter": "embed.weight", "shape": (13, 8), "dtype": "float32", "bytes": 416, "made": "rows",
         "source": "random fill", "reason": ""},
        {"parameter": "proj.weight", "shape": (16, 8), "dtype": "float32", "bytes": 512, "made": "rows",
         "source": "random fill", "reason": ""},
        {"parameter": "proj.bias", "shape": (16,), "dtype": "float32", "bytes": 64, "made": "rows",
         "source": "constant", "reason": ""},
    ]
