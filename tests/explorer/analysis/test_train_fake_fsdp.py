"""fake_fsdp: lazily made FSDP2 chunks equal torch.chunk's, blocks are found, groups restored, and
a fake sharded step leaves nothing behind that a later real job of the same process would inherit."""

from __future__ import annotations

import datetime
import multiprocessing
import queue
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from explorer import deferred_init, train_step
from explorer.analysis.fake_fsdp import LazyChunks, fake_process_group, repeated_blocks, shard_blocks
from tests.support.hf_configs import HF_BY_NAME, build_eager

LLAMA = HF_BY_NAME["llama"]
RANKS_TIMEOUT_S = 300  # spawned ranks import torch afresh: a guard against hangs, not a timing check


@pytest.mark.parametrize("rows,ranks", [(11, 2), (3, 8), (64, 64), (0, 4), (7, 7), (5, 3)])
def test_lazy_chunks_equal_chunk_with_empty(rows, ranks):
    tensor = torch.arange(rows * 3).reshape(rows, 3)
    chunks = list(torch.chunk(tensor, ranks, dim=0))
    while len(chunks) < ranks:
        chunks.append(chunks[0].new_empty(0))
    lazy = LazyChunks(tensor, ranks, 0)
    assert len(lazy) == ranks
    for index, chunk in enumerate(chunks):
        got = lazy[index]
        assert (got.shape, got.stride(), got.storage_offset()) == (chunk.shape, chunk.stride(), chunk.storage_offset())
        assert torch.equal(got, chunk)
    with pytest.raises(IndexError):
        lazy[ranks]


def test_repeated_blocks_are_decoder_layers_of_a_llama():
    model = build_eager(HF_BY_NAME["llama"])
    assert [path for path, _ in repeated_blocks(model)] == ["model.layers.0", "model.layers.1"]


def test_repeated_blocks_skip_leaves_and_nested_repeats():
    inner = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Linear(2, 2)))
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), inner, nn.Sequential(inner))
    # the two Linears are leaves; "3" (Sequential) shares its class with "4", so it is a block and
    # its own repeated children are inside it
    assert [path for path, _ in repeated_blocks(model)] == ["3", "4"]


def test_fake_process_group_puts_back_an_existing_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        outer = dist.group.WORLD
        with fake_process_group(8):
            assert dist.get_world_size() == 8 and dist.get_backend() == "fake"
        assert dist.group.WORLD is outer
        assert dist.get_world_size() == 1 and dist.get_backend() == "gloo"
        assert dist.all_reduce(torch.ones(1)) is None
    finally:
        dist.destroy_process_group()
    with pytest.raises(RuntimeError), fake_process_group(2):
        raise RuntimeError("inside")
    assert not dist.is_initialized()


def _llama_inputs() -> dict[str, torch.Tensor]:
    ids = LLAMA.inputs()["input_ids"]
    return {"input_ids": ids, "labels": ids}


def _gloo_rank(rank: int, port: int, results: multiprocessing.Queue) -> None:
    """One spawned gloo rank: first the fake two-rank step of the deferred Llama (fake rank 0, the
    shapes this rank shards next), then, in this same process, an all_reduce and the eager Llama sharded
    as train_step shards it (each decoder layer, then the root) and one AdamW step; puts what the test
    asserts on `results`."""
    try:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        train_step(deferred_init(LLAMA.cls, LLAMA.config()), **_llama_inputs(), world_size=2)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=30))
        try:
            total = torch.tensor([float(rank + 1)])
            dist.all_reduce(total)
            mesh = init_device_mesh("cpu", (2,))
            model = build_eager(LLAMA)
            full = {name: p.detach().clone() for name, p in model.named_parameters()}
            shard_blocks(model, mesh)
            wrong_shards = [name for name, p in model.named_parameters()
                            if p.device_mesh.get_coordinate() != (rank,)
                            or not torch.equal(p.to_local(), full[name].chunk(2)[rank])]
            optimizer = torch.optim.AdamW(model.parameters())
            loss = model(**_llama_inputs()).loss
            loss.backward()
            optimizer.step()
            # numpy arrays: a queue would pass tensors as shared memory, gone once the rank exits
            updated = {name: p.detach().full_tensor().numpy() for name, p in model.named_parameters()}
        finally:
            dist.destroy_process_group()
        results.put((rank, total.item(), wrong_shards, loss.item(), updated))
    except BaseException:  # noqa: BLE001 - the test shows what the rank raised
        results.put((rank, traceback.format_exc()))


def _eager_adamw_step() -> tuple[float, dict[str, torch.Tensor]]:
    model = build_eager(LLAMA)
    optimizer = torch.optim.AdamW(model.parameters())
    loss = model(**_llama_inputs()).loss
    loss.backward()
    optimizer.step()
    return loss.item(), {name: p.detach() for name, p in model.named_parameters()}


def test_a_real_gloo_job_after_a_fake_sharded_step_in_the_same_process_gets_its_own_shards():
    # Each rank runs the fake step of a model with the shapes it then shards for real, so that
    # DTensor's sharding caches, if left filled, would hand rank 1 the fake group's rank-0 mesh
    # (note [DTensor caches hold the fake rank]); a process forked after a fake step inherits the same
    # caches. The ranks are spawned, not forked: after a backward under FakeTensorMode, PyPI's CUDA
    # builds have started autograd's device threads, and PyTorch refuses a backward in a forked child.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=_gloo_rank, args=(rank, port, results), daemon=True) for rank in range(2)]
    for process in ranks:
        process.start()
    try:
        got = sorted((results.get(timeout=RANKS_TIMEOUT_S) for _ in ranks), key=lambda result: result[0])
    except queue.Empty:
        pytest.fail(f"the spawned gloo ranks did not answer within {RANKS_TIMEOUT_S}s")
    finally:
        for process in ranks:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
    assert all(len(result) == 5 for result in got), "\n".join(str(result[1]) for result in got)
    loss, expected = _eager_adamw_step()
    for rank, (got_rank, total, wrong_shards, rank_loss, updated) in enumerate(got):
        assert got_rank == rank
        assert total == 3.0  # 1 + 2
        assert wrong_shards == [], rank  # each rank holds its own rows, on a mesh where it is itself
        assert rank_loss == loss
        for name, tensor in expected.items():
            assert torch.equal(torch.from_numpy(updated[name]), tensor), (rank, name)
