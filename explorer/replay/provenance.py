"""Where a tensor came from: the recorded facts `inspect` shows, kept apart from the graph.

A fully materialized module no longer reaches its graph through its fakes (its tensors keep the
graph alive only as the recipe for release_module, see deferred_forms.py, and the tables must not
depend on that). `materialize_*` therefore leave an `Origin` for every tensor they hand out, in a weak
table keyed by tensor identity: nothing is attached to the tensor itself (pickling, `deepcopy` and
`torch.save` see an ordinary tensor), and the entry goes when the tensor does. An eager tensor has
no origin; that is how `explorer.inspect` tells "materialized" from "real".
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..graph import InitGraph, SourceLocation, TensorId, TensorInfo
from ..record.weak_holders import register_weak_holder

_SET_DATA = "set_data"  # the synthetic alias record.py notes for `.data = x`


@dataclass(frozen=True, slots=True)
class Origin:
    """The recorded tensor a real or fake tensor stands for, and how construction made it."""

    graph: weakref.ref  # the InitGraph; dead once nothing but materialized tensors remain
    tensor_id: TensorId
    closure_ops: int  # ops replaying it takes (the recorded closure)
    producer: str  # the op that made this tensor object
    last_write: str  # the last op that wrote its storage (its initializer, usually)
    source: SourceLocation | None  # the user's line that made it (see `creation_sources`)

    @staticmethod
    def of(graph: InitGraph, tensor_id: TensorId, closure_ops: int, source: SourceLocation | None) -> Origin:
        """The origin of recorded tensor `tensor_id`; `source` as `creation_sources` finds it."""
        info = graph.tensors[tensor_id]
        return Origin(
            weakref.ref(graph),
            tensor_id,
            closure_ops,
            graph.ops[info.producer].label,
            graph.ops[graph.last_write(info.storage)].label,
            source,
        )


def _layout(info: TensorInfo) -> tuple:
    return (info.storage, info.shape, info.stride, info.storage_offset, info.dtype)


def creation_sources(graph: InitGraph, tensor_ids: Iterable[TensorId]) -> dict[TensorId, SourceLocation | None]:
    """The user's line that made each recorded tensor: its producer's line.

    `.data = x` never reaches the dispatcher; the recorder notices it later (on the tensor's next
    use, or when recording ends) and notes a `set_data` alias with that later line or none. The
    line that made the data is the one that made `x`: the latest earlier tensor with the same
    storage and layout.
    """
    tensors, ops = graph.tensors, graph.ops
    layouts: dict[tuple, list[TensorId]] | None = None  # built only when some `.data = x` needs it
    sources: dict[TensorId, SourceLocation | None] = {}
    for wanted in tensor_ids:
        tid = wanted
        while ops[tensors[tid].producer].name == _SET_DATA:
            if layouts is None:
                layouts = {}
                for candidate, info in tensors.items():  # ids ascend: each list stays sorted
                    layouts.setdefault(_layout(info), []).append(candidate)
            same = layouts[_layout(tensors[tid])]
            position = bisect.bisect_left(same, tid)
            if position == 0:
                break
            tid = same[position - 1]
        sources[wanted] = ops[tensors[tid].producer].source
    return sources


_origins: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _let_go(real: torch.Tensor) -> Callable[[], None] | None:
    """Note [Materialized tensors swap too] in record/weak_holders.py."""
    origin = _origins.pop(real, None)
    return None if origin is None else lambda: _origins.__setitem__(real, origin)


register_weak_holder(_let_go)


def remember_origins(graph: InitGraph, tensor_ids: Sequence[TensorId], reals: Sequence[torch.Tensor]) -> None:
    """Note that each of `reals` is the materialization of the recorded tensor at the same position."""
    new = [(tid, real) for tid, real in zip(tensor_ids, reals) if real not in _origins]
    sources = creation_sources(graph, dict.fromkeys(tid for tid, _ in new))
    closures: dict[TensorId, int] = {}
    for tid, real in new:
        if tid not in closures:
            closures[tid] = len(graph.closure_of([tid]))
        _origins[real] = Origin.of(graph, tid, closures[tid], sources[tid])


def origin_of(tensor: torch.Tensor) -> Origin | None:
    """The origin `materialize_*` noted for `tensor`, or None (an eager tensor, or a fake)."""
    return _origins.get(tensor)
