"""save_checkpoint(format="dcp") on 2 gloo ranks: every rank writes its own shards, and the
checkpoint loads into an FSDP2 model on 2 ranks equal to eager construction, bit for bit.

Two ways to get there, each launched as 2 forked ranks (gloo on 127.0.0.1): a model sharded by
`fully_shard_deferred` (each rank writes its DTensor local shards), and a model still deferred
(each rank draws and writes only its Shard(0) rows). Each rank then loads the checkpoint into a
model built from another seed and sharded by FSDP2, and rank 0 saves the gathered state for the
assertions here.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch

from tests.support import distributed_worker as worker
from tests.support.hf_configs import HF_BY_NAME, build_eager
from tests.support.ports import free_port

LAUNCH_TIMEOUT_S = 120  # a guard against hangs on a loaded machine, not a timing check
WORLD = 2


def save_then_load(rank: int, port: int, out: Path) -> None:
    """One rank: save the tiny Llama both ways, load each checkpoint into FSDP2, keep the results."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    from explorer import deferred_init, save_checkpoint
    from explorer.distributed import fully_shard_deferred

    descriptor = os.open(out / f"log-rank{rank}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=30))
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        sharded = worker.tiny_llama()  # seed worker.SEED
        fully_shard_deferred(sharded, mesh, shard=worker.by_layer(sharded, mesh))
        try:
            save_checkpoint(sharded, out / "refused", progress=False)
        except ValueError as error:
            (out / f"refused-rank{rank}.txt").write_text(str(error))
        def cancel_on_rank_1(*report: int) -> None:
            if rank == 1:
                raise KeyboardInterrupt

        try:
            save_checkpoint(worker.tiny_llama(), out / "cancelled", format="dcp", progress=cancel_on_rank_1)
        except BaseException as error:  # noqa: BLE001 - the test reads what each rank raised
            (out / f"cancelled-rank{rank}.txt").write_text(f"{type(error).__name__}: {error}")
        reports: dict[str, list] = {"sharded": [], "deferred": []}
        save_checkpoint(sharded, out / "sharded", format="dcp", progress=lambda *r: reports["sharded"].append(r))
        save_checkpoint(worker.tiny_llama(), out / "deferred", format="dcp",
                        progress=lambda *r: reports["deferred"].append(r))
        for name in ("sharded", "deferred"):
            arch = HF_BY_NAME["llama"]
            torch.manual_seed(worker.SEED + 1)  # other values: the load must overwrite every tensor
            target = deferred_init(arch.cls, arch.config())
            fully_shard_deferred(target, mesh, shard=worker.by_layer(target, mesh))
            state = target.state_dict()
            dcp.load(state, checkpoint_id=str(out / name))
            target.load_state_dict(state)
            gathered = worker.gathered_state(target)
            if rank == 0:
                torch.save(gathered, out / f"{name}-loaded.pt")
            torch.save(reports[name], out / f"{name}-progress-rank{rank}.pt")
    finally:
        dist.destroy_process_group()



@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("save-ws2")
    context = multiprocessing.get_context("fork")
    port = free_port()
    ranks = [context.Process(target=save_then_load, args=(rank, port, out), daemon=True) for rank in range(WORLD)]
    started = time.monotonic()
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=max(1.0, LAUNCH_TIMEOUT_S - (time.monotonic() - started)))
    hung = [process for process in ranks if process.is_alive()]
    for process in hung:
        process.kill()
        process.join()
    logs = "\n".join((out / f"log-rank{rank}.txt").read_text() for rank in range(WORLD))
    assert not hung, f"ranks still running after {LAUNCH_TIMEOUT_S}s:\n{logs}"
    assert [process.exitcode for process in ranks] == [0] * WORLD, logs
    return out


@pytest.mark.parametrize("saved_from", ["sharded", "deferred"])
def test_a_dcp_checkpoint_written_by_2_ranks_loads_into_fsdp2_on_2_ranks_equal_to_eager(run, saved_from):
    eager = build_eager(HF_BY_NAME["llama"], seed=worker.SEED).state_dict()
    loaded = torch.load(run / f"{saved_from}-loaded.pt")
    assert list(loaded) == list(eager)
    for name, tensor in eager.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


@pytest.mark.parametrize("saved_from", ["sharded", "deferred"])
def test_each_rank_writes_its_own_rows_of_each_parameter(run, saved_from):
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(run / saved_from)).read_metadata()
    q_proj = metadata.state_dict_metadata["model.layers.0.self_attn.q_proj.weight"]  # 32 x 32
    assert [(list(c.offsets), list(c.sizes)) for c in q_proj.chunks] == [([0, 0], [16, 32]), ([16, 0], [16, 32])]
    files = {info.relative_path for info in metadata.storage_data.values()}
    assert {name[:4] for name in files} == {"__0_", "__1_"}
    assert sorted(p.name for p in (run / saved_from).iterdir()) == sorted([".metadata", *files])


def test_each_rank_reports_progress_over_its_own_tensors(run):
    for rank in range(WORLD):
        reports = torch.load(run / f"deferred-progress-rank{rank}.pt")
        _, total, done_bytes, total_bytes = reports[-1]
        assert [r[0] for r in reports] == list(range(1, total + 1)) and done_bytes == total_bytes
    halves = [torch.load(run / f"deferred-progress-rank{rank}.pt")[-1][3] for rank in range(WORLD)]
    everything = sum(t.numel() * t.element_size() for t in build_eager(HF_BY_NAME["llama"]).state_dict().values())
    assert sum(halves) == everything  # each byte written once, by one rank


def test_a_sharded_model_is_refused_as_safetensors_naming_the_tensor_and_the_way_out(run):
    for rank in range(WORLD):
        assert (run / f"refused-rank{rank}.txt").read_text() == (
            "'model.embed_tokens.weight' is a DTensor sharded over ranks; format='safetensors' writes whole "
            "tensors from one process: save it with format='dcp' (every rank writes its own shards)")
    assert not (run / "refused").exists()


def test_a_rank_that_fails_mid_way_fails_every_rank_and_nothing_is_left(run):
    assert (run / "cancelled-rank1.txt").read_text() == "KeyboardInterrupt: "  # its own exception
    assert (run / "cancelled-rank0.txt").read_text() == (
        f"DistributedMaterializationError: save_checkpoint failed on rank 1; nothing was moved into "
        f"{run / 'cancelled'}\n  rank 1: KeyboardInterrupt: ")
    assert list((run / "cancelled").iterdir()) == []
