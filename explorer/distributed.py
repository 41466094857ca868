"""Deferred modules onto many devices: each rank materializes its own shards, nothing more.

We do not write a distribution scheme; PyTorch's does the sharding. `fully_shard_deferred` hands
FSDP2's `fully_shard` the module with every fake swapped for a meta tensor (FSDP2 supports
meta-device init: it builds DTensor parameters whose local shards are meta), lets
`module.to_empty` allocate the local shards on the rank's device, then fills them one parameter
at a time. A parameter whose value is made by position (one random fill, what `nn.init` leaves, or
a constant, then pointwise ops such as timm's `trunc_normal_`: `replay.positional`) is drawn for
this rank's rows only, from the CPU generator jumped to their first draw or by CUDA launches placed
where the whole fill's had them (`replay.rows`); any other is
materialized whole (the engine's replay, with RNG parity), sliced, and dropped. `distribute_deferred` does the same with
DTensor placements the user chooses. Either way a rank holds its shards plus at most one full
tensor, and since every rank replays the same closures from the same recorded RNG state, the
gathered model equals eager construction bit for bit (`rng="eager"`) or is the same for every
world size (`rng="fast"`).

No collective runs while tensors are materialized; a rank that fails would otherwise leave its
peers blocked at their next collective. So every entry point ends with an agreement step: ranks
exchange their errors over the mesh, and if any failed, all raise `DistributedMaterializationError`
naming the failed ranks and their messages.
"""

from __future__ import annotations

import ctypes
import difflib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate

from ._torch_compat.dtensor import compute_local_shape_and_global_offset, is_strided_shard
from .errors import DistributedMaterializationError, MaterializationError
from .replay.materialize import TensorSlot, check_fakes, deferred_slots, materialize_fakes
from .replay.preflight import check_materializable
from .replay.rng import RngMode
from .replay.rows import draw_rows, rows_plan

if TYPE_CHECKING:
    import pandas as pd

PlacementsFor = Mapping[str, Sequence[Placement]] | Callable[[str, torch.Tensor], Sequence[Placement]]


def fully_shard_deferred(
    module: nn.Module,
    mesh: DeviceMesh,
    *,
    shard: Callable[[nn.Module], Any] | None = None,
    device: torch.device | str | None = None,
    rng: RngMode = "eager",
    **fully_shard_kwargs: Any,
) -> nn.Module:
    """Apply FSDP2 to a deferred module and materialize this rank's shards only, in place.

    `shard(module)` applies `fully_shard` the way the user wants (per layer, then the root); by
    default the root alone is sharded with `fully_shard(module, mesh=mesh, **fully_shard_kwargs)`.
    Parameters become FSDP2's sharded DTensor parameters, filled with this rank's slice of the
    values eager construction gives (`rng="eager"`) or of the `rng="fast"` values; buffers are
    materialized whole on every rank. `device` defaults to this rank's device of `mesh`'s type.
    Tied parameters stay one parameter. Peak memory: the local shards and buffers plus one full
    tensor at a time. Collective: every rank of `mesh` must call it; if any rank fails, all raise
    `DistributedMaterializationError`, which says per rank what the module was left as. Every rank
    checks first, before changing anything, that its replays can run (device, rng mode, changed
    checkpoints and inputs); a failure there, or in `shard` before it calls `fully_shard`, leaves
    every module as it was. A failure once `fully_shard` has begun (an option it refuses, out of
    memory while filling) leaves the module unusable: build it again. Returns `module`.
    """
    from torch.distributed.fsdp import fully_shard

    if shard is not None and fully_shard_kwargs:
        raise TypeError(f"pass fully_shard options {sorted(fully_shard_kwargs)} inside shard(), not beside it")
    target, slots = _checked_on_every_rank(module, mesh, device, rng, _FSDP)
    error: BaseException | None = None
    try:
        _swap_for_meta(slots)
        if shard is None:
            fully_shard(module, mesh=mesh, **fully_shard_kwargs)
        else:
            shard(module)
        module.to_empty(device=target)
        _fill_parameters(slots, target, rng, _copy_into_local)
        _fill_buffers(slots, target, rng)
    except Exception as caught:  # every rank must reach the agreement, whatever went wrong
        error = caught
        if not _fsdp_applied(module):  # failed before fully_shard ran (a user's shard()): fakes go back
            _put_back(slots)
    _agree(mesh, error, _LEFT_SHARDED if error is not None and _fsdp_applied(module) else _UNCHANGED)
    return module


def distribute_deferred(
    module: nn.Module,
    mesh: DeviceMesh,
    placements: PlacementsFor | None = None,
    *,
    device: torch.device | str | None = None,
    rng: RngMode = "eager",
) -> nn.Module:
    """Materialize a deferred module as DTensor parameters with the placements given, in place.

    `placements` maps a parameter's qualified name (the first name of a tied parameter) to its
    DTensor placements over `mesh`, as a mapping or a function `(name, fake) -> placements`; names
    it leaves out are replicated. Each rank keeps only its local part of each parameter (plus one
    full tensor in flight); buffers are materialized whole. Values and errors as for
    `fully_shard_deferred`; a failure on any rank leaves every rank's module as it was, still
    deferred. Returns `module`.
    """
    chosen = _placements_lookup(placements, mesh.ndim)

    def check_placements(slots: list[tuple[TensorSlot, torch.Tensor]]) -> None:
        _refuse_unknown_names(placements, module)
        for (_, kind, _, name), fake in slots:
            if kind == "_parameters":
                _check_placements(name, fake, mesh, tuple(chosen(name, fake)))

    target, slots = _checked_on_every_rank(module, mesh, device, rng, _DTENSOR, check_placements)
    error: BaseException | None = None
    try:

        def install(slot: TensorSlot, fake: torch.Tensor, source: ParameterSource) -> nn.Parameter:
            wanted = tuple(chosen(slot[3], fake))
            local = source.part(mesh, wanted).clone(memory_format=torch.contiguous_format)
            dtensor = DTensor.from_local(local, mesh, wanted, run_check=False, shape=fake.shape, stride=fake.stride())
            return nn.Parameter(dtensor, requires_grad=fake.requires_grad)

        _fill_parameters(slots, target, rng, install)
        _fill_buffers(slots, target, rng)
    except Exception as caught:
        error = caught
        _put_back(slots)  # nothing is sharded in place here: every slot takes its fake again
    _agree(mesh, error, _UNCHANGED)
    return module


def shard_fill_plan(module: nn.Module) -> pd.DataFrame:
    """What each rank pays to fill each deferred parameter when it is sharded on dim 0 (FSDP2's
    layout), before anything runs: one row per distinct parameter, in module order, with `made`
    "rows" (the rank makes its rows alone, from `source`: "random fill", "constant" or
    "checkpoint read") or "whole" (every rank replays the whole tensor, holds it until its slice is
    copied, and drops it: `bytes` more at that moment, for the `reason` given).

    Read off the recording alone, so it can be asked on a laptop for a GPU cluster. When the ranks
    run, a CUDA fill outside the element mapping, or a pointwise op whose kernel rounds by position
    on that device, is still made whole (docs/distributed.md). Columns: parameter, shape, dtype,
    bytes, made, source, reason.
    """
    import pandas as pd

    rows: list[dict[str, Any]] = []
    seen: set[int] = set()
    for (_, kind, _, name), fake in deferred_slots(module):
        if kind != "_parameters" or id(fake) in seen:
            continue
        seen.add(id(fake))
        handle = check_materializable(fake, name)  # a `.data = x` since the last op: x's plan
        assert handle is not None  # deferred_slots holds fakes only
        plan = rows_plan(handle.graph, handle.tensor_id)
        rows.append(
            {
                "parameter": name,
                "shape": tuple(fake.shape),
                "dtype": str(fake.dtype).removeprefix("torch."),
                "bytes": fake.numel() * fake.element_size(),
                "made": "rows" if plan.source is not None else "whole",
                "source": plan.source or "",
                "reason": plan.reason,
            }
        )
    columns = ["parameter", "shape", "dtype", "bytes", "made", "source", "reason"]
    return pd.DataFrame(rows, columns=columns)


# -- steps -------------------------------------------------------------------------------------
_UNCHANGED = "the module is unchanged, still deferred"
_LEFT_SHARDED = (
    "the module is unusable: fully_shard had begun changing it, and its parameters are not filled; "
    "build it again with deferred_init"
)


def _checked_on_every_rank(
    module: nn.Module,
    mesh: DeviceMesh,
    device: torch.device | str | None,
    rng: RngMode,
    caller: _Caller,
    check_more: Callable[[list[tuple[TensorSlot, torch.Tensor]]], None] | None = None,
) -> tuple[torch.device, list[tuple[TensorSlot, torch.Tensor]]]:
    """This rank's device and the module's deferred slots, once every rank has checked, before
    changing anything, that its replays can run (device, rng mode, lazy or swapped tensors,
    changed checkpoints and inputs; `check_more`). If any rank's check failed, every rank raises
    and every module is as it was."""
    error: BaseException | None = None
    target, slots = torch.device("meta"), []
    try:
        target = _rank_device(mesh, device)
        _refuse_materialized(module, caller)
        slots = deferred_slots(module)
        distinct = list({id(fake): (slot[3], fake) for slot, fake in slots}.values())
        check_fakes([fake for _, fake in distinct], [name for name, _ in distinct], target, rng)
        if check_more is not None:
            check_more(slots)
    except Exception as caught:
        error = caught
    _agree(mesh, error, _UNCHANGED)
    return target, slots


def _fsdp_applied(module: nn.Module) -> bool:
    """Whether fully_shard began changing `module` or a submodule. It registers its state on a
    module first (which `fully_shard.state` reads) and refuses to run on it again even when it
    then refused an option, so such a module cannot be given back as it was."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    state_of: Callable[[nn.Module], Any] = fully_shard.state  # type: ignore[attr-defined]  # contract() adds it; the overloads' stubs omit it
    return any(isinstance(sub, FSDPModule) or state_of(sub) is not None for sub in module.modules())


def _put_back(slots: list[tuple[TensorSlot, torch.Tensor]]) -> None:
    """Every slot takes its fake again (after a failure that left the module's classes alone)."""
    for (owner, kind, key, _), fake in slots:
        getattr(owner, kind)[key] = fake


def _rank_device(mesh: DeviceMesh, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    module = getattr(torch, mesh.device_type)
    return torch.device(mesh.device_type, module.current_device())


class _Caller(NamedTuple):
    """Which entry point refuses a partly materialized module, and what to use on it instead."""

    name: str
    instead: str


_FSDP = _Caller("fully_shard_deferred", "shard this module with torch.distributed.fsdp.fully_shard directly")
_DTENSOR = _Caller(
    "distribute_deferred", "distribute its tensors with torch.distributed.tensor.distribute_tensor directly"
)


def _refuse_materialized(module: nn.Module, caller: _Caller) -> None:
    """A real tensor cannot be drawn again by rank: only wholly deferred modules qualify."""
    deferred = {id(t) for _, t in deferred_slots(module)}
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if id(tensor) not in deferred:
            raise MaterializationError(
                f"{name!r} is already materialized; {caller.name} takes modules whose parameters and buffers "
                f"are all still deferred (materialize nothing before it, or {caller.instead})"
            )


def _swap_for_meta(slots: list[tuple[TensorSlot, torch.Tensor]]) -> None:
    """Put a meta tensor of the same layout in every slot (one per fake, so ties survive), since
    fully_shard can shard meta parameters but cannot touch fake ones."""
    metas: dict[int, torch.Tensor] = {}
    for (owner, kind, key, _), fake in slots:
        meta = metas.get(id(fake))
        if meta is None:
            empty = torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device="meta")
            meta = nn.Parameter(empty, requires_grad=fake.requires_grad) if kind == "_parameters" else empty
            metas[id(fake)] = meta
        getattr(owner, kind)[key] = meta


class ParameterSource:
    """One deferred parameter's values for this rank: its rows drawn alone when its value is made by
    position and only dim 0 is sharded, else the whole tensor materialized once and sliced."""

    def __init__(self, fake: torch.Tensor, name: str, device: torch.device, rng: RngMode) -> None:
        self.fake, self.name, self.device, self.rng = fake, name, device, rng
        self._whole: torch.Tensor | None = None
        self.drawn_rows = False  # whether rows were drawn alone (for tests and benchmarks)

    def whole(self) -> torch.Tensor:
        if self._whole is None:
            self._whole = materialize_fakes([self.fake], [self.name], self.device, self.rng, None)[0]
        return self._whole

    def part(self, mesh: DeviceMesh, placements: Sequence[Placement]) -> torch.Tensor:
        """This rank's part under `placements` (a view of the whole tensor, or freshly drawn rows)."""
        rows = _row_range(self.fake, mesh, placements)
        if rows is not None and self._whole is None:
            drawn = draw_rows(self.fake, *rows, self.rng, self.name, self.device)
            if drawn is not None:
                self.drawn_rows = True
                return drawn
        return _local_slice(self.whole(), mesh, placements)


def _row_range(fake: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement]) -> tuple[int, int] | None:
    """Rows [start, stop) of dim 0 that make this rank's part, when no other dim is split."""
    if fake.dim() == 0 or not _one_block(placements):
        return None
    shape, offset = compute_local_shape_and_global_offset(fake.shape, mesh, placements)
    if tuple(shape[1:]) != tuple(fake.shape[1:]):
        return None
    return offset[0], offset[0] + shape[0]


def _fill_parameters(
    slots: list[tuple[TensorSlot, torch.Tensor]],
    device: torch.device,
    rng: RngMode,
    install: Callable[[TensorSlot, torch.Tensor, ParameterSource], nn.Parameter | None],
) -> None:
    """For each distinct parameter in module order: let `install` take this rank's part from its
    `ParameterSource` (returning a new parameter for the slot, or None when it filled the slot's
    tensor in place), then drop whatever whole tensor was made before the next one."""
    done: dict[int, nn.Parameter | None] = {}
    for slot, fake in slots:
        owner, kind, key, name = slot
        if kind != "_parameters":
            continue
        if id(fake) not in done:
            source = ParameterSource(fake, name, device, rng)
            with torch.no_grad():
                installed = install(slot, fake, source)
            # Filled in place: later slots of a tie take that parameter, since `to_empty` outside
            # every FSDP unit gave each slot a parameter of its own (uninitialized memory).
            done[id(fake)] = installed if installed is not None else owner._parameters[key]
            del source
            if device.type == "cpu":
                _return_freed_host_memory()
        owner._parameters[key] = done[id(fake)]


def _return_freed_host_memory() -> None:
    """Give the pages of the full tensor just dropped back to the OS (glibc only).

    glibc keeps a freed block of a few MB in its heap once its dynamic mmap threshold has grown,
    and small allocations made meanwhile split it, so the next full tensor no longer fits and
    the heap grows: without this, a CPU rank's RSS climbs by about one full tensor per parameter
    even though no tensor is alive. `malloc_trim(0)` releases free pages anywhere in the heap.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # the C library this process already uses
    except (OSError, AttributeError):  # not glibc (macOS, musl, Windows): nothing to release
        return None


def _fill_buffers(slots: list[tuple[TensorSlot, torch.Tensor]], device: torch.device, rng: RngMode) -> None:
    """Buffers are replicated: materialize them together, so views among them share storage."""
    buffers = [(slot, fake) for slot, fake in slots if slot[1] == "_buffers"]
    if not buffers:
        return
    reals = materialize_fakes([f for _, f in buffers], [s[3] for s, _ in buffers], device, rng, None)
    for ((owner, _, key, _), _), real in zip(buffers, reals):
        owner._buffers[key] = real


def _copy_into_local(slot: TensorSlot, fake: torch.Tensor, source: ParameterSource) -> None:
    """Fill the sharded parameter fully_shard + to_empty left in the slot with this rank's slice."""
    owner, _, key, name = slot
    param = owner._parameters[key]
    if param is None:  # deferred_slots lists set parameters only: this one was cleared since
        raise MaterializationError(f"{name!r}: the parameter was set to None during materialization")
    if isinstance(param, DTensor):
        local = param._local_tensor  # FSDP2's local shard: a view into its padded shard storage
        part = source.part(param.device_mesh, param.placements)
        if local.shape != part.shape:
            raise MaterializationError(
                f"{name!r}: the local shard has shape {tuple(local.shape)}, but DTensor placements "
                f"{param.placements} give this rank a slice of shape {tuple(part.shape)}"
            )
        local.copy_(part)
    else:  # a parameter fully_shard was told to ignore: whole on every rank
        param.copy_(source.whole())


def _one_block(placements: Sequence[Placement]) -> bool:
    """Whether this rank's part is one block of the global tensor, so (shape, offset) find it: true of
    Shard and Replicate, and of FSDP2's strided shard over a later Shard of the same dim (FSDP over
    TP splits each TP part into consecutive rows, e.g. (_StridedShard(0, sf=2), Shard(0)))."""
    for index, placement in enumerate(placements):
        if placement.is_shard() or placement.is_replicate():
            continue
        dim = getattr(placement, "dim", None)
        if not (is_strided_shard(placement) and any(p.is_shard(dim) for p in placements[index + 1 :])):
            return False
    return True


def _local_slice(full: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement]) -> torch.Tensor:
    """This rank's part of `full` under `placements`, as a view (nothing copied)."""
    if not _one_block(placements):
        raise MaterializationError(
            f"only Shard, Replicate and FSDP2-over-TP placements can be materialized, got {placements}"
        )
    shape, offset = compute_local_shape_and_global_offset(full.shape, mesh, placements)
    part = full
    for dim, (size, start) in enumerate(zip(shape, offset)):
        if size != full.shape[dim]:
            part = part.narrow(dim, start, size)
    return part


def _refuse_unknown_names(placements: PlacementsFor | None, module: nn.Module) -> None:
    """A placements mapping key that is no parameter's first name (a typo, a tied parameter's second
    name) would leave that parameter replicated without a word: refused, naming the key."""
    if placements is None or callable(placements):
        return
    first_name = {id(param): name for name, param in module.named_parameters()}
    any_name = {name: first_name[id(param)] for name, param in module.named_parameters(remove_duplicate=False)}
    for key in placements:
        if any_name.get(key) == key:
            continue
        if key in any_name:
            raise MaterializationError(
                f"placements name {key!r}, a parameter tied to {any_name[key]!r}: give its placements under "
                f"{any_name[key]!r}, its first name"
            )
        close = difflib.get_close_matches(key, list(first_name.values()), n=1)
        raise MaterializationError(
            f"placements name {key!r}, which is no parameter of the module"
            + (f" (did you mean {close[0]!r}?)" if close else "")
        )


def _check_placements(name: str, fake: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement]) -> None:
    """Placements that fit neither the mesh nor the parameter, refused naming the parameter."""
    if len(placements) != mesh.ndim:
        raise MaterializationError(
            f"placements for {name!r} give {len(placements)} entries for a {mesh.ndim}-dimensional mesh: "
            "one per mesh dimension"
        )
    for placement in placements:
        dim = getattr(placement, "dim", None)
        if placement.is_shard() and dim is not None and not -fake.dim() <= dim < fake.dim():
            raise MaterializationError(
                f"placements for {name!r} shard dimension {dim} of a {fake.dim()}-d parameter of shape "
                f"{tuple(fake.shape)}"
            )
    if not _one_block(placements):
        raise MaterializationError(
            f"placements for {name!r} are {tuple(placements)}: only Shard, Replicate and FSDP2-over-TP placements "
            "can be materialized (a Partial or a lone strided shard gives no block of the tensor to draw)"
        )


def _placements_lookup(
    placements: PlacementsFor | None, mesh_dims: int
) -> Callable[[str, torch.Tensor], Sequence[Placement]]:
    """The placements of each parameter: those given, else replicated over every mesh dimension."""
    replicated = (Replicate(),) * mesh_dims
    if placements is None:
        return lambda name, fake: replicated
    if callable(placements):
        return placements
    table = dict(placements)
    return lambda name, fake: table.get(name, replicated)


def _agree(mesh: DeviceMesh, error: BaseException | None, after_failure: str) -> None:
    """Tell every rank of `mesh` which ranks failed (and why); raise on all of them if any did.

    One all-gather per mesh dimension: after the gather along dimension d, every rank knows the
    failures of the ranks that differ from it in dimensions <= d, so after the last, of all."""
    failures: dict[int, str] = {}
    if error is not None:
        failures[dist.get_rank()] = f"{type(error).__name__}: {error} ({after_failure})"
    try:
        for dim in range(mesh.ndim):
            group = mesh.get_group(dim)
            gathered: list[dict[int, str] | None] = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, failures, group=group)
            for seen in gathered:
                failures.update(seen or {})
    except Exception as lost:  # a peer died or timed out: no agreement possible, say so here
        raise DistributedMaterializationError(
            {**failures, -1: f"{type(lost).__name__}: {lost}"},
            "could not agree with the other ranks whether materialization succeeded (a rank exited or timed out)",
        ) from (error or lost)
    if failures:
        raise DistributedMaterializationError(failures) from error
