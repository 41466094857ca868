"""Fake process groups: this process as one rank of a world whose collectives move nothing.

`fake_process_group(N)` makes this process rank 0 (or `rank`) of a world of N whose collectives do
nothing (PyTorch's "fake" backend, `torch.testing._internal.distributed.fake_pg.FakeStore`), with
its device mesh. The process-group globals and DTensor's caches it touches are reached through
explorer/_torch_compat/distributed.py (notes [Process-group state], [DTensor caches hold the fake
rank]).

Note: [Fake groups held across steps]
A fake step that shards with DTensor (FSDP2's parameters, TP's plan, the optimizer's step over them)
asks DTensor's sharding propagation for every op; DTensor caches those answers per op and input
specs, and the specs hold the mesh. A fake group torn down after each step empties those caches (its
mesh would otherwise be handed to a later job, note [DTensor caches hold the fake rank]), so each
step paid for every propagation again: about a third of a planner's fake step on a 70B Llama. Inside
`fake_groups_held()` a fake group outlives its `fake_process_group` block: the next block that asks
for the same world, mesh and rank gets the same group and mesh, with DTensor's caches as the last
step left them; a block that asks for another tears the held one down first (caches emptied), and so
does leaving the scope. So a cached answer only ever serves the mesh it was computed on, and nothing
of a fake group outlives the scope. `plan_parallel` holds groups while it measures; its forked
workers hold them until they exit (`hold_fake_groups_until_exit`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .._torch_compat.distributed import (
    FakeStore,
    caller_groups_set_aside,
    clear_dtensor_caches,
    dtensor_meta_propagation_hidden,
)

__all__ = ["fake_groups_held", "fake_process_group", "hold_fake_groups_until_exit"]


@dataclass
class _HeldGroup:
    """A fake group kept up between steps: what it was asked for, its mesh, and how to tear it down."""

    request: tuple
    mesh: DeviceMesh
    teardown: ExitStack


# The open scope's one held group (a list: its slot), or None outside every scope.
_HELD: list[_HeldGroup | None] | None = None


@contextmanager
def fake_groups_held() -> Iterator[None]:
    """While active, a fake group is held from one `fake_process_group` block to the next that asks
    for the same one (note [Fake groups held across steps]); on exit nothing of it is left: the
    caller's groups are back and DTensor's caches are empty. Nested scopes are one scope."""
    global _HELD
    if _HELD is not None:
        yield
        return
    _HELD = [None]
    try:
        yield
    finally:
        slot, _HELD = _HELD, None
        if slot[0] is not None:
            slot[0].teardown.close()


def hold_fake_groups_until_exit() -> None:
    """Hold fake groups in this process for the rest of its life (a forked measuring worker, whose
    groups and caches end with it)."""
    global _HELD
    if _HELD is None:
        _HELD = [None]


def _open(
    world_size: int, device_type: str, mesh_shape: tuple[int, ...], mesh_dim_names: tuple[str, ...] | None, rank: int
) -> tuple[DeviceMesh, ExitStack]:
    """A fake group up, its mesh, and what tears it down (run here if opening fails)."""
    teardown = ExitStack()
    try:
        teardown.enter_context(caller_groups_set_aside())
        teardown.callback(clear_dtensor_caches)  # callbacks run last first: this one once the group is gone
        clear_dtensor_caches()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        teardown.callback(dist.destroy_process_group)
        return init_device_mesh(device_type, mesh_shape, mesh_dim_names=mesh_dim_names), teardown
    except BaseException:
        teardown.close()
        raise


@contextmanager
def fake_process_group(
    world_size: int,
    device_type: str = "cpu",
    mesh_shape: tuple[int, ...] | None = None,
    mesh_dim_names: tuple[str, ...] | None = None,
    rank: int = 0,
) -> Iterator[DeviceMesh]:
    """A default process group of `world_size` fake ranks (this process is `rank`, by default 0) and
    its mesh: 1-d by default, or `mesh_shape` (whose product is `world_size`) with `mesh_dim_names`,
    the outermost dim first, as `init_device_mesh` takes them (`layout_step` names its dims
    ("dp_replicate", "dp_shard", "tp"), as torchtitan does). Its sends and receives, like its
    collectives, move nothing.

    The global process-group state is restored on every exit (note [Process-group state]), and
    DTensor's sharding caches are emptied on entry and on every exit, so that no mesh of ours (rank 0)
    is handed later to a real job of this process or of one forked from it (note [DTensor caches
    hold the fake rank]); inside `fake_groups_held()` both happen when the held group is let go
    instead (note [Fake groups held across steps]). While it is up, DTensor's metadata propagation
    is hidden from the dispatch modes (a tracker, our fake mode), as it is in eager (note [DTensor's
    meta propagation under our fake mode]).
    """
    shape = tuple(mesh_shape or (world_size,))
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
    if _HELD is None:
        mesh, teardown = _open(world_size, device_type, shape, names, rank)
        with teardown, dtensor_meta_propagation_hidden():
            yield mesh
        return
    request = (world_size, device_type, shape, names, rank)
    held = _HELD[0]
    if held is None or held.request != request:
        _HELD[0] = None
        if held is not None:
            held.teardown.close()
        mesh, teardown = _open(world_size, device_type, shape, names, rank)
        held = _HELD[0] = _HeldGroup(request, mesh, teardown)
    with dtensor_meta_propagation_hidden():
        yield held.mesh
