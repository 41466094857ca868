"""torch.distributed internals the one-process fake FSDP2 step needs: the process-group globals, a
fake store, DTensor's process-wide sharding caches, FSDP2's chunking hook and the checkpoint wrapper.

Imported only by the training analyses (explorer/analysis/fake_fsdp.py): it pulls in FSDP2 and
DTensor, which `import explorer` need not pay for.

Note: [Process-group state]
torch.distributed keeps its groups in module globals of `distributed_c10d` (`_world`, which
PyTorch names an extension point, and the maps it reads: `_pg_map`, `_pg_names`...). When the
caller already has a default group (a real job), they are set aside: fresh ones take their place
for the step and the caller's are put back on every exit, its groups registered again by name
(tearing down ours unregisters every name). A global that this release does not have is skipped
(`_GROUP_STATE` lists what 2.11 to 2.15 keep).

Note: [DTensor caches hold the fake rank]
DTensor memoizes sharding decisions process-wide: the C++ dispatch fast path's sharding-propagation
cache, its Python twin (`ShardingPropagator.propagate_op_sharding`), the redistribution planner
(`_redistribute._gen_transform_infos`), tensor-meta propagation and the cost model's
`MeshTopoInfo.build_from_mesh`. Their keys hold `DTensorSpec`s whose `DeviceMesh` compares equal to
any mesh of the same ranks, shape and dim names: the *rank* is not part of the key. Their values hold
our fake mesh, whose rank is 0 (and rank-dependent logical shapes). So after a fake step, a real
job in this process or in a process forked from it that builds an equal mesh gets, for the same op
on the same shapes, DTensors on our rank-0 mesh: every rank then computes rank 0's coordinates and
offsets (a DCP save fails "invalid fill", `full_tensor()` and resharding read the wrong rows). The
caches are emptied when the fake group is made and on every exit. Each cache is looked up by name;
`dtensor_caches()` lists those this release has (re-check with a grep of torch/distributed/tensor
for `cache` on upgrades).

Note: [DTensor's meta propagation under our fake mode]
To find an op's output shape, DTensor runs the op on fakes of the *global* shapes
(`ShardingPropagator._propagate_tensor_meta_non_cached`), in `detect_fake_mode() or FakeTensorMode()`.
In eager that is a fresh mode whose tensors no memory tracker counts; in a fake step it is *our*
mode, already on the stack, so the tracker counts those global-shape fakes as allocations: an
AdamW step over TP-sharded parameters then peaks one or two unsharded parameters higher than the
same eager step (measured: 30,592 bytes on the tiny Llama at TP 2). `dtensor_meta_propagation_hidden`
runs that propagation with the current modes set aside, as eager does, in one plain fake mode made
for the purpose (a FakeTensorMode made per propagation, as eager makes it, costs a stack capture:
3% of a planner's step); re-check the method's name and that it is the one place DTensor runs ops
for metadata on upgrades (2.13).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper
from torch.distributed.fsdp._fully_shard import _fsdp_param
from torch.distributed.tensor import DTensor, _collective_utils, _redistribute, _sharding_prop
from torch.testing._internal.distributed.fake_pg import FakeStore

from .dispatch import disable_current_modes
from .fake import FakeTensorMode

__all__ = [
    "CheckpointWrapper",
    "FakeStore",
    "caller_groups_set_aside",
    "checkpoint_wrapper",
    "clear_dtensor_caches",
    "dtensor_caches",
    "dtensor_meta_propagation_hidden",
    "fsdp_chunks_replaced",
]

# The module globals of distributed_c10d that hold process-group state, with what makes an empty one.
_GROUP_STATE: dict[str, Callable[[], Any]] = {
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
def caller_groups_set_aside() -> Iterator[None]:
    """The caller's process groups moved out of torch.distributed's globals, put back on exit
    (note [Process-group state])."""
    if not dist.is_initialized():
        yield
        return
    present = {name: make for name, make in _GROUP_STATE.items() if hasattr(c10d, name)}
    saved = {name: getattr(c10d, name) for name in present}
    for name, make in present.items():
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


def dtensor_caches() -> list[tuple[str, Callable[[], None]]]:
    """(name, clear) of each process-wide DTensor sharding cache this release has."""
    found: list[tuple[str, Callable[[], None]]] = []
    clear_fast_path = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_fast_path is not None:
        found.append(("C++ sharding propagation", clear_fast_path))
    propagator = DTensor._op_dispatcher.sharding_propagator
    for name, owner, attribute in (
        ("ShardingPropagator.propagate_op_sharding", propagator, "propagate_op_sharding"),
        ("ShardingPropagator._propagate_tensor_meta_cached", _sharding_prop.ShardingPropagator,
         "_propagate_tensor_meta_cached"),
        ("_redistribute._gen_transform_infos", _redistribute, "_gen_transform_infos"),
        ("MeshTopoInfo.build_from_mesh", getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh"),
    ):  # fmt: skip
        clear = getattr(getattr(owner, attribute, None), "cache_clear", None)
        if clear is not None:
            found.append((name, clear))
    return found


def clear_dtensor_caches() -> None:
    """Empty DTensor's process-wide sharding caches, whose entries carry a mesh and its rank
    (note [DTensor caches hold the fake rank])."""
    for _, clear in dtensor_caches():
        clear()


@contextmanager
def fsdp_chunks_replaced(chunker: Callable[[torch.Tensor, int, int], Any]) -> Iterator[None]:
    """While active, FSDP2 splits each parameter with `chunker(tensor, num_chunks, dim)` instead of
    its `_chunk_with_empty` (same contract: world-size chunks, empty ones padded); restored on exit."""
    original = _fsdp_param._chunk_with_empty
    _fsdp_param._chunk_with_empty = chunker  # type: ignore[assignment]  # a Sequence, as FSDP2 reads it
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original


@contextmanager
def dtensor_meta_propagation_hidden() -> Iterator[None]:
    """While active, DTensor computes output metadata with the current dispatch modes set aside (a
    plain fake mode of its own, no tracker), as it does in eager (note [DTensor's meta propagation
    under our fake mode]); restored on exit."""
    propagator = _sharding_prop.ShardingPropagator
    original = propagator._propagate_tensor_meta_non_cached
    fresh: list[FakeTensorMode] = []  # one plain fake mode for every propagation while active, made on first use

    def hidden(self: Any, op_schema: Any) -> Any:
        with disable_current_modes():
            if not fresh:
                fresh.append(FakeTensorMode())
            with fresh[0]:  # what `detect_fake_mode()` finds, instead of making a mode per op
                return original(self, op_schema)

    propagator._propagate_tensor_meta_non_cached = hidden  # type: ignore[method-assign]  # restored below
    try:
        yield
    finally:
        propagator._propagate_tensor_meta_non_cached = original  # type: ignore[method-assign]  # the original, put back
