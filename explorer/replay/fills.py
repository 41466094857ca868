"""Random fills run side by side.

When each in-place fill (`uniform_`, `normal_`...) can be given a generator of its own — with
rng="fast" a seed from its position, with rng="eager" eager's state before it, reached by a jump —
fills do not depend on each other's order and can run on a thread pool while replay goes on (CPU
random kernels are single-threaded). Replay waits for a storage's fill before the next op that
touches it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

from ..graph import InitGraph, OpIndex, OpNode, StorageId, accepts_generator, is_inplace_random


class ParallelFills:
    """A pool of fill threads for one replay; use as a context manager (joined on exit)."""

    def __init__(self, graph: InitGraph, generator_for: Callable[[str, int], torch.Generator | None]) -> None:
        self.graph = graph
        self.generator_for = generator_for  # (stream key, position) → its own generator, or None
        self.workers = torch.get_num_threads()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[StorageId, Future] = {}

    def __enter__(self) -> "ParallelFills":
        if self.workers >= 2:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="explorer-fill")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending.clear()

    def wait_for(self, index: OpIndex | None) -> None:
        """Wait for the fills of the storages op `index` touches (all of them for None); a fill's
        exception is raised here."""
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

    def submit(self, op: OpNode, args: tuple, kwargs: dict) -> bool:
        """Run a seeded in-place random op on the pool; False when it must run here instead."""
        if self._pool is None or not (is_inplace_random(op.func) and accepts_generator(op.func)):
            return False
        target = args[0]
        if target.device.type != "cpu":
            return False
        generator = self.generator_for(*op.stream)
        if generator is None:
            return False
        sid = self.graph.tensors[op.inputs[0]].storage
        self._pending[sid] = self._pool.submit(
            _fill_in_mode, op.inference, op.func, args, {**kwargs, "generator": generator}
        )
        return True


def _fill_in_mode(inference: bool, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run a fill on a pool thread under the op's recorded inference mode (that mode is per thread)."""
    with torch.inference_mode(inference):
        return func(*args, **kwargs)
