"""FSDP2 on one process: a fake process group of N ranks, repeated blocks, activation checkpointing.

`fake_process_group(N)` (from `fake_groups`) makes this process rank 0 of a world of N whose
collectives do nothing: FSDP2 then shards, all-gathers and reduce-scatters with rank 0's shapes,
which is all a memory estimate of fake tensors needs. Every rank holds the same padded shard sizes,
so rank 0 stands for each.

FSDP2's chunking hook is reached through explorer/_torch_compat/distributed.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from .._torch_compat.distributed import checkpoint_wrapper, clear_dtensor_caches, fsdp_chunks_replaced
from .fake_groups import fake_process_group

__all__ = [
    "LazyChunks",
    "checkpoint_blocks",
    "clear_dtensor_caches",
    "fake_process_group",
    "lazy_fsdp_chunks",
    "repeated_blocks",
    "shard_blocks",
]


class LazyChunks(Sequence):
    """`list(torch.chunk(tensor, n, dim))` padded with empty tensors to `n` entries, as FSDP2's
    `_chunk_with_empty` returns, but each chunk made only when indexed (FSDP2 reads two of them)."""

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int) -> None:
        self.tensor, self.num_chunks, self.dim = tensor, num_chunks, dim
        size = tensor.size(dim)
        self.step = -(-size // num_chunks)
        self.real = -(-size // self.step) if size else num_chunks  # how many chunks torch.chunk returns

    def __len__(self) -> int:
        return self.num_chunks

    def __getitem__(self, index: int) -> torch.Tensor:  # type: ignore[override]  # ints only: FSDP2 never slices
        if not -self.num_chunks <= index < self.num_chunks:
            raise IndexError(index)
        index %= self.num_chunks
        if index >= self.real:
            return self[0].new_empty(0)
        start = index * self.step
        return self.tensor.narrow(self.dim, start, min(self.step, self.tensor.size(self.dim) - start))


@contextmanager
def lazy_fsdp_chunks() -> Iterator[None]:
    """While active, FSDP2 splits parameters into lazily made chunks.

    Note: [Lazy FSDP chunks]
    `fully_shard` calls `torch.chunk(param, world_size)` twice per parameter and keeps two chunks;
    on fake tensors each of the world-size outputs costs a FakeTensor, which made sharding a 70B
    model over 64 ranks take 25 s. FSDP2's `_chunk_with_empty` is swapped for `LazyChunks`
    (same shapes, strides and offsets) only inside this context, and restored on every exit.
    Mirrors PyTorch's `_chunk_with_empty` (2.11 to 2.15): re-check on upgrades.
    """
    with fsdp_chunks_replaced(LazyChunks):
        yield


def repeated_blocks(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks a model repeats: entries of an `nn.ModuleList`/`nn.Sequential` that have submodules
    and share their class with a sibling (a Llama's decoder layers, a ResNet stage's blocks).

    Outermost first, in `named_modules()` order; a block inside another block is not listed.
    """
    found: list[tuple[str, nn.Module]] = []
    for path, container in module.named_modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        if any(path == p or path.startswith(p + ".") for p, _ in found if p):
            continue
        children = list(container.named_children())
        classes = [type(child) for _, child in children]
        for name, child in children:
            if classes.count(type(child)) >= 2 and next(iter(child.children()), None) is not None:
                found.append((f"{path}.{name}" if path else name, child))
    return found


def checkpoint_blocks(module: nn.Module, blocks: list[tuple[str, nn.Module]]) -> None:
    """Wrap each block in place with `checkpoint_wrapper` (`torch.utils.checkpoint`, non-reentrant):
    its activations are recomputed in backward instead of held."""
    for path, block in blocks:
        parent_path, _, name = path.rpartition(".")
        parent = module.get_submodule(parent_path)
        setattr(parent, name, checkpoint_wrapper(block))


def shard_blocks(module: nn.Module, mesh: DeviceMesh) -> None:
    """The default FSDP2 wrapping: `fully_shard` each repeated block, then the root."""
    for _, block in repeated_blocks(module):
        fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)
