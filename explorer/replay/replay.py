"""Replaying a graph's recorded ops with real tensors.

One `Replay` serves one materialization call: it asks `InitGraph.closure_of` which ops the targets
need (skipping what earlier calls already produced), checks everything that could fail before
running anything, runs the ops in chronological order, then moves results to their target devices
and wraps parameters. Results are remembered per graph and device plan (weakly), so the same fake
gives the same real object and a view materialized later shares storage with its base.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
import weakref
from typing import Any, Callable, Iterator, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils._python_dispatch import _disable_current_modes

from .routing import DevicePlan, describe_absence, is_available, normalize
from ..errors import MaterializationError
from ..naming import dtype_name
from ..record.scope import outside_recording
from ..graph import (
    ExternalRef, InitGraph, OpIndex, StorageId, TensorId, TensorRef, accepts_generator, is_inplace_random,
)
from ..record.generators import stream_key
from .rng import RngSession, RngStreams

# progress(done_tensors, total_tensors, done_bytes, total_bytes); may raise to cancel.
Progress = Callable[[int, int, int, int], None]


class ReplayState:
    """What replays of one graph keep between calls: RNG states and produced tensors (weakly)."""

    def __init__(self, graph: InitGraph) -> None:
        self.streams = RngStreams(graph)
        self.results: dict[tuple, weakref.WeakValueDictionary] = {}
        self.anchors: dict[tuple, weakref.WeakValueDictionary] = {}
        self.lock = threading.RLock()

    @staticmethod
    def of(graph: InitGraph) -> "ReplayState":
        if graph.replay_state is None:
            graph.replay_state = ReplayState(graph)
        return graph.replay_state


def alias_on(base: torch.Tensor, shape: tuple, stride: tuple, offset: int, dtype: torch.dtype) -> torch.Tensor:
    """A tensor with the given layout over `base`'s storage (an inference tensor if `base` is one,
    as a view of it would be)."""
    with torch.inference_mode(base.is_inference()):
        return torch.empty(0, dtype=dtype, device=base.device).set_(base.untyped_storage(), offset, shape, stride)


def storage_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The whole storage under `tensor` as one uint8 tensor (to move it once for all its views)."""
    with torch.inference_mode(tensor.is_inference()):
        return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())


def storage_moved(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of the whole storage under `tensor` on `device`, as uint8 (inference stays inference)."""
    with torch.inference_mode(tensor.is_inference()):
        return storage_bytes(tensor).to(device)


# `torch.tensor([...])` records `lift_fresh(constant)`, which returns the constant itself: replaying
# it as is would let later recorded in-place ops write into the graph's copy of the constant (so a
# second replay would start from a changed value, and is refused as "modified in place").
_FRESH_COPIES = {torch.ops.aten.lift_fresh.default: torch.ops.aten.lift_fresh_copy.default}


def replayed_func(func: Any) -> Any:
    """The op to run for a recorded op: the same, except `lift_fresh`, which copies its constant."""
    return _FRESH_COPIES.get(func, func)


def _describe_external(graph: InitGraph, index: int) -> str:
    tensor = graph.externals[index].tensor
    dtype = dtype_name(tensor.dtype)
    return f"external tensor {dtype}{list(tensor.shape)} on {tensor.device}"


class Replay:
    """One materialization call over one graph."""

    def __init__(
        self,
        graph: InitGraph,
        plan: DevicePlan,
        *,
        remember: bool = True,
        names: dict[TensorId, str] | None = None,
    ) -> None:
        self.graph = graph
        self.plan = plan
        self.state = ReplayState.of(graph)
        self.names = names or {}
        if remember:
            self.memo = self.state.results.setdefault(plan.key, weakref.WeakValueDictionary())
            self.anchor_store = self.state.anchors.setdefault(plan.key, weakref.WeakValueDictionary())
        else:
            self.memo, self.anchor_store = weakref.WeakValueDictionary(), weakref.WeakValueDictionary()
        self.anchors: dict[StorageId, torch.Tensor] = dict(self.anchor_store.items())  # strong, this call
        self.stale: set[StorageId] = set()
        self.env: dict[TensorId, torch.Tensor] = {}
        self._externals: dict[int, torch.Tensor] = {}
        self._anchor_on_exec: dict[tuple[StorageId, torch.device], torch.Tensor] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[StorageId, Future] = {}

    # -- planning ----------------------------------------------------------------------------
    def _reusable(self, sid: StorageId) -> bool:
        return sid in self.anchors and sid not in self.stale

    def plan_ops(self, tids: Sequence[TensorId]) -> list[OpIndex]:
        """The ops to run, in order; storages an earlier call produced are reused when their
        final state is what the ops need, and recomputed privately ("stale") when it is not."""
        tensors = self.graph.tensors
        while True:
            newly_stale: set[StorageId] = set()

            def storage_ready(sid: StorageId, before: OpIndex) -> bool:
                if not self._reusable(sid):
                    return False
                if self.graph.last_write(sid) < before:
                    return True
                newly_stale.add(sid)
                return False

            ops = self.graph.closure_of(
                tids,
                skip_dead_writes=self.plan.rng == "fast",
                has_object=lambda tid: self._reusable(tensors[tid].storage),
                storage_ready=storage_ready,
            )
            if not newly_stale:
                return ops
            self.stale |= newly_stale

    def _target_names(self, tids: Sequence[TensorId]) -> str:
        names = [self.names.get(tid, f"tensor #{tid}") for tid in tids[:3]]
        return ", ".join(repr(n) for n in names) + (f" and {len(tids) - 3} more" if len(tids) > 3 else "")

    def check(self, ops: Sequence[OpIndex], tids: Sequence[TensorId]) -> None:
        """Everything that would make the replay fail half-way, raised before anything runs."""
        graph = self.graph
        for tid in tids:
            recorded = graph.tensors[tid].device
            target = self.plan.target(recorded)
            if not is_available(target):
                raise MaterializationError(
                    f"{self.names.get(tid, f'tensor #{tid}')!r} was recorded on {recorded} and would be "
                    f"materialized there, but {describe_absence(target)}; pass device= (e.g. device='cpu' "
                    f"or device={{'{recorded.type}': 'cpu'}})"
                )
        for index in ops:
            op = graph.ops[index]
            for external in op.externals:
                record = graph.externals[external]
                if record.fresh:
                    continue
                where = f"{op.label} at {op.source}" if op.source else op.label
                if record.version is None:
                    raise MaterializationError(
                        f"the {_describe_external(graph, external)} read by {where} is an inference "
                        "tensor: its in-place changes cannot be detected, so its recorded value cannot be "
                        f"trusted (needed for {self._target_names(tids)}); create it outside "
                        "torch.inference_mode()"
                    )
                if record.tensor._version != record.version:
                    raise MaterializationError(
                        f"the {_describe_external(graph, external)} read by {where} was modified in place "
                        f"after deferred_init (version {record.version}, now {record.tensor._version}); "
                        f"{self._target_names(tids)} cannot be materialized with its original value"
                    )
            if op.stream is not None and self.plan.rng == "eager":
                key = op.stream[0]
                recorded = torch.device(key)
                if self.plan.target(recorded).type != "meta" and graph.rng_start.get(key) is None:
                    raise MaterializationError(
                        f"rng='eager' draws {op.label} (at {op.source}) from the {key} generator, as eager "
                        f"construction would, but {describe_absence(recorded)}; use rng='fast' for "
                        f"reproducible values that differ from eager, or materialize where {key} exists"
                    )

    # -- running -----------------------------------------------------------------------------
    def _from_anchor(self, tid: TensorId) -> torch.Tensor:
        info = self.graph.tensors[tid]
        exec_device = self.plan.exec_device(info.device)
        key = (info.storage, exec_device)
        base = self._anchor_on_exec.get(key)
        if base is None:
            anchor = self.anchors[info.storage]
            base = anchor if anchor.device == exec_device else storage_moved(anchor, exec_device)
            self._anchor_on_exec[key] = base
        return alias_on(base, info.shape, info.stride, info.storage_offset, info.dtype)

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, TensorRef):
            real = self.env.get(value.id)
            if real is None:
                real = self.env[value.id] = self._from_anchor(value.id)
            return real
        if isinstance(value, ExternalRef):
            real = self._externals.get(value.index)
            if real is None:
                tensor = self.graph.externals[value.index].tensor
                real = self._externals[value.index] = tensor.to(self.plan.exec_device(tensor.device))
            return real
        if isinstance(value, torch.device):
            return self.plan.exec_device(value)
        return value

    def _run_scratch(self, index: OpIndex) -> None:
        """Run random op `index` on throwaway tensors of the recorded layout, to advance its generator."""
        op = self.graph.ops[index]
        written = {self.graph.tensors[tid].storage for tid in op.inputs} & set(op.writes)

        def scratch(value: Any) -> Any:
            if isinstance(value, TensorRef):
                info = self.graph.tensors[value.id]
                device = self.plan.exec_device(info.device)
                tensor = torch.empty_strided(info.shape, info.stride, dtype=info.dtype, device=device)
                return tensor if info.storage in written else tensor.fill_(1)
            return self._resolve(value) if not isinstance(value, TensorRef) else value

        args, kwargs = tree_map(scratch, (op.args, op.kwargs))
        op.func(*args, **kwargs)

    def run(
        self, fakes: Sequence[FakeTensor], tids: Sequence[TensorId], progress: Progress | None = None
    ) -> list[torch.Tensor]:
        """Materialize `fakes` (whose ids are `tids`); nothing is remembered unless all succeed."""
        with self.state.lock:
            ops = self.plan_ops(tids)
            self.check(ops, tids)
            done_at = self._completion_points(ops, tids)
            total_bytes = sum(self._nbytes(tid) for tid in set(tids))
            total_tensors = len(set(tids))
            with outside_recording(), RngSession(self.state.streams, self.plan.rng, self._run_scratch) as rng, \
                    self._parallel_fills():
                finished, finished_bytes = 0, 0
                for position, index in enumerate(ops):
                    try:
                        self._wait_for(index)
                        self._run_op(index, rng)
                        if position == len(ops) - 1:
                            self._wait_for(None)
                    except Exception as error:
                        op = self.graph.ops[index]
                        raise MaterializationError(
                            f"replaying {op.label} (recorded at {op.source or 'an unknown line'}) for "
                            f"{self._target_names(tids)} failed: {type(error).__name__}: {error}"
                        ) from error
                    for tid in done_at.get(position, ()):
                        finished += 1
                        finished_bytes += self._nbytes(tid)
                    if progress is not None and position in done_at:
                        progress(finished, total_tensors, finished_bytes, total_bytes)
                results = self._assemble(fakes, tids)
            for tid, result in zip(tids, results):
                self.memo[tid] = result
                sid = self.graph.tensors[tid].storage
                if sid not in self.anchor_store:
                    self.anchor_store[sid] = result
            return results

    def _nbytes(self, tid: TensorId) -> int:
        info = self.graph.tensors[tid]
        numel = 1
        for size in info.shape:
            numel *= size
        return numel * info.dtype.itemsize

    def _completion_points(self, ops: Sequence[OpIndex], tids: Sequence[TensorId]) -> dict[int, list[TensorId]]:
        """For progress: after which position in `ops` each target tensor is complete."""
        position_of = {index: position for position, index in enumerate(ops)}
        points: dict[int, list[TensorId]] = {}
        for tid in dict.fromkeys(tids):
            info = self.graph.tensors[tid]
            relevant = [info.producer, *self.graph.writers[info.storage]]
            positions = [position_of[i] for i in relevant if i in position_of]
            points.setdefault(max(positions, default=-1), []).append(tid)
        return points

    @contextlib.contextmanager
    def _parallel_fills(self) -> Iterator[None]:
        """With rng="fast", random fills own their seeds, so independent ones run side by side
        (CPU random kernels are single-threaded)."""
        workers = torch.get_num_threads()
        if self.plan.rng != "fast" or workers < 2:
            yield
            return
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="explorer-fill")
        try:
            yield
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            self._pending.clear()

    def _wait_for(self, index: OpIndex | None) -> None:
        """Wait for parallel fills of the storages op `index` touches (all of them for None)."""
        if not self._pending:
            return
        if index is None:
            storages = list(self._pending)
        else:
            op = self.graph.ops[index]
            storages = [self.graph.tensors[tid].storage for tid in op.inputs]
        for sid in storages:
            future = self._pending.pop(sid, None)
            if future is not None:
                future.result()

    def _submit_fill(self, op: Any, args: tuple, kwargs: dict) -> bool:
        """Run a seeded in-place random op on the pool; False when it must run here instead."""
        if self._pool is None or not (is_inplace_random(op.func) and accepts_generator(op.func)):
            return False
        target = args[0]
        if target.device.type != "cpu":
            return False
        key, position = op.stream
        generator = torch.Generator(device=target.device)
        generator.manual_seed(self.state.streams.fast_seed(key, position))
        sid = self.graph.tensors[op.inputs[0]].storage
        self._pending[sid] = self._pool.submit(
            _fill_in_mode, op.inference, op.func, args, {**kwargs, "generator": generator}
        )
        return True

    def _run_op(self, index: OpIndex, rng: RngSession) -> None:
        op = self.graph.ops[index]
        if op.inference != torch.is_inference_mode_enabled():
            with torch.inference_mode(op.inference):
                return self._run_op(index, rng)
        args, kwargs = tree_map(self._resolve, (op.args, op.kwargs))
        func = replayed_func(op.func)
        if op.stream is not None and self._submit_fill(op, args, kwargs):
            return  # in place: the output is args[0], already in env
        if op.stream is not None:
            key, position = op.stream
            exec_key = stream_key(self.plan.exec_device(torch.device(key)))
            if self.plan.exec_device(torch.device(key)).type != "meta":
                rng.before_random_op(key, position, exec_key)
                out = func(*args, **kwargs)
                rng.after_random_op(key, position)
            else:
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        refs, _ = tree_flatten(op.outputs)
        values, _ = tree_flatten(out)
        for ref, value in zip(refs, values):
            if isinstance(ref, TensorRef):
                self.env[ref.id] = value

    def _assemble(self, fakes: Sequence[FakeTensor], tids: Sequence[TensorId]) -> list[torch.Tensor]:
        results: dict[TensorId, torch.Tensor] = {}
        moved: dict[StorageId, torch.Tensor] = {}
        for fake, tid in zip(fakes, tids):
            if tid in results:
                continue
            known = self.memo.get(tid)
            if known is not None:
                results[tid] = known
                continue
            info = self.graph.tensors[tid]
            target = self.plan.target(info.device)
            if info.storage in self.anchors:
                anchor = self.anchors[info.storage]
                real = alias_on(anchor, info.shape, info.stride, info.storage_offset, info.dtype)
            else:
                real = self.env[tid]
                if normalize(real.device) != target:
                    if info.storage not in moved:
                        moved[info.storage] = storage_moved(real, target)
                    real = alias_on(moved[info.storage], info.shape, info.stride, info.storage_offset, info.dtype)
            results[tid] = _as_recorded_kind(real, fake)
        return [results[tid] for tid in tids]


def _fill_in_mode(inference: bool, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run a fill on a pool thread under the op's recorded inference mode (that mode is per thread)."""
    with torch.inference_mode(inference):
        return func(*args, **kwargs)


def _as_recorded_kind(real: torch.Tensor, fake: FakeTensor) -> torch.Tensor:
    """Parameters come back as nn.Parameter (same requires_grad); buffers as plain tensors."""
    if real.is_inference() and not torch.is_inference_mode_enabled():
        with torch.inference_mode():  # where eager made it: requires_grad is refused elsewhere
            return _as_recorded_kind(real, fake)
    if isinstance(fake, torch.nn.Parameter):
        return torch.nn.Parameter(real, requires_grad=fake.requires_grad)
    if fake.requires_grad and not real.requires_grad and real.is_leaf and real.is_floating_point():
        real.requires_grad_(True)
    return real
