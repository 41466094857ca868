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

Note: [DTensor caches hold the fake rank]
DTensor memoizes sharding decisions process-wide: the C++ dispatch fast path's sharding-propagation
cache, its Python twin (`ShardingPropagator.propagate_op_sharding`), the redistribution planner
(`_redistribute._gen_transform_infos`), tensor-meta propagation and the cost model's
`MeshTopoInfo.build_from_mesh`. Their keys hold `DTensorSpec`s whose `DeviceMesh` compares equal to
any mesh of the same ranks, shape and dim names: the *rank* is not part of the key. Their values hold
our fake mesh, whose rank is 0 (and rank-dependent logical shapes). So after a fake step, a real
job in this process or in a process forked from it (gloo ranks started with multiprocessing's
"fork") that builds an equal mesh gets, for the same op on the same shapes, DTensors on our rank-0
mesh: every rank then computes rank 0's coordinates and offsets (a DCP save fails "invalid fill",
`full_tensor()` and resharding read the wrong rows). The caches are emptied when the fake group is
made (nothing of the caller's leaks into the step) and on every exit (nothing of ours leaks out); the
only cost is that the caller's next DTensor ops recompute their sharding once.
Mirrors PyTorch 2.13 internals: re-check the list on upgrades (grep torch/distributed/tensor for
`cache`).
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
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._collective_utils import MeshTopoInfo
from torch.distributed.tensor._redistribute import _gen_transform_infos
from torch.distributed.tensor._sharding_prop import ShardingPropagator
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


def clear_dtensor_caches() -> None:
    """Empty DTensor's process-wide sharding caches, whose entries carry a mesh and its rank
    (note [DTensor caches hold the fake rank])."""
    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch fast path's
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()  # a LocalLRUCache
    ShardingPropagator._propagate_tensor_meta_cached.cache_clear()  # an lru_cache on the method
    _gen_transform_infos.cache_clear()
    MeshTopoInfo.build_from_mesh.cache_clear()  # an lru_cache on the staticmethod


@contextmanager
def fake_process_group(world_size: int, device_type: str = "cpu") -> Iterator[DeviceMesh]:
    """A default process group of `world_size` fake ranks (this process is rank 0) and its 1-d mesh.

    The global process-group state is restored on every exit (note [Process-group state]), and
    DTensor's sharding caches are emptied on entry and on every exit, so that no mesh of ours (rank 0)
    is handed later to a real job of this process or of one forked from it (note [DTensor caches
    hold the fake rank]).
    """
    with _caller_groups_set_aside():
        clear_dtensor_caches()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
        try:
            yield init_device_mesh(device_type, (world_size,))
        finally:
            try:
                dist.destroy_process_group()
            finally:
                clear_dtensor_caches()


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
