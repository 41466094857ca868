"""FSDP2 on one process: a fake process group of N ranks, repeated blocks, activation checkpointing.

`fake_process_group(N)` makes this process rank 0 of a world of N whose collectives do nothing
(PyTorch's "fake" backend, `torch.testing._internal.distributed.fake_pg.FakeStore`): FSDP2 then
shards, all-gathers and reduce-scatters with rank 0's shapes, which is all a memory estimate of
fake tensors needs. Every rank holds the same padded shard sizes, so rank 0 stands for each.

Note: [Process-group state]
torch.distributed keeps its groups in module globals of `distributed_c10d` (`_world`, which
PyTorch names an extension point, and the maps it reads: `_pg_map`, `_pg_names`...). When the
caller already has a default group (a real job), they are set aside: fresh ones take their place
for the step and the caller's are put back on every exit, its groups registered again by name
(tearing down ours unregisters every name). Mirrors PyTorch 2.13 internals: re-check on upgrades.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import distributed_c10d as c10d
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_param
from torch.testing._internal.distributed.fake_pg import FakeStore

# The module globals of distributed_c10d that hold process-group state (see note [Process-group state]).
_GROUP_STATE = {
    "_world": c10d._World,
    "_pg_map": dict,
    "_pg_names": dict,
    "_pg_group_ranks": dict,
    "_pg_backend_config": dict,
    "_group_count": int,
    "_tags_to_pg": dict,
    "_pg_to_tag": dict,
}


@contextmanager
def _caller_groups_set_aside() -> Iterator[None]:
    """The caller's process groups moved out of torch.distributed's globals, put back on exit."""
    if not dist.is_initialized():
        yield
        return
    saved = {name: getattr(c10d, name) for name in _GROUP_STATE}
    for name, make in _GROUP_STATE.items():
        setattr(c10d, name, make())
    c10d._group_count = saved["_group_count"]  # our groups' names ("N") must not reuse the caller's
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(c10d, name, value)
        for group, name in saved["_pg_names"].items():
            try:
                torch._C._distributed_c10d._resolve_process_group(name)
            except RuntimeError:  # unregistered by our teardown: register it again
                torch._C._distributed_c10d._register_process_group(name, group)


@contextmanager
def fake_process_group(world_size: int, device_type: str = "cpu") -> Iterator[DeviceMesh]:
    """A default process group of `world_size` fake ranks (this process is rank 0) and its 1-d mesh.

    The global process-group state is restored on every exit (note [Process-group state]).
    """
    with _caller_groups_set_aside():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
        try:
            yield init_device_mesh(device_type, (world_size,))
        finally:
            dist.destroy_process_group()


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
    model over 64 ranks take 25 s. `_fsdp_param._chunk_with_empty` is swapped for `LazyChunks`
    (same shapes, strides and offsets) only inside this context, and restored on every exit.
    Mirrors PyTorch 2.13's `_chunk_with_empty`: re-check on upgrades.
    """
    original = _fsdp_param._chunk_with_empty
    _fsdp_param._chunk_with_empty = LazyChunks  # type: ignore[assignment]  # a Sequence, as FSDP2 reads it
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original


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
