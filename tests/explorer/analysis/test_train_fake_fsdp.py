"""fake_fsdp: lazily made FSDP2 chunks equal torch.chunk's, blocks are found, groups restored."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from explorer.analysis.fake_fsdp import LazyChunks, fake_process_group, repeated_blocks
from tests.support.hf_configs import HF_BY_NAME, build_eager


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
