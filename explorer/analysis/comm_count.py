"""Collectives one rank issues during a step, counted by kind with their bytes.

`CollectiveCounter` is a dispatch mode that sees every c10d collective (`dist.all_gather_into_tensor`,
`dist.reduce_scatter_tensor`, `dist.all_reduce`...: what FSDP2 issues) and every functional
collective (`_c10d_functional.all_reduce`...: what DTensor's redistributions issue), on real or fake
tensors, and adds them up by kind.

Note: [Collective bytes]
The bytes of one call are the size of the collective's *full* buffer on this rank, the `size` column
of nccl-tests: an all-gather's output (every rank's shard), a reduce-scatter's input (the unsharded
tensor), an all-reduce's or broadcast's tensor, an all-to-all's input. Wire traffic follows from it by
the algorithm's factor (a ring all-gather or reduce-scatter of N ranks sends (N-1)/N of it, a ring
all-reduce 2(N-1)/N); the factor is not applied here. A coalesced call counts once with the sum of
its tensors. FSDP2's all-gather of a module's parameters is one call whose bytes are those
parameters padded to a multiple of the shard degree, unsharded.

DTensor ops reach a dispatch mode before DTensor desugars them; the counter declines them
(`NotImplemented`, as PyTorch's `CommDebugMode` does) so that the collectives DTensor issues inside
its own dispatch are seen too. Entered inside a memory tracker, it changes none of its numbers
(`tests/explorer/analysis/test_layout_step.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.distributed.tensor import DTensor

from .._torch_compat.dispatch import TorchDispatchMode, pytree

__all__ = ["COLLECTIVES", "Collective", "CollectiveCounter", "Communication"]

Collective = Literal["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast"]
COLLECTIVES: tuple[Collective, ...] = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")

# Which of a call's tensors make its full buffer (note [Collective bytes]): an argument's index, or
# "result". Keyed by (namespace, op name): c10d's in-place ops and the functional collectives.
_FULL_BUFFER: dict[tuple[str, str], tuple[Collective, int | Literal["result"]]] = {
    ("c10d", "_allgather_base_"): ("all_gather", 0),
    ("c10d", "allgather_"): ("all_gather", 0),
    ("c10d", "allgather_coalesced_"): ("all_gather", 0),
    ("c10d", "allgather_into_tensor_coalesced_"): ("all_gather", 0),
    ("c10d", "_reduce_scatter_base_"): ("reduce_scatter", 1),
    ("c10d", "reduce_scatter_"): ("reduce_scatter", 1),
    ("c10d", "reduce_scatter_tensor_coalesced_"): ("reduce_scatter", 1),
    ("c10d", "allreduce_"): ("all_reduce", 0),
    ("c10d", "allreduce_coalesced_"): ("all_reduce", 0),
    ("c10d", "alltoall_base_"): ("all_to_all", 1),
    ("c10d", "alltoall_"): ("all_to_all", 1),
    ("c10d", "broadcast_"): ("broadcast", 0),
    ("_c10d_functional", "all_gather_into_tensor"): ("all_gather", "result"),
    ("_c10d_functional", "all_gather_into_tensor_coalesced"): ("all_gather", "result"),
    ("_c10d_functional", "reduce_scatter_tensor"): ("reduce_scatter", 0),
    ("_c10d_functional", "reduce_scatter_tensor_coalesced"): ("reduce_scatter", 0),
    ("_c10d_functional", "all_reduce"): ("all_reduce", 0),
    ("_c10d_functional", "all_reduce_"): ("all_reduce", 0),
    ("_c10d_functional", "all_reduce_coalesced"): ("all_reduce", 0),
    ("_c10d_functional", "all_reduce_coalesced_"): ("all_reduce", 0),
    ("_c10d_functional", "all_to_all_single"): ("all_to_all", 0),
    ("_c10d_functional", "broadcast"): ("broadcast", 0),
    ("_c10d_functional", "broadcast_"): ("broadcast", 0),
}


@dataclass
class Communication:
    """Collectives of one rank: `bytes` and `calls` by kind (every kind of `COLLECTIVES` present),
    bytes as note [Collective bytes] defines them."""

    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COLLECTIVES, 0))
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COLLECTIVES, 0))

    @property
    def total_bytes(self) -> int:
        """The bytes of every collective together."""
        return sum(self.bytes.values())


def _tensor_bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))


class CollectiveCounter(TorchDispatchMode):
    """Counts the collectives run while active into `communication` (note [Collective bytes]).

    Use it where a step's traffic is wanted alongside its memory: it runs each op unchanged. Under
    one of our memory trackers, pass `observe` as the tracker's `op_observer` instead of entering
    the counter: the same ops, one dispatch mode fewer per op."""

    def __init__(self) -> None:
        super().__init__()
        self.communication = Communication()

    def __torch_dispatch__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if any(issubclass(kind, DTensor) for kind in types):
            return NotImplemented  # let DTensor desugar first: its collectives come back here
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        self.observe(func, args, kwargs, result)
        return result

    def observe(self, func: Any, args: tuple, kwargs: dict, result: Any) -> None:
        """Count `func` if it is a collective (called after it ran, with its arguments and result)."""
        packet = getattr(func, "overloadpacket", None)
        entry = _FULL_BUFFER.get((getattr(func, "namespace", ""), getattr(packet, "__name__", "")))
        if entry is not None:
            kind, buffer = entry
            self.communication.calls[kind] += 1
            self.communication.bytes[kind] += _tensor_bytes(result if buffer == "result" else args[buffer])
