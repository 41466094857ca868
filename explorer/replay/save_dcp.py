"""A `torch.distributed.checkpoint` directory, written one tensor at a time, on one rank or many.

`dcp.save` plans a checkpoint from a state dict's shapes and dtypes, then asks its planner for each
tensor's bytes (`resolve_data`) only as its writer reaches it. So the state dict handed to it holds
placeholders (meta tensors, or DTensors with meta local shards, in the stored dtype), and the
planner here materializes each value on demand: the writer writes it and drops it before the next.
With `FileSystemWriter(single_file_per_rank=False)` each tensor is a file of its own (`__r_k.distcp`),
so nothing outlives its write (with one file per rank, the writer keeps every tensor of the file
until it closes). The result is a normal DCP checkpoint: `dcp.load` reads it into any sharding.

What each rank writes:
- a tensor that is a DTensor (after `fully_shard_deferred` or `distribute_deferred`): its local part;
- a deferred tensor, when a process group of several ranks is initialized: the rows of dim 0 that
  `Shard(0)` gives this rank (FSDP2's split), drawn alone where the value is made by position (a
  random fill or constant, then pointwise ops) or is a checkpoint read (`replay.rows`), else sliced
  from the whole tensor; tensors too small to give every rank rows, and 0-d ones, are written whole
  by one rank (DCP deduplicates them);
- anything else (a real tensor, a deferred one on a single process): the whole tensor, once.

Everything is written into a hidden `.dcp-<id>.partial` directory beside the final files and moved
into place when complete (data first, `.metadata` last): a cancel or crash leaves no partial file
under a final name, and a checkpoint already in the directory is intact until the new one is whole.

Note: [DCP writer internals] relies on `_write_files_from_queue` resolving items one at a time
(`_SerialCpuLoader`, or `_OverlappingCpuLoader` with a bounded in-flight size on CUDA machines) in
torch/distributed/checkpoint/filesystem.py; re-check on PyTorch upgrades (the bench's peak RSS
would show a writer that resolves everything first).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from .._torch_compat.dtensor import compute_local_shape_and_global_offset
from ..errors import DistributedMaterializationError
from ..record.fake import handle_of
from . import save_files
from .rng import RngMode
from .routing import DeviceMap
from .rows import draw_rows
from .save_files import disk_error, removed_on_error
from .save_progress import SaveReport
from .save_safetensors import Materialize, converted, saved_dtype

METADATA_NAME = ".metadata"


class StagedFileSystem(FileSystem):
    """DCP's file system, opening files through `save_files.open_for_writing`; a failed write's
    error names the file and the bytes of the tensor being written (`needed()`)."""

    def __init__(self, needed: Callable[[], int], remaining: Callable[[], int]) -> None:
        super().__init__()
        self.needed, self.remaining = needed, remaining

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        path = Path(path)
        try:
            with save_files.open_for_writing(path) as stream:
                yield stream
        except Exception as error:
            cause = _os_error_in(error)
            if cause is None:
                raise
            raise disk_error(cause, path, self.needed(), self.remaining()) from error


def _os_error_in(error: BaseException | None) -> OSError | None:
    """The OSError behind `error`: torch.save's zip writer, failing to finish a file whose write
    failed, raises a RuntimeError ("unexpected pos") with the disk's OSError as its context."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, OSError):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


class StreamingSavePlanner(DefaultSavePlanner):
    """DCP's default planner over placeholders; each value is materialized when the writer asks."""

    def __init__(self, sources: dict[str, TensorSource], report: SaveReport) -> None:
        super().__init__()
        self.sources, self.report = sources, report
        self._pending: tuple[int, int] | None = None  # the item last resolved: written by the next ask

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        plan = super().finish_plan(new_plan)
        items = [item for item in plan.items if item.type != WriteItemType.BYTE_IO]
        self.report.start(len(items), sum(_item_bytes(item) for item in items))
        return plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        self.flush_report()  # the writer asks for the next item once the previous one is written
        source = self.sources.get(write_item.index.fqn)
        if source is None or write_item.type == WriteItemType.BYTE_IO:
            return super().resolve_data(write_item)
        value = source.value(write_item)
        self._pending = (1, value.numel() * value.element_size())
        return value

    def flush_report(self) -> None:
        if self._pending is not None:
            tensors, nbytes = self._pending
            self._pending = None
            self.report.advance(tensors, nbytes)

    def pending_bytes(self) -> int:
        """Bytes of the tensor being written now (0 between tensors)."""
        return self._pending[1] if self._pending is not None else 0


def _item_bytes(item: WriteItem) -> int:
    assert item.tensor_data is not None  # a tensor item (BYTE_IO items are left out)
    numel = 1
    for size in item.tensor_data.chunk.sizes:
        numel *= size
    return numel * item.tensor_data.properties.dtype.itemsize


class TensorSource:
    """One state-dict entry: its placeholder for planning and its values for the writer."""

    def __init__(
        self,
        name: str,
        tensor: torch.Tensor,
        dtype: torch.dtype | None,
        materialize: Materialize,
        mesh: DeviceMesh | None,
        rng: RngMode,
        device: DeviceMap = None,
    ) -> None:
        self.name, self.tensor, self.dtype, self.materialize, self.rng = name, tensor, dtype, materialize, rng
        self.device = device
        self.stored = saved_dtype(tensor, dtype)
        self.rows_of = mesh if mesh is not None and handle_of(tensor) is not None and _splits(tensor, mesh) else None
        if isinstance(tensor, DTensor):
            local = tensor.to_local()
            self.placeholder: torch.Tensor = _meta_dtensor(
                tensor, local.shape, tensor.device_mesh, tensor.placements, self.stored
            )
        elif self.rows_of is not None:
            shape, _ = compute_local_shape_and_global_offset(tensor.shape, self.rows_of, (Shard(0),))
            self.placeholder = _meta_dtensor(tensor, shape, self.rows_of, (Shard(0),), self.stored)
        else:
            self.placeholder = torch.empty(tensor.shape, dtype=self.stored, device="meta")

    def value(self, item: WriteItem) -> torch.Tensor:
        """The bytes of `item`: this rank's chunk, in the stored dtype, on the CPU."""
        if isinstance(self.tensor, DTensor):
            return converted(self.tensor.to_local(), self.dtype).cpu()
        if self.rows_of is not None:
            assert item.index.offset is not None and item.tensor_data is not None  # a Shard(0) chunk
            start = item.index.offset[0]
            stop = start + item.tensor_data.chunk.sizes[0]
            rows = draw_rows(self.tensor, start, stop, self.rng, self.name, self.device)
            if rows is None:
                rows = self.materialize(self.name, self.tensor)[start:stop]
            return converted(rows, self.dtype).cpu()
        return converted(self.materialize(self.name, self.tensor), self.dtype).cpu()


def _splits(tensor: torch.Tensor, mesh: DeviceMesh) -> bool:
    """Whether Shard(0) over `mesh` gives every rank at least one row (torch.chunk's split)."""
    world, rows = mesh.size(), tensor.shape[0] if tensor.dim() else 0
    per_rank = -(-rows // world) if rows else 0
    return tensor.dim() > 0 and per_rank > 0 and rows - per_rank * (world - 1) > 0


def _meta_dtensor(
    like: torch.Tensor, local_shape: Any, mesh: DeviceMesh, placements: Any, dtype: torch.dtype
) -> DTensor:
    local = torch.empty(tuple(local_shape), dtype=dtype, device="meta")
    return DTensor.from_local(
        local,
        mesh,
        placements,
        run_check=False,
        shape=like.shape,
        stride=torch.empty(like.shape, device="meta").stride(),
    )


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def write_dcp(
    state: dict[str, Any],
    target: Path,
    dtype: torch.dtype | None,
    materialize: Materialize,
    report: SaveReport,
    rng: RngMode = "eager",
    device: DeviceMap = None,
) -> list[Path]:
    """Write `state` (a state dict with deferred, real or DTensor values) as a DCP checkpoint in
    `target`. Collective when a process group of several ranks is initialized: every rank calls it,
    and a failure on any rank raises on all. Returns the files in place afterwards."""
    world = world_size()
    needs_mesh = world > 1 and any(isinstance(v, torch.Tensor) and handle_of(v) is not None for v in state.values())
    mesh = init_device_mesh("cpu", (world,)) if needs_mesh else None
    sources = {
        name: TensorSource(name, value, dtype, materialize, mesh, rng, device)
        for name, value in state.items()
        if isinstance(value, torch.Tensor)
    }
    placeholders = {name: sources[name].placeholder if name in sources else value for name, value in state.items()}
    staging = target / f".dcp-{_agreed_id(world)}.partial"
    coordinator = world == 1 or dist.get_rank() == 0
    planner = StreamingSavePlanner(sources, report)
    writer = dcp.FileSystemWriter(staging, single_file_per_rank=False, thread_count=1)
    writer.fs = StagedFileSystem(planner.pending_bytes, lambda: report.total_bytes - report.done_bytes)
    with removed_on_error(staging) if coordinator else contextlib.nullcontext():
        try:
            with warnings.catch_warnings():
                # dcp.save without a process group says it is "assuming the intent is to save in a single process"
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.save(placeholders, storage_writer=writer, planner=planner, no_dist=world == 1)
        except CheckpointException as failed:
            raise _unwrapped(failed, target) from None
        planner.flush_report()
        error = _publish(staging, target) if coordinator else None
    return _agree_published(error, target, world)


def _agreed_id(world: int) -> str:
    chosen = [uuid.uuid4().hex[:12]]
    if world > 1:
        dist.broadcast_object_list(chosen, src=0)
    return chosen[0]


def _unwrapped(failed: CheckpointException, target: Path) -> BaseException:
    """DCP gathers every rank's exception into one CheckpointException: raise this rank's own
    (a KeyboardInterrupt stays a cancel, an OSError names its file), or name the failed ranks."""
    own = failed.failures.get(dist.get_rank() if world_size() > 1 else 0)
    if own is not None:
        return own[0] if isinstance(own, tuple) else own
    messages = {
        rank: f"{type(e[0]).__name__}: {e[0]}" if isinstance(e, tuple) else str(e)
        for rank, e in failed.failures.items()
    }
    ranks = ", ".join(map(str, sorted(messages)))
    return DistributedMaterializationError(
        messages, f"save_checkpoint failed on rank{'s' * (len(messages) > 1)} {ranks}; nothing was moved into {target}"
    )


def _publish(staging: Path, target: Path) -> BaseException | None:
    """Move the complete checkpoint from `staging` into `target`: the old `.metadata` goes first
    (so no reader pairs it with new data), then the data files, then the new `.metadata`."""
    try:
        (target / METADATA_NAME).unlink(missing_ok=True)
        for stale in target.glob("__*_*.distcp"):
            stale.unlink()
        for path in sorted(staging.iterdir()):
            if path.name != METADATA_NAME:
                path.replace(target / path.name)
        (staging / METADATA_NAME).replace(target / METADATA_NAME)
        shutil.rmtree(staging, ignore_errors=True)
    except OSError as error:
        return error
    return None


def _agree_published(error: BaseException | None, target: Path, world: int) -> list[Path]:
    """Every rank returns once rank 0 has moved the files into place (or raises if it could not)."""
    if world > 1:
        said = [None if error is None else f"{type(error).__name__}: {error}"]
        dist.broadcast_object_list(said, src=0)
        if said[0] is not None:
            raise DistributedMaterializationError({0: said[0]}, "save_checkpoint could not move the files into place")
    elif error is not None:
        raise error
    return sorted([*target.glob("__*_*.distcp"), target / METADATA_NAME])
