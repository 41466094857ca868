"""Fake process groups held across steps (note [Fake groups held across steps]): the same answers as
groups made for each step, one group per request, and nothing left once the scope ends."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from explorer.analysis.fake_groups import fake_groups_held, fake_process_group
from explorer.analysis.parallel_layout import Layout
from explorer.analysis.parallel_measure import Measurements, Refused
from explorer.analysis.parallel_plan import plan_parallel
from tests.support.small_llama import deferred_llama

IDS = torch.zeros(2, 32, dtype=torch.long)
LAYOUTS = [
    Layout(tp=2, dp_replicate=2, micro_batch_size=2),
    Layout(tp=2, dp_replicate=2, activation_checkpointing="block", micro_batch_size=2),
    Layout(dp_shard=2, tp=2, micro_batch_size=2),
    Layout(dp_shard=4, micro_batch_size=2),
    Layout(pp=2, tp=2, accumulation_steps=2, micro_batch_size=2),
    Layout(pp=2, dp_shard=2, accumulation_steps=2, micro_batch_size=2),
]


def test_a_plan_on_held_groups_equals_each_layout_measured_on_groups_of_its_own() -> None:
    llama = deferred_llama(6, hidden_size=64, intermediate_size=128, vocab_size=256)
    plan = plan_parallel(llama, IDS, labels=IDS, gpus=4, layouts=LAYOUTS)
    for layout, result in zip(LAYOUTS, plan.results, strict=True):
        alone = Measurements(llama, (IDS,), {"labels": IDS}, 2, None, None, None).measure(layout)
        assert not isinstance(alone, Refused) and result.valid, (layout.label(), result.problems)
        ranks, communication = alone
        assert [(rank.rank, rank.peak_bytes, rank.peak, rank.at) for rank in result.ranks] == [
            (rank.rank, rank.peak_bytes, rank.peak, rank.at) for rank in ranks
        ], layout.label()
        assert result.communication == {kind: count for kind, count in communication.items() if count}, layout.label()
    assert not dist.is_initialized()


def test_a_held_group_serves_the_same_request_and_is_let_go_for_another_and_at_the_end(tmp_path, monkeypatch) -> None:
    propagator = DTensor._op_dispatcher.sharding_propagator
    misses = []
    uncached = propagator.propagate_op_sharding_non_cached
    monkeypatch.setattr(
        propagator, "propagate_op_sharding_non_cached", lambda schema: misses.append(1) or uncached(schema)
    )
    request = dict(world_size=4, mesh_shape=(2, 2), mesh_dim_names=("dp_shard", "tp"))

    def sharded_sum(mesh) -> int:
        """Misses of DTensor's sharding caches for one sum of a DTensor on the mesh's "tp" dim."""
        before = len(misses)
        DTensor.from_local(torch.ones(2), mesh["tp"]).sum()
        return len(misses) - before

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        caller = dist.group.WORLD
        with fake_groups_held():
            with fake_process_group(**request) as first:
                assert dist.get_world_size() == 4 and dist.get_backend() == "fake"
                assert sharded_sum(first) > 0
            with fake_process_group(**request) as again:
                assert again is first and dist.get_world_size() == 4  # held between the blocks
                assert sharded_sum(again) == 0  # DTensor's answers held with it
            with fake_process_group(8, rank=2) as other:
                assert other is not first and dist.get_rank() == 2 and dist.get_world_size() == 8
            with fake_process_group(**request) as anew:
                assert anew is not first and sharded_sum(anew) > 0  # the first group's answers went with it
            assert dist.get_world_size() == 4  # still held: the scope has not ended
        assert dist.group.WORLD is caller and dist.get_backend() == "gloo" and dist.get_world_size() == 1
        assert dist.all_reduce(torch.ones(1)) is None
    finally:
        dist.destroy_process_group()
