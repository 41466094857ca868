"""Replaying a graph's recorded ops with real tensors.

One `Replay` serves one materialization call: it asks `InitGraph.closure_of` which ops the targets
need (skipping what earlier calls already produced), checks everything that could fail before
running anything, runs the ops in chronological order, then moves results to their target devices
and wraps parameters. Results are remembered per graph and device routing (weakly), so the same fake
gives the same real object and a view materialized later shares storage with its base.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, cast

import torch

from .._torch_compat.dispatch import tree_flatten, tree_map
from ..errors import MaterializationError
from ..graph import (
    ExternalRef,
    GeneratorState,
    InitGraph,
    OpIndex,
    OutLayout,
    StorageId,
    TensorId,
    TensorRef,
    draws_fixed_by_sizes,
    with_generator,
)
from ..hub_fetch import prefetch
from ..naming import dtype_name
from ..record.checkpoint_reads import READ_SAFETENSORS
from ..record.fake import DeferredHandle, handle_of, version_of
from ..record.foreign import READ_DEFERRED
from ..record.generators import stream_key
from ..record.scope import outside_recording
from ..record.weak_holders import register_weak_holder
from .fills import ParallelFills
from .mt19937 import draws_between
from .preflight import check_replayable, needing, target_names
from .real_memory import alias_of, as_fake_now, as_recorded_kind, storage_moved
from .rng import RngSession, RngStreams, own_generator
from .routing import DeviceRouting, normalize

# progress(done_tensors, total_tensors, done_bytes, total_bytes); may raise to cancel.
Progress = Callable[[int, int, int, int], None]
# on_step(step, detail): a step of one replay is done ("rng": generator states reached) or starts
# ("replay": the ops run); may raise to cancel.
StepReport = Callable[[str, str], None]


def _let_go(real: torch.Tensor) -> Callable[[], None] | None:
    """Every live replay's memo entries for `real`, dropped, and what puts them back: note
    [Materialized tensors swap too] in record/weak_holders.py. Swaps are rare; the scan is of each table."""
    held: list[tuple[weakref.WeakValueDictionary, Any]] = []
    for state in list(_LIVE_STATES):
        for tables in (state.results, state.anchors, state.slices):
            for table in tables.values():
                held.extend((table, key) for key, value in list(table.items()) if value is real)
    if not held:
        return None
    for table, key in held:
        del table[key]

    def restore() -> None:
        for table, key in held:
            table[key] = real

    return restore


_LIVE_STATES: weakref.WeakSet = weakref.WeakSet()
register_weak_holder(_let_go)


class ReplayState:
    """What replays of one graph keep between calls: RNG states and produced tensors (weakly).

    Note: [Writes after a tensor was made]
    A storage can have a real tensor and a fake at once: `materialize_tensor(m.weight)` hands out the
    real weight while the module keeps the fake; `materialize_module(m.x)` makes a buffer that another
    module's still-deferred buffer views; one side of a tie is materialized. An op recorded on the
    fake afterwards (`nn.init.zeros_(m.weight)`, `load_state_dict`, `m.y.row.zero_()`) writes that
    storage in eager, where there is one memory: the real tensor shows the write, and the fake's
    later materialization is that same memory. Replay keeps the real tensors it made (`Replay.memo`,
    and per storage an anchor), and would hand them out again as they were: the write would be lost on
    both sides, silently.

    So after each op recorded on a finished graph, every storage it wrote that has a live real tensor
    (an anchor, per device routing) is made again from the graph, now ending with that op, and the new
    bytes are copied into the real tensor's memory in place. Every real tensor on that storage (they
    are views of one memory) then holds eager's values, and materializing the fake gives that memory.
    The same holds for what changes the fake itself rather than its memory: an in-place layout op
    (`t_()`) is applied to the real tensor too (`after_recorded_layout_change`), and a module cast,
    which swaps the fake for its converted copy, sets the real tensor's `.data` to the copy's values
    (`after_recorded_swap`). A row made alone has memory of its own, a snapshot by design: it is
    made anew by the next call. Not followed: a `.data = x` swap of the fake.

    Refused instead, before the op is recorded (`MaterializationError` naming the op and line): a write
    to a storage whose real tensor was changed in place since it was made (its version moved:
    `p.add_(1)` under no_grad). Its bytes are no longer what the graph describes, and eager's result is
    its bytes with the new op applied, which replay cannot give. A write that resized the storage
    cannot be copied in place: the real tensors keep their bytes, and the next materialization makes
    the storage anew. Changes made through `.data` of a real tensor do not move its version and are
    not seen.
    """

    def __init__(self, graph: InitGraph) -> None:
        self.graph = graph
        self.streams = RngStreams(graph, eager_state_after)
        # Per memo key (`memo_key`): results by tensor id, one result per storage (its anchor), the
        # routing, and each result's version when made (note [Writes after a tensor was made]).
        self.results: dict[tuple, weakref.WeakValueDictionary] = {}
        self.anchors: dict[tuple, weakref.WeakValueDictionary] = {}
        self.routings: dict[tuple, DeviceRouting] = {}
        self.versions: dict[tuple, dict[TensorId, int | None]] = {}  # None: an inference tensor
        self.slices: dict[tuple, weakref.WeakValueDictionary] = {}  # views made alone (slices.py)
        self.lock = threading.RLock()
        self._devices: tuple[int, frozenset[torch.device]] = (-1, frozenset())
        _LIVE_STATES.add(self)

    def memo_key(self, routing: DeviceRouting) -> tuple:
        """Which results a routing may share: the same rng mode and the same target for every device
        the graph records on, however the call spelled them (`None`, "cpu", "cpu:0")."""
        count, devices = self._devices
        if count != len(self.graph.tensors):
            devices = frozenset(info.device for info in self.graph.tensors.values())
            self._devices = (len(self.graph.tensors), devices)
        key = (routing.rng, tuple(sorted((str(d), str(routing.target(d))) for d in devices)))
        if key not in self.routings:  # results made before the graph recorded on another device still hold
            self._adopt_older_key(key, routing)
        return key

    def _adopt_older_key(self, key: tuple, routing: DeviceRouting) -> None:
        """Move the results of a key made when the graph recorded on fewer devices, which `routing`
        routes the same way, to `key`."""
        for older in list(self.routings):
            if older[0] == routing.rng and all(str(routing.target(torch.device(d))) == t for d, t in older[1]):
                tables: tuple[dict[tuple, Any], ...] = (
                    self.results,
                    self.anchors,
                    self.routings,
                    self.versions,
                    self.slices,
                )
                for table in tables:
                    if older in table:
                        table[key] = table.pop(older)
                self.routings[key] = routing
                return

    def forget_states(self, key: str, position: int) -> None:
        with self.lock:
            self.streams.forget_from(key, position)

    def forget_storage(self, key: tuple, sid: StorageId) -> None:
        """Results on storage `sid` are no longer handed out again under `key` (it was remade)."""
        with self.lock:
            memo: MutableMapping[TensorId, torch.Tensor] = self.results.get(key, {})
            for tid in [t for t in memo if self.graph.tensors[t].storage == sid]:
                del memo[tid]
            anchors = self.anchors.get(key)
            if anchors is not None:
                anchors.pop(sid, None)

    def changed_results(self, key: tuple, sid: StorageId) -> bool:
        """Whether a live result on storage `sid` under `key` was changed in place since it was made."""
        versions = self.versions.get(key, {})
        for tid, result in list(self.results.get(key, {}).items()):
            if self.graph.tensors[tid].storage == sid and version_of(result) != versions.get(tid):
                return True
        return False

    def before_recorded_write(self, tids: Iterable[TensorId], where: str) -> None:
        """Refuse an op about to be recorded that writes tensors `tids`, when a real tensor made on
        their memory was changed in place since (note [Writes after a tensor was made]). `where`
        names the op and its line."""
        graph = self.graph
        with self.lock:
            for key, anchors in self.anchors.items():
                for tid in tids:
                    info = graph.tensors[tid]
                    if info.storage in anchors and self.changed_results(key, info.storage):
                        raise MaterializationError(
                            f"{where} writes a {dtype_name(info.dtype)}{list(info.shape)} tensor whose memory "
                            "was materialized and then changed in place; the write cannot be applied to those "
                            "changed values. Materialize the module that holds it and write the real tensor, "
                            "or write before changing the materialized one"
                        )

    def after_recorded_writes(self, written: Mapping[StorageId, TensorId]) -> None:
        """Real tensors made on the storages in `written` (storage → a tensor on it) take the values
        the graph now gives them, in place (note [Writes after a tensor was made])."""
        with self.lock:
            for key in self.slices:
                self._forget_slices(key, written)
            for key, anchors in self.anchors.items():
                self.heirs_anchored(key)  # a view's result may outlive its base's
                for sid, tid in written.items():
                    anchor = anchors.get(sid)
                    if anchor is None or anchor.device.type == "meta":
                        continue
                    fresh = self._made_again(key, sid, tid)
                    memory = anchor.untyped_storage()
                    if fresh.untyped_storage().nbytes() != memory.nbytes():
                        self.forget_storage(key, sid)  # resized: the next materialization makes it anew
                        continue
                    with torch.no_grad():
                        memory.copy_(fresh.untyped_storage())

    def forget_results(self, graph: InitGraph, released: Sequence[torch.Tensor]) -> None:
        """Forget results handed out earlier and now given back (release_module): a later call makes
        them afresh, over the memory of a result on the same storage that is still alive (a view
        kept materialized), else in new memory."""
        gone = {id(tensor) for tensor in released}
        with self.lock:
            for key, memo in self.results.items():
                heirs: dict[StorageId, torch.Tensor] = {}
                for tid, result in list(memo.items()):
                    if id(result) in gone:
                        del memo[tid]
                    else:
                        heirs.setdefault(graph.tensors[tid].storage, result)
                anchors: MutableMapping[StorageId, torch.Tensor] = self.anchors.get(key, {})
                for sid, anchor in list(anchors.items()):
                    if id(anchor) in gone:
                        del anchors[sid]
                        if sid in heirs:
                            anchors[sid] = heirs[sid]

    def after_recorded_layout_change(
        self, before: TensorId, after: TensorId, apply: Callable[[torch.Tensor], object]
    ) -> None:
        """A fake that was tensor `before` is now `after`, by an in-place layout op on its same
        storage (`t_()`): a real tensor made for `before` takes the op too and is `after`'s, as
        eager's one tensor object (note [Writes after a tensor was made])."""
        if self.graph.tensors[before].storage != self.graph.tensors[after].storage:
            return  # moved to other memory (`set_`): made anew when asked
        with self.lock:
            for key, memo in self.results.items():
                real = memo.get(before)
                if real is None:
                    continue
                with outside_recording(), torch.no_grad():
                    apply(real)
                memo[after] = real
                self.versions[key][after] = version_of(real)

    def after_recorded_swap(self, before: TensorId, after: TensorId) -> None:
        """A fake parameter that was tensor `before` holds `after` now (`model.half()` swaps each
        fake for its converted copy): a real tensor made for it gets `after`'s values as its
        `.data`, as eager's `_apply` sets a parameter's data, and is `after`'s result from now on."""
        sid = self.graph.tensors[after].storage
        with self.lock:
            for key, memo in self.results.items():
                real = memo.get(before)
                if real is None or real.device.type == "meta":
                    continue
                fresh = self._made_again(key, sid, after)
                with outside_recording(), torch.no_grad():
                    real.data = fresh
                memo[after] = real
                self.anchors[key][sid] = real
                self.versions[key][after] = version_of(real)

    def _made_again(self, key: tuple, sid: StorageId, tid: TensorId) -> torch.Tensor:
        """Storage `sid` made again from the graph, from the real tensors already made for the other
        storages it reads (as they are now, as eager's would be), for tensor `tid` on it."""
        replay = Replay(self.graph, self.routings[key], remember=False)
        replay.anchors = {s: a for s, a in self.anchors[key].items() if s != sid}
        stand_in = torch.empty(0, device="meta")  # only the bytes are wanted: no Parameter class
        return replay.run([stand_in], [tid])[0]

    def _forget_slices(self, key: tuple, written: Mapping[StorageId, TensorId]) -> None:
        """Views made alone (their own memory: a snapshot by design) of written storages are made
        anew by the next call."""
        slices: MutableMapping[TensorId, torch.Tensor] = self.slices.get(key, {})
        for tid in [t for t in slices if self.graph.tensors[t].storage in written]:
            del slices[tid]

    def heirs_anchored(self, key: tuple) -> None:
        """A storage whose anchor was collected while another result on it lives is anchored by that
        one, so the next result on the storage shares its memory, as eager's views do."""
        anchors = self.anchors.setdefault(key, weakref.WeakValueDictionary())
        for tid, result in list(self.results.get(key, {}).items()):
            sid = self.graph.tensors[tid].storage
            if sid not in anchors:
                anchors[sid] = result

    @staticmethod
    def of(graph: InitGraph) -> ReplayState:
        if graph.replay_state is None:
            graph.replay_state = ReplayState(graph)
        return cast(ReplayState, graph.replay_state)  # the one implementation of the graph's ReplayMemory


# `torch.tensor([...])` records `lift_fresh(constant)`, which returns the constant itself: replaying
# it as is would let later recorded in-place ops write into the graph's copy of the constant (so a
# second replay would start from a changed value, and is refused as "modified in place").


_LEAVES_TO_MAP = (TensorRef, ExternalRef, torch.device, GeneratorState)


def map_arguments(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value` (a recorded op's args or kwargs) with `leaf` applied to every TensorRef, ExternalRef
    and device in it. Plain recursion over the tuples, lists and dicts aten arguments are made of,
    pytree only for other containers: pytree costs microseconds per op, and this runs per op."""
    kind = type(value)
    if kind is tuple:
        return tuple([map_arguments(item, leaf) for item in value])
    if kind is list:
        return [map_arguments(item, leaf) for item in value]
    if kind is dict:
        return {name: map_arguments(item, leaf) for name, item in value.items()}
    if kind in _LEAVES_TO_MAP:
        return leaf(value)
    if isinstance(value, (tuple, list, dict)):
        return tree_map(lambda item: leaf(item) if isinstance(item, _LEAVES_TO_MAP) else item, value)
    return value


def replayed_func(func: Any) -> Any:
    """What runs for a recorded op: the op itself, except `lift_fresh`, which copies its constant in
    its layout (`lifted_copy`)."""
    return _RUN_AS.get(func, func)


def lifted_copy(constant: torch.Tensor) -> torch.Tensor:
    """`lift_fresh` as replay runs it: a copy of the constant's memory, in its layout. Eager's tensor
    *is* the constant, so `torch.from_numpy(a.T)` keeps numpy's strides and `torch.as_tensor(a[:, 1:3])`
    its storage's extent; `lift_fresh_copy` would make them contiguous. Copied, so the recording's
    constant is never handed out."""
    copy = torch.empty(0, dtype=constant.dtype, device=constant.device)
    return copy.set_(constant.untyped_storage().clone(), constant.storage_offset(), constant.shape, constant.stride())


_RUN_AS: dict[Any, Callable[..., Any]] = {torch.ops.aten.lift_fresh.default: lifted_copy}


class Replay:
    """One materialization call over one graph."""

    def __init__(
        self,
        graph: InitGraph,
        routing: DeviceRouting,
        *,
        remember: bool = True,
        names: dict[TensorId, str] | None = None,
    ) -> None:
        self.graph = graph
        self.routing = routing
        self.state = ReplayState.of(graph)
        self.names = names or {}
        if remember:
            key = self.memo_key = self.state.memo_key(routing)
            self.state.routings.setdefault(key, routing)
            self.state.heirs_anchored(key)
            self.memo = self.state.results.setdefault(key, weakref.WeakValueDictionary())
            self.anchor_store = self.state.anchors.setdefault(key, weakref.WeakValueDictionary())
            self.versions = self.state.versions.setdefault(key, {})
        else:
            self.memo, self.anchor_store = weakref.WeakValueDictionary(), weakref.WeakValueDictionary()
            self.versions = {}
        self.anchors: dict[StorageId, torch.Tensor] = dict(self.anchor_store.items())  # strong, this call
        self.stale: set[StorageId] = set()
        self.env: dict[TensorId, torch.Tensor] = {}
        self._externals: dict[int, torch.Tensor] = {}
        self._anchor_on_exec: dict[tuple[StorageId, torch.device], torch.Tensor] = {}

    # -- which ops to run ------------------------------------------------------------------
    def _reusable(self, sid: StorageId) -> bool:
        return sid in self.anchors and sid not in self.stale

    def ops_to_run(self, tids: Sequence[TensorId]) -> list[OpIndex]:
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
                newly_stale.add(sid)  # noqa: B023 - called only by this iteration's closure_of, below
                return False

            ops = self.graph.closure_of(
                tids,
                skip_dead_writes=True,  # random ops skipped are jumped (or run on scratch) by RngSession
                has_object=lambda tid: self._reusable(tensors[tid].storage),
                storage_ready=storage_ready,
            )
            if not newly_stale:
                return ops
            self.stale |= newly_stale

    def _prefetch_hub_reads(self, ops: Sequence[OpIndex]) -> None:
        """Fetch the bytes of the Hub-backed checkpoint reads among `ops` at once: contiguous tensors
        of a file in one request, files in parallel (hub_fetch.prefetch); local reads are skipped."""
        reads = [self.graph.ops[i].args[:4] for i in ops if self.graph.ops[i].func is READ_SAFETENSORS]
        if reads:
            prefetch([(path, key, list(shape), dtype) for path, key, shape, dtype in reads])

    # -- running -----------------------------------------------------------------------------
    def _from_anchor(self, tid: TensorId) -> torch.Tensor:
        info = self.graph.tensors[tid]
        exec_device = self.routing.exec_device(info.device)
        key = (info.storage, exec_device)
        base = self._anchor_on_exec.get(key)
        if base is None:
            anchor = self.anchors[info.storage]
            base = anchor if anchor.device == exec_device else storage_moved(anchor, exec_device)
            self._anchor_on_exec[key] = base
        return alias_of(base, info)

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, TensorRef):
            real = self.env.get(value.id)
            if real is None:
                real = self.env[value.id] = self._from_anchor(value.id)
            return real
        if isinstance(value, ExternalRef):
            real = self._externals.get(value.index)
            if real is None:
                tensor = self.graph.externals[value.index].value()
                real = self._externals[value.index] = tensor.to(self.routing.exec_device(tensor.device))
            return real
        if isinstance(value, torch.device):
            return self.routing.exec_device(value)
        if isinstance(value, GeneratorState):
            return own_generator(value, self.routing.exec_device(value.device))
        return value

    def _resolved(self, value: Any) -> Any:
        """`value` (an op's args or kwargs) with every reference replaced by its real tensor or device."""
        return map_arguments(value, self._resolve)

    def run_scratch(self, index: OpIndex, extra: dict | None = None) -> None:
        """Run random op `index` on throwaway tensors of the recorded layout, to advance its generator
        (the one `extra` gives, else its device's default generator)."""
        op = self.graph.ops[index]
        if extra and self.routing.exec_device(torch.device("cpu")).type != "cpu":
            extra = None  # rng="fast" runs CPU-recorded ops elsewhere: the CPU generator cannot drive them
        if op.reads and not draws_fixed_by_sizes(op.func):  # note [Draws fixed by sizes]
            return self._run_on_eagers_inputs(index, extra or {})
        written = {self.graph.tensors[tid].storage for tid in op.inputs} & set(op.writes)

        def scratch(value: Any) -> Any:
            if isinstance(value, TensorRef):
                info = self.graph.tensors[value.id]
                device = self.routing.exec_device(info.device)
                tensor = torch.empty_strided(info.shape, info.stride, dtype=info.dtype, device=device)
                return tensor if info.storage in written else tensor.fill_(1)
            return self._resolve(value) if not isinstance(value, TensorRef) else value

        args, kwargs = map_arguments(op.args, scratch), map_arguments(op.kwargs, scratch)
        args, kwargs = with_generator(op.func, args, kwargs, extra or {})
        op.func(*args, **kwargs)

    def _run_on_eagers_inputs(self, index: OpIndex, extra: dict) -> None:
        """`run_scratch` for an op whose draw count may depend on its inputs' values (`poisson`):
        its inputs are made as eager had them, by a replay of their closure on the recorded devices
        (whose own generator moves are put back), then it runs on them."""
        op = self.graph.ops[index]
        inputs = Replay(self.graph, DeviceRouting((), (), None, "eager"), remember=False, names=self.names)
        ops = self.graph.inputs_closure(index)
        with (
            RngSession(inputs.state.streams, "eager", inputs.run_scratch) as rng,
            ParallelFills(self.graph, rng.fill_generator, ops) as fills,
        ):
            for before in ops:
                fills.wait_for(before)
                inputs._run_op(before, rng, fills)
            fills.wait_for(None)

        def eager_input(value: Any) -> Any:
            if isinstance(value, TensorRef) and value.id not in op.reads:  # only written: its values unused
                info = self.graph.tensors[value.id]
                device = inputs.routing.exec_device(info.device)
                return torch.empty_strided(info.shape, info.stride, dtype=info.dtype, device=device)
            return inputs._resolve(value)

        args, kwargs = map_arguments(op.args, eager_input), map_arguments(op.kwargs, eager_input)
        args, kwargs = with_generator(op.func, args, kwargs, extra)
        op.func(*args, **kwargs)

    def check(self, tids: Sequence[TensorId]) -> None:
        """Raise what `run(..., tids)` would refuse before running anything, and run nothing: for
        callers that must know before they change a module (`fully_shard_deferred`)."""
        with self.state.lock:
            check_replayable(self.graph, self.routing, self.ops_to_run(tids), tids, self.names)

    def run(
        self,
        fakes: Sequence[torch.Tensor],
        tids: Sequence[TensorId],
        progress: Progress | None = None,
        on_step: StepReport | None = None,
    ) -> list[torch.Tensor]:
        """Materialize `fakes` (whose ids are `tids`); nothing is remembered unless all succeed."""
        self._read_other_recordings_first(tids)
        with self.state.lock:
            ops = self.ops_to_run(tids)
            check_replayable(self.graph, self.routing, ops, tids, self.names)
            self._prefetch_hub_reads(ops)
            done_at = self._completion_points(ops, tids)
            total_bytes = sum(self._nbytes(tid) for tid in set(tids))
            total_tensors = len(set(tids))
            with outside_recording():
                self._read_other_recordings(ops)
            with (
                outside_recording(),
                RngSession(self.state.streams, self.routing.rng, self.run_scratch) as rng,
                ParallelFills(self.graph, rng.fill_generator, ops) as fills,
            ):
                self._position_generators(ops, rng, on_step)
                finished, finished_bytes = 0, 0
                for tid in done_at.pop(-1, ()):  # made before (memoized): complete before any op runs
                    finished, finished_bytes = finished + 1, finished_bytes + self._nbytes(tid)
                if progress is not None and finished:
                    progress(finished, total_tensors, finished_bytes, total_bytes)
                for position, index in enumerate(ops):
                    try:
                        fills.wait_for(index)
                        self._run_op(index, rng, fills)
                        if position == len(ops) - 1:
                            fills.wait_for(None)
                    except MaterializationError:
                        raise  # the engine's own refusals (eager's generator state unknowable) name their op
                    except Exception as error:
                        op = self.graph.ops[index]
                        raise MaterializationError(
                            f"replaying {op.label} (recorded at {op.source or 'an unknown line'}) for "
                            f"{target_names(self.names, needing(self.graph, tids, {index}))} failed: "
                            f"{type(error).__name__}: {error}"
                        ) from error
                    for tid in done_at.get(position, ()):
                        finished += 1
                        finished_bytes += self._nbytes(tid)
                    if progress is not None and position in done_at:
                        progress(finished, total_tensors, finished_bytes, total_bytes)
                results = self._assemble(fakes, tids)
            for tid, result in zip(tids, results):
                self.memo[tid] = result
                self.versions[tid] = version_of(result)
                sid = self.graph.tensors[tid].storage
                if sid not in self.anchor_store:
                    self.anchor_store[sid] = result
            return results

    def _read_other_recordings_first(self, tids: Sequence[TensorId]) -> None:
        """Note: [Recordings that read each other]
        Two recordings can read each other: B's constructor read A, then an op on A read B. Then
        materializing A replays part of B, and materializing B part of A, each under its graph's
        lock. Were the other recording read with that lock held, two threads materializing A and B
        at once would each wait for the lock the other holds. So the other recordings' values are
        read first, holding no lock; the run under the lock then finds them read."""
        if not any(handle_of(external.tensor) is not None for external in self.graph.externals):
            return  # reads no other recording: the common case, with no closure walked twice
        with outside_recording():
            self._read_other_recordings(self.graph.closure_of(tids, skip_dead_writes=True))

    def _read_other_recordings(self, ops: Sequence[OpIndex]) -> None:
        """The values of other recordings' tensors that `ops` read, made by replays of those
        recordings with this call's devices and rng, before this replay starts (note [Reading
        another recording] in record/foreign.py)."""
        for index in ops:
            op = self.graph.ops[index]
            if op.func is not READ_DEFERRED or op.externals[0] in self._externals:
                continue
            pinned = self.graph.externals[op.externals[0]].tensor
            handle = cast(DeferredHandle, handle_of(pinned))
            name = f"a tensor of another deferred recording, read at {op.source or 'an unknown line'}"
            other = Replay(handle.graph, self.routing, remember=False, names={handle.tensor_id: name})
            real = other.run([pinned], [handle.tensor_id])[0]
            self._externals[op.externals[0]] = real.to(self.routing.exec_device(pinned.device))

    def _position_generators(self, ops: Sequence[OpIndex], rng: RngSession, on_step: StepReport | None) -> None:
        """With rng="eager" and a step report, reach eager's generator state before every random op
        to run, as a step of its own (jumps, plus scratch runs of ops of unknown draw count); the
        ops then find them cached. Without a report the ops reach their states as they come, so
        the jump for one op runs while the fill threads draw the ones before it."""
        if self.routing.rng != "eager" or on_step is None:
            return
        wanted = [
            op.stream
            for op in map(self.graph.ops.__getitem__, ops)
            if op.stream is not None and self.routing.exec_device(op.stream[0]).type != "meta"
        ]
        jumps = self.state.streams.jumps
        before = (jumps.count, jumps.draws, jumps.offsets, jumps.seconds, jumps.scratch_runs)
        started = time.perf_counter()
        for key, position in wanted:
            rng.state_before(key, position)
        if on_step is not None:
            now = (jumps.count, jumps.draws, jumps.offsets, jumps.seconds, jumps.scratch_runs)
            count, draws, offsets, seconds, scratch = (after - then for after, then in zip(now, before))
            philox = f" and {offsets:,} of CUDA offset" if offsets else ""
            on_step(
                "rng",
                f"generator at eager's state for {len(wanted)} random op{'s' * (len(wanted) != 1)}: "
                f"{count} jump{'s' * (count != 1)} over {draws:,} draws{philox} ({seconds:.2f} s), "
                f"{scratch} op{'s' * (scratch != 1)} re-run on scratch, "
                f"{time.perf_counter() - started:.2f} s in all",
            )
            on_step("replay", f"running {len(ops)} recorded ops")

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

    def _run_op(self, index: OpIndex, rng: RngSession, fills: ParallelFills) -> None:
        op = self.graph.ops[index]
        if op.inference != torch.is_inference_mode_enabled():
            with torch.inference_mode(op.inference):
                return self._run_op(index, rng, fills)
        if (op.default_dtype or torch.float32) is not torch.get_default_dtype():
            with default_dtype_set(op.default_dtype or torch.float32):
                return self._run_op(index, rng, fills)
        args, kwargs = self._resolved(op.args), self._resolved(op.kwargs)
        func = replayed_func(op.func)
        if op.stream is not None and fills.submit(op, args, kwargs):
            return  # in place: the output is args[0], already in env
        if op.stream is not None:
            key, position = op.stream
            exec_device = self.routing.exec_device(key)
            if exec_device.type != "meta":
                extra = rng.before_random_op(key, position, stream_key(exec_device), op.func)
                args, kwargs = with_generator(op.func, args, kwargs, extra)
                out = func(*args, **kwargs)
                rng.after_random_op(key, position)
            else:
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        for layout in op.out_layouts:
            _lay_out_as_recorded(layout, kwargs)
        self._keep_outputs(op.outputs, out)

    def _keep_outputs(self, refs: Any, out: Any) -> None:
        """Bind the op's real outputs to the tensor ids its recorded outputs carry."""
        if type(refs) is TensorRef:
            self.env[refs.id] = out
            return
        flat_refs, _ = tree_flatten(refs)
        values, _ = tree_flatten(out)
        for ref, value in zip(flat_refs, values):
            if isinstance(ref, TensorRef):
                self.env[ref.id] = value

    def _assemble(self, fakes: Sequence[torch.Tensor], tids: Sequence[TensorId]) -> list[torch.Tensor]:
        results: dict[TensorId, torch.Tensor] = {}
        moved: dict[StorageId, torch.Tensor] = {}
        for fake, tid in zip(fakes, tids):
            if tid in results:
                continue
            known = self.memo.get(tid)
            if known is not None:
                results[tid] = as_fake_now(known, fake)
                continue
            info = self.graph.tensors[tid]
            target = self.routing.target(info.device)
            if info.storage in self.anchors:
                anchor = self.anchors[info.storage]
                real = alias_of(anchor, info)
            else:
                real = self.env[tid]
                if normalize(real.device) != target:
                    if info.storage not in moved:
                        moved[info.storage] = storage_moved(real, target)
                    real = alias_of(moved[info.storage], info)
            results[tid] = as_recorded_kind(real, fake)
        return [results[tid] for tid in tids]


def _lay_out_as_recorded(layout: OutLayout, kwargs: dict) -> None:
    """Note: [Out layouts as recorded]
    An op writing an `out=` it resizes (`torch.cholesky_inverse(a, out=torch.zeros(0))`), or even one
    of the right shape (`linalg.solve`), lays the result out as its kernel chooses, and the fake kernel
    may choose other strides than the CPU's (row-major where the CPU kernel writes column-major).
    While recording on the CPU, such an op (not a random one: it would draw) is run once on its
    inputs' true values, its outs laid out as they were, to learn the kernel's strides, and the fakes
    take them (`computed.kernel_out_strides`): the recording then holds eager's layout and this does
    nothing. Where that could not be had (a random op, inputs over the value-read limit, another
    device), the recording holds the fake's layout, which later ops read the memory through, so the
    real result is copied into that layout: eager's values, in the recorded strides."""
    name, shape, stride = layout
    real = kwargs.get(name)
    if not isinstance(real, torch.Tensor) or (tuple(real.shape), tuple(real.stride())) == (shape, stride):
        return
    laid_out = torch.empty_strided(shape, stride, dtype=real.dtype, device=real.device)
    laid_out.copy_(real)
    real.set_(laid_out.untyped_storage(), 0, shape, stride)


@contextlib.contextmanager
def default_dtype_set(dtype: torch.dtype) -> Iterator[None]:
    """Run the block under default dtype `dtype`, as an op was recorded (note [Default dtype at
    record time]). The default is process-wide: another thread's factory calls see it for the
    length of the block."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def eager_state_after(graph: InitGraph, key: str, position: int) -> torch.Tensor:
    """Eager's generator state right after random op `position` of `graph`'s stream `key` (where a
    later recording continues; note [Eager's generator after construction]). The generator is
    given back as it was."""
    routing = DeviceRouting(exact=((key, torch.device(key)),), by_type=(), default=None, rng="eager")
    replay = Replay(graph, routing, remember=False)
    with outside_recording(), RngSession(replay.state.streams, "eager", replay.run_scratch) as rng:
        return rng.state_after(key, position)


# Measuring a draw count runs the op on scratch and walks the sequence: bounded (about a second).
MEASURED_DRAWS_LIMIT = 1 << 26


def eager_draw_count(graph: InitGraph, key: str, position: int) -> int | None:
    """The 32-bit draws random op `position` of `graph`'s CPU stream took in eager construction,
    measured by running it from eager's state (for ops whose count depends on their values, such
    as trunc_normal_'s rejection sampling); None when it touches the cached normal sample or its
    distance passes `MEASURED_DRAWS_LIMIT`."""
    routing = DeviceRouting(exact=((key, torch.device(key)),), by_type=(), default=None, rng="eager")
    replay = Replay(graph, routing, remember=False)
    # Private states: the op's successor may be about to get a restart, which the graph's cached
    # states (ReplayState.streams) must not have guessed before it exists.
    streams = RngStreams(graph, eager_state_after)
    with outside_recording(), RngSession(streams, "eager", replay.run_scratch) as rng:
        before = rng.state_before(key, position)
        after = rng.state_after(key, position)
    return draws_between(before, after, MEASURED_DRAWS_LIMIT)
