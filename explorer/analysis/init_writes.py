"""Every write to every storage of a recorded graph, and what each tensor's final value comes from.

Note: [Init audit: which write counts]
One pass over the ops turns each into events on the storages it touches: a *write* (the op that
created a storage with values, or wrote one in place or through `out=`) with the bytes its target
view covers, and a *read* (an op reading a view's contents). Walking a storage's events backwards
gives, exactly and byte for byte, through views:
- which bytes each write determines in the final value (those no later write covers again);
- which writes are *dead*: every byte they wrote was overwritten by a later write before any op
  read it (replay cost with no effect: Hugging Face's second initialization, a `torch.zeros`
  parameter re-drawn by `normal_`);
- which bytes nothing wrote after an allocation that leaves memory as it was (`torch.empty`,
  `new_empty`, ...): *uninitialized*, values that differ from run to run.
A write that reads what it overwrites (`mul_(2)`) determines its bytes from their previous value:
its distribution is that of the previous writes on those bytes, transformed. Writes to elements
chosen by values (`index_put_`, `masked_fill_`, `scatter_`) cover an unknown part of their view:
they count for their element count in the mixture but cover nothing (an unwritten byte beside them
may be reported, never hidden).

This is `InitGraph.closure_of(skip_dead_writes=True)`'s notion of a dead write, made exact for
partial writes and computed for the whole graph in one pass, not per tensor.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from ..graph import ExternalRef, InitGraph, OpIndex, OpNode, SourceLocation, StorageId, TensorId, TensorRef
from ..inspection.checkpoint_sources import is_checkpoint_read
from ..record.builder import written_arguments
from ..record.fake import is_fake
from . import init_distributions as dists
from .init_distributions import Distribution
from .init_regions import Region

# Allocations that leave memory as it was (`torch.empty`, `to_empty`, `new_empty`): no write.
_ALLOCATIONS = frozenset(
    {
        "empty",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "empty_like",
        "empty_permuted",
    }
)
# Writes to elements chosen by the values of an index or mask: an unknown part of their view.
_SELECTED_WRITES = frozenset(
    {
        "index_put_",
        "index_fill_",
        "index_copy_",
        "index_add_",
        "index_reduce_",
        "masked_fill_",
        "masked_scatter_",
        "scatter_",
        "scatter_add_",
        "scatter_reduce_",
        "put_",
        "_index_put_impl_",
    }
)
# Ops whose output is their input's values (dtype, layout or device changed at most).
_VALUE_COPIES = frozenset(
    {
        "_to_copy",
        "clone",
        "contiguous",
        "to",
        "_unsafe_view",
        "view_copy",
        "alias_copy",
        "detach_copy",
        "lift_fresh_copy",
        "reshape",
        "expand_copy",
        "permute_copy",
        "t_copy",
        "transpose_copy",
    }
)
# In-place writes that replace every element of their target without reading it.
_OVERWRITING_NAMES = frozenset(
    {
        "fill_",
        "zero_",
        "copy_",
        "uniform_",
        "normal_",
        "trunc_normal_",
        "random_",
        "exponential_",
        "geometric_",
        "log_normal_",
        "cauchy_",
        "bernoulli_",
    }
)
_CONSTANT_CREATORS = {"zeros": 0.0, "zeros_like": 0.0, "new_zeros": 0.0, "ones": 1.0, "ones_like": 1.0, "new_ones": 1.0}
_FULL_CREATORS = frozenset({"full", "full_like", "new_full"})
_COMPUTED_DEPTH = 6  # how many producers back a "computed (...)" text names


def short_name(op: OpNode) -> str:
    """`aten.uniform_.default` → `uniform_`, `explorer.trunc_normal_.default` → `trunc_normal_`."""
    func = op.func
    schema = getattr(func, "_schema", None)
    return schema.name.split("::")[-1] if schema is not None else op.label


def bound_arguments(op: OpNode) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in."""
    schema = getattr(op.func, "_schema", None)
    if schema is None:
        return {}
    bound: dict[str, Any] = {}
    for position, argument in enumerate(schema.arguments):
        if position < len(op.args) and not argument.kwarg_only:
            bound[argument.name] = op.args[position]
        elif argument.name in op.kwargs:
            bound[argument.name] = op.kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


@dataclass(frozen=True, slots=True)
class WriteEvent:
    op: OpIndex
    tensor: TensorId  # the view written (the created tensor, for a creator)
    region: Region
    reads_target: bool  # reads the bytes it overwrites (`mul_`): its value derives from theirs
    selected: bool  # writes elements chosen by values: an unknown part of `region`
    creates: bool


@dataclass(frozen=True, slots=True)
class ReadEvent:
    op: OpIndex
    region: Region


@dataclass(frozen=True)
class StorageOutcome:
    """A storage's history, walked backwards (see note [Init audit: which write counts])."""

    # (write, the bytes it is the last to cover, of those the bytes index/mask writes after it took
    # (somewhere in them: which ones depends on values), the bytes whose value it determines)
    contributions: tuple[tuple[WriteEvent, Region, int, int], ...]
    dead: tuple[WriteEvent, ...]
    writes: tuple[WriteEvent, ...]
    unwritten: Region  # bytes no write covers


@dataclass(frozen=True)
class TensorInit:
    """What one recorded tensor's value comes from."""

    distribution: Distribution
    writes: int  # writes touching its bytes (an initializing creator included)
    dead_writes: int
    dead_bytes: int  # bytes those dead writes write at replay
    uninitialized: int  # elements never written
    numel: int
    source: SourceLocation | None  # the line of the write that determines most of its elements
    last_op: OpIndex | None


class GraphAudit:
    """The init audit of one recorded graph: events per storage, outcomes and descriptions, cached."""

    def __init__(self, graph: InitGraph, until: OpIndex | None = None) -> None:
        self.graph = graph
        self.end = len(graph.ops) if until is None else until
        self._regions: dict[TensorId, Region] = {}
        self._events: dict[StorageId, list[WriteEvent | ReadEvent]] = {}
        self._outcomes: dict[tuple[StorageId, OpIndex], StorageOutcome] = {}
        self._collect()

    # -- events ------------------------------------------------------------------------------

    def region(self, tid: TensorId) -> Region:
        region = self._regions.get(tid)
        if region is None:
            info = self.graph.tensors[tid]
            region = Region.of_layout(info.shape, info.stride, info.storage_offset, info.dtype.itemsize)
            self._regions[tid] = region
        return region

    def _collect(self) -> None:
        tensors, events = self.graph.tensors, self._events
        for op in self.graph.ops[: self.end]:
            if op.aliases_only and not op.creates:
                continue
            name = short_name(op)
            targets = self._written_targets(op) if op.writes else {}
            for tid in op.reads:
                if tid not in targets:
                    events.setdefault(tensors[tid].storage, []).append(ReadEvent(op.index, self.region(tid)))
            for tid, reads_target in targets.items():
                events.setdefault(tensors[tid].storage, []).append(
                    WriteEvent(op.index, tid, self.region(tid), reads_target, name in _SELECTED_WRITES, False)
                )
            if op.creates and name not in _ALLOCATIONS:
                for tid in op.output_ids:
                    sid = tensors[tid].storage
                    if sid in op.creates and tensors[tid].producer == op.index:
                        events.setdefault(sid, []).append(
                            WriteEvent(op.index, tid, self.region(tid), False, False, True)
                        )

    def _written_targets(self, op: OpNode) -> dict[TensorId, bool]:
        """The views `op` writes, each with whether the op reads the bytes it overwrites."""
        targets: dict[TensorId, bool] = {}
        for position, name in written_arguments(op.func) if hasattr(op.func, "_schema") else ():
            value = op.args[position] if position is not None and position < len(op.args) else op.kwargs.get(name)
            for ref in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(ref, TensorRef):
                    # out= arguments are not read; `self` is, unless the op overwrites it (fill_, copy_)
                    reads = name == "self" and not op.overwrites and short_name(op) not in _OVERWRITING_NAMES
                    targets[ref.id] = reads and ref.id in op.reads
        return targets

    def events(self, sid: StorageId) -> list[WriteEvent | ReadEvent]:
        return self._events.get(sid, [])

    # -- outcomes ----------------------------------------------------------------------------

    def outcome(self, sid: StorageId, until: OpIndex | None = None) -> StorageOutcome:
        """The storage's history up to (not including) op `until` (default: the end), walked backwards."""
        until = self.end if until is None else until
        key = (sid, until)
        cached = self._outcomes.get(key)
        if cached is not None:
            return cached
        covered_unread = Region.empty()  # bytes overwritten later, unread in between
        later = Region.empty()  # bytes any later write covers
        contributions, dead, writes = [], [], []
        selected: list[list] = []  # [region, bytes not yet taken from earlier writes] of later index writes
        for event in reversed(self.events(sid)):
            if event.op >= until:
                continue
            if isinstance(event, ReadEvent):
                covered_unread = covered_unread.difference(event.region)
                continue
            writes.append(event)
            if event.selected:
                taken = self._selected_count(event) * self.graph.tensors[event.tensor].dtype.itemsize
                determined = event.region.difference(later)
                taken = min(taken, determined.nbytes)
                contributions.append((event, determined, 0, taken))
                selected.append([determined, taken])
                continue
            determined = event.region.difference(later)
            if not determined.is_empty():
                removed = 0
                for pending in selected:
                    take = min(pending[1], pending[0].intersection(determined).nbytes)
                    pending[1] -= take
                    removed += take
                contributions.append((event, determined, removed, determined.nbytes - removed))
            if covered_unread.covers(event.region):
                dead.append(event)
            later = later.union(event.region)
            if event.reads_target:
                covered_unread = covered_unread.difference(event.region)
            else:
                covered_unread = covered_unread.union(event.region)
        unwritten = Region.span(0, self.graph.storages[sid].nbytes).difference(later)
        outcome = StorageOutcome(
            tuple(reversed(contributions)), tuple(reversed(dead)), tuple(reversed(writes)), unwritten
        )
        self._outcomes[key] = outcome
        return outcome

    # -- descriptions ------------------------------------------------------------------------

    def tensor_init(self, tid: TensorId) -> TensorInit:
        """What recorded tensor `tid`'s value (at the end of the audited ops) comes from."""
        info = self.graph.tensors[tid]
        region = self.region(tid)
        outcome = self.outcome(info.storage)
        itemsize = info.dtype.itemsize
        distribution, main = self._region_value(info.storage, region, itemsize, self.end, info.shape)
        touching = [w for w in outcome.writes if w.region.overlaps(region)]
        dead = [w for w in outcome.dead if w.region.overlaps(region)]
        unwritten = outcome.unwritten.intersection(region).nbytes // itemsize
        numel = math.prod(info.shape)
        last = main.op if main is not None else None
        return TensorInit(
            distribution,
            len(touching),
            len(dead),
            sum(w.region.nbytes for w in dead),
            unwritten,
            numel,
            self.graph.ops[last].source if last is not None else None,
            last,
        )

    def _region_value(
        self, sid: StorageId, region: Region, itemsize: int, until: OpIndex, shape: tuple[int, ...]
    ) -> tuple[Distribution, WriteEvent | None]:
        """The distribution of `region`'s bytes of storage `sid` just before op `until`, and the write
        determining most of them."""
        outcome = self.outcome(sid, until)
        parts: list[tuple[int, Distribution]] = []
        main: WriteEvent | None = None
        largest = 0
        for event, determined, _, kept in outcome.contributions:
            share = determined.intersection(region)
            if share.is_empty():
                continue
            # the bytes this write still determines, in proportion where `region` is part of them
            count = round(kept * share.nbytes / determined.nbytes) // itemsize
            if count <= 0:
                continue
            parts.append((count, self._write_value(event, share, itemsize, shape)))
            if count > largest:
                largest, main = count, event
        unwritten = outcome.unwritten.intersection(region).nbytes // itemsize
        if unwritten:
            parts.append((unwritten, dists.UNINITIALIZED))
        return dists.mixture(parts), main

    def _selected_count(self, event: WriteEvent) -> int:
        """How many elements an index/mask write writes: its values' (or indices') element count."""
        op = self.graph.ops[event.op]
        counts = [math.prod(self.graph.tensors[tid].shape) for tid in op.inputs if tid != event.tensor]
        return max(counts) if counts else event.region.nbytes

    def _write_value(self, event: WriteEvent, share: Region, itemsize: int, shape: tuple[int, ...]) -> Distribution:
        op = self.graph.ops[event.op]
        name = short_name(op)
        arguments = bound_arguments(op)
        if event.creates:
            return self.created_value(op, event.tensor)
        if name == "uniform_":
            return dists.uniform(float(arguments.get("from", 0.0)), float(arguments.get("to", 1.0)))
        if name == "normal_":
            return dists.normal(float(arguments.get("mean", 0.0)), float(arguments.get("std", 1.0)))
        if name == "trunc_normal_":
            return dists.trunc_normal(*(float(arguments[key]) for key in ("mean", "std", "a", "b")))
        if name == "zero_":
            return dists.constant(0.0)
        if name == "fill_":
            return self._scalar_value(arguments.get("value"), op)
        if name in ("copy_", "index_put_", "masked_fill_", "index_fill_"):
            source = arguments.get("src", arguments.get("values", arguments.get("value")))
            return self._scalar_value(source, op)
        if name == "eye":
            columns = arguments.get("m", arguments["n"])
            return dists.eye(int(arguments["n"]), int(columns))
        if name in ("mul_", "div_", "add_", "sub_"):
            return self._transformed(event, share, itemsize, shape, name, arguments)
        if name in ("bernoulli_", "exponential_", "random_", "geometric_", "cauchy_", "log_normal_"):
            return self._other_random(name, arguments)
        return dists.computed([name])

    def _scalar_value(self, value: Any, op: OpNode) -> Distribution:
        """The values a number, a recorded tensor or an outside tensor gives (a fill or copy source)."""
        if isinstance(value, (int, float, bool)):
            return dists.constant(float(value))
        if isinstance(value, TensorRef):
            info = self.graph.tensors[value.id]
            return self._region_value(info.storage, self.region(value.id), info.dtype.itemsize, op.index, info.shape)[0]
        if isinstance(value, ExternalRef):
            return external_value(self.graph.externals[value.index].value())
        return dists.computed([short_name(op)])

    def _transformed(
        self,
        event: WriteEvent,
        share: Region,
        itemsize: int,
        shape: tuple[int, ...],
        name: str,
        arguments: dict[str, Any],
    ) -> Distribution:
        """`mul_`/`div_`/`add_`/`sub_` by a number: the previous values of these bytes, transformed."""
        op = self.graph.ops[event.op]
        previous, _ = self._region_value(self.graph.tensors[event.tensor].storage, share, itemsize, op.index, shape)
        other = arguments.get("other")
        if (
            isinstance(other, TensorRef)
            and name == "mul_"
            and self._is_sign(other.id)
            and previous.family in ("orthogonal", "normal", "uniform", "trunc_normal")
            and previous.mean == 0
        ):
            return previous  # random signs keep a zero-mean symmetric distribution (orthogonal_'s QR fix-up)
        if not isinstance(other, (int, float)) or isinstance(other, bool) or previous.family == "uninitialized":
            return dists.computed([*_computed_names(previous), name])
        other = float(other)
        if name == "mul_":
            return previous.scaled(other, "*")
        if name == "div_":
            return previous.scaled(1 / other, "*") if other else dists.computed([name])
        alpha = float(arguments.get("alpha", 1) or 1)
        return previous.shifted(other * alpha if name == "add_" else -other * alpha, "+" if name == "add_" else "-")

    def _is_sign(self, tid: TensorId) -> bool:
        producer = self.graph.ops[self.graph.tensors[tid].producer]
        return short_name(producer) == "sign"

    @staticmethod
    def _other_random(name: str, arguments: dict[str, Any]) -> Distribution:
        if name == "bernoulli_" and isinstance(arguments.get("p"), float):
            p = arguments["p"]
            return dists.random_draws(f"bernoulli(p={dists.number(p)})", p, math.sqrt(p * (1 - p)))
        if name == "exponential_":
            rate = float(arguments.get("lambd", 1.0))
            return dists.random_draws(f"exponential(rate={dists.number(rate)})", 1 / rate, 1 / rate)
        return dists.random_draws(name.rstrip("_"))

    def created_value(self, op: OpNode, tid: TensorId) -> Distribution:
        """The values op `op` gave the tensor `tid` it created."""
        name = short_name(op)
        arguments = bound_arguments(op)
        if is_checkpoint_read(op):
            return dists.copied(f"checkpoint {os.path.basename(str(op.args[0]))}:{op.args[1]}")
        if name in _CONSTANT_CREATORS:
            return dists.constant(_CONSTANT_CREATORS[name])
        if name in _FULL_CREATORS:
            return dists.constant(float(arguments.get("fill_value", math.nan)))
        if name in ("randn", "randn_like"):
            return dists.normal(0.0, 1.0)
        if name in ("rand", "rand_like"):
            return dists.uniform(0.0, 1.0)
        if name == "normal" and isinstance(arguments.get("mean"), float) and isinstance(arguments.get("std"), float):
            return dists.normal(arguments["mean"], arguments["std"])
        if name == "eye":
            return dists.eye(int(arguments["n"]), int(arguments.get("m", arguments["n"])))
        if name == "linalg_qr" and tid == op.output_ids[0]:
            return dists.orthogonal(self.graph.tensors[tid].shape)
        if name in ("lift_fresh", "lift_fresh_copy") and op.args and isinstance(op.args[0], ExternalRef):
            return external_value(self.graph.externals[op.args[0].index].value())
        source = op.args[0] if op.args else None
        if name in _VALUE_COPIES and isinstance(source, TensorRef):
            return self._scalar_value(source, op)
        if name in ("mul", "div", "add", "sub") and isinstance(source, TensorRef):
            other = arguments.get("other")
            if isinstance(other, (int, float)) and not isinstance(other, bool):
                previous = self._scalar_value(source, op)
                if previous.family not in ("computed", "uninitialized"):
                    if name == "mul":
                        return previous.scaled(float(other), "*")
                    if name == "div" and other:
                        return previous.scaled(1 / float(other), "*")
                    if name in ("add", "sub"):
                        shift = float(other) * float(arguments.get("alpha", 1) or 1)
                        return previous.shifted(shift if name == "add" else -shift, "+" if name == "add" else "-")
        return dists.computed(self._producers(op))

    def _producers(self, op: OpNode) -> list[str]:
        """The names of `op` and the ops producing its inputs, breadth first, a few levels back."""
        names, frontier, seen = [], [op.index], set()
        for _ in range(_COMPUTED_DEPTH):
            following: list[int] = []
            for index in frontier:
                if index in seen:
                    continue
                seen.add(index)
                node = self.graph.ops[index]
                if not node.aliases_only:
                    names.append(short_name(node))
                following.extend(self.graph.tensors[tid].producer for tid in node.inputs)
            frontier = following
        return list(reversed(list(dict.fromkeys(reversed(names)))))


def _computed_names(previous: Distribution) -> list[str]:
    return (
        [previous.family] if previous.family != "computed" else [previous.text.removeprefix("computed (").rstrip(")")]
    )


def external_value(tensor: torch.Tensor) -> Distribution:
    """A tensor from outside the recording (a constant, an argument): its exact moments, or a
    constant when every element is the same number."""
    if is_fake(tensor):  # a tensor of another recording (record/foreign.py): no values to read
        return dists.copied("a tensor of another deferred recording")
    with torch.no_grad():
        values = (
            tensor.detach().to("cpu", torch.float64)
            if tensor.is_floating_point() or tensor.dtype == torch.bool or not tensor.is_complex()
            else None
        )
        if values is None or values.numel() == 0:
            return dists.copied("a tensor from outside the recording")
        low, high = float(values.min()), float(values.max())
        if low == high:
            return dists.constant(low)
        return dists.copied(
            f"a tensor from outside the recording {tuple(tensor.shape)}",
            float(values.mean()),
            float(values.std(unbiased=False)),
        )
