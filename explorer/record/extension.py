"""Recording what users do to a deferred module after `deferred_init` returned.

Between construction and materialization people cast (`.half()`, `.to(torch.bfloat16)`), move
(`.to("meta")`), load checkpoints (`load_state_dict`), re-initialize (`nn.init.normal_(m.weight)`).
Each of those is aten ops on the module's fake tensors. A `DeferredTensor` that receives an op while
no recording runs on this thread hands it to its graph's `Recorder`, which re-opens the recording
(scope, fake mode, recording mode) for that one op: the op lands in the same graph, after the
constructor's ops, and replays like any other. So materializing gives what eager construction
followed by the same calls gives, and a checkpoint's `copy_` makes the init ops it overwrites dead
(skipped, their random numbers jumped over).

Note: [Recording after deferred_init] only ops that reach the dispatcher are seen. Metadata-only
changes need no op (`requires_grad_` is read from the fake when it materializes); `.data = x` swaps
are detected on next use, as during construction, and at the latest when the tensor is materialized
(`catch_up`): a swap nothing used since would otherwise replay the value the tensor had before it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._torch_compat.dispatch import tree_flatten
from .._torch_compat.fake import FakeTensorMode, meta_failures_unlogged
from .lean_fake import FakeFactory
from .modes import RecordingDispatchMode
from .redeferred import redefer_swapped_tensors
from .scope import RecordingScope, ValueReader, recording

if TYPE_CHECKING:
    from ..graph import InitGraph
    from .builder import GraphBuilder


def refresh_written(graph: InitGraph, first: int) -> None:
    """Real tensors already made on memory that ops `first..` of `graph` wrote take the new values
    (note [Writes after a tensor was made] in replay/replay.py)."""
    live = graph.replay_state
    if live is not None and len(graph.ops) > first:
        written = graph.written_since(first)
        if written:
            live.after_recorded_writes(written)


@dataclass
class Recorder:
    """What it takes to record more ops into a graph whose constructor has returned."""

    builder: GraphBuilder
    read_value: ValueReader
    fake_mode: FakeTensorMode
    lock: threading.RLock

    def run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run aten `func` recorded into this graph; the fakes it touched are stamped afresh, and
        real tensors already made on memory it wrote take the new values (note [Writes after a
        tensor was made] in replay/replay.py)."""
        graph = self.builder.graph
        with self.lock:
            if func.namespace == "prim":
                # a metadata query (`prim.device`), asked from C++ that cannot pass an exception on
                # (the process aborts): no data flows, so nothing to settle; the op that follows does
                with self._reopened():
                    return func(*args, **kwargs)
            first = len(graph.ops)
            with self._reopened():
                out = func(*args, **kwargs)
            self.builder.settle([*tree_flatten((args, kwargs))[0], *tree_flatten(out)[0]])
            refresh_written(graph, first)
        return out

    @contextlib.contextmanager
    def _reopened(self) -> Iterator[None]:
        """The recording of this graph, open again for the ops of the block."""
        with (
            recording(RecordingScope(self.builder.graph, self.read_value)),
            meta_failures_unlogged(),  # note [Meta failures, unlogged]
            self.fake_mode,
            RecordingDispatchMode(self.builder, self.read_value, self.fake_mode),
        ):
            yield

    @contextlib.contextmanager
    def reopened(self, touched: Callable[[], list[torch.Tensor]]) -> Iterator[None]:
        """The block's ops recorded into this graph, as `run` records one, then the tensors
        `touched()` names stamped afresh (their `.data = x` swaps recorded): a lazy parameter shaped
        by a forward run outside any deferred scope (record/lazy.py)."""
        with self.lock:
            first = len(self.builder.graph.ops)
            with self._reopened():
                yield
            self.builder.settle(touched())
            refresh_written(self.builder.graph, first)

    def redefer_given_data(self, roots: list[nn.Module]) -> int:
        """Note [A materialized tensor given deferred data] (record/redeferred.py) for real tensors of
        `roots` given this graph's data outside a `deferred(model)` block (`real.data = fake`,
        `vector_to_parameters` after a partial materialization): each is deferred again, so
        materializing gives eager's values. Returns how many."""
        with self.lock:
            with self._reopened():
                count = redefer_swapped_tensors(self.builder, FakeFactory(self.fake_mode), roots)
            if count:
                self.builder.settle([t for root in roots for t in (*root.parameters(), *root.buffers())])
        return count

    def catch_up(self, tensor: torch.Tensor) -> None:
        """Record a `.data = x` made on fake `tensor` since its last op (see the note above), so its
        handle names what it holds now. Raises DeferredInitError when x is not a fake of this graph."""
        with self.lock:
            self.builder.settle([tensor])
