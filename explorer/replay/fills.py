"""Random fills run side by side.

When each in-place fill (`uniform_`, `normal_`...) can be given a generator of its own — with
rng="fast" a seed from its position, with rng="eager" eager's state before it, reached by a jump —
fills do not depend on each other's order and can run on a thread pool while replay goes on (CPU
random kernels are single-threaded). Replay waits for a storage's fill before the next op that
touches it. Fills of fewer than `MIN_POOLED_ELEMENTS` run in line on the default generator instead:
for them the jump to their own state, the future and the wait cost more than the fill (a
28-layer Llama of width 64 materialized in 68 ms with every fill pooled, 22 ms with small ones in
line, against 24 ms for eager construction).

One large fill is split over the threads too: a contiguous fill whose draws are positional
(`fill_layout.py`) runs as block-aligned pieces, each from the generator jumped to its first draw,
bit for bit the whole fill (note [normal_fill block layout]). A piece costs a jump (tens of ms for
a new distance), so only fills that would otherwise leave threads idle are split: those the fills
still to come cannot balance (the last large fills of a layer, a lone embedding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import torch

from ..graph import InitGraph, OpIndex, OpNode, StorageId, accepts_generator, is_inplace_random
from .draws import family_of
from .fill_layout import Piece, RecordedFill, fill_layout, fill_pieces

# A fill is split only into pieces of at least this many elements: a piece costs a generator jump
# (a few ms; the same distances recur across same-shaped tensors and are cached).
MIN_PIECE_ELEMENTS = 1 << 22
# Smaller fills run in line, on the default generator, which is then already where the next op of
# the stream starts: a pool thread would cost more (a jump to the fill's own state, a future and a
# wait) than the fill itself.
MIN_POOLED_ELEMENTS = 1 << 14


class ParallelFills:
    """A pool of fill threads for one replay; use as a context manager (joined on exit)."""

    def __init__(
        self, graph: InitGraph, generator_for: Callable[[str, int], torch.Generator | None], ops: Sequence[OpIndex] = ()
    ) -> None:
        self.graph = graph
        self.generator_for = generator_for  # (stream key, position) → its own generator, or None
        self.workers = torch.get_num_threads()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[StorageId, list[Future]] = {}
        self._later = elements_filled_after(graph, ops)  # op → elements of the fills after it

    def __enter__(self) -> ParallelFills:
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
            for future in self._pending.pop(sid, ()):
                future.result()

    def submit(self, op: OpNode, args: tuple, kwargs: dict) -> bool:
        """Run a seeded in-place random op on the pool; False when it must run here instead."""
        if self._pool is None or not (is_inplace_random(op.func) and accepts_generator(op.func)):
            return False
        target = args[0]
        if target.device.type != "cpu" or target.numel() < MIN_POOLED_ELEMENTS:
            return False
        generator = self.generator_for(*cast(tuple[str, int], op.stream))  # random ops have a stream
        if generator is None:
            return False
        sid = self.graph.tensors[op.inputs[0]].storage
        groups = None
        if worth_splitting(target.numel(), self._later.get(op.index, 0), self.workers):
            groups = split_fill(self.graph, op, args, self.workers)
        if groups is None:
            futures = [
                self._pool.submit(_fill_in_mode, op.inference, op.func, args, {**kwargs, "generator": generator})
            ]
        else:
            state, fill = generator.get_state(), RecordedFill(op.func, args[1:], kwargs)
            futures = [self._pool.submit(_pieces_in_mode, op.inference, fill, target, state, group) for group in groups]
        self._pending.setdefault(sid, []).extend(futures)
        return True


def elements_filled_after(graph: InitGraph, ops: Sequence[OpIndex]) -> dict[OpIndex, int]:
    """For each in-place random fill among `ops` (in order), the elements the fills after it write."""
    later, total = {}, 0
    for index in reversed(ops):
        op = graph.ops[index]
        if op.stream is not None and op.inputs and is_inplace_random(op.func):
            later[index] = total
            numel = 1
            for size in graph.tensors[op.inputs[0]].shape:
                numel *= size
            total += numel
    return later


def worth_splitting(numel: int, later: int, workers: int) -> bool:
    """Whether a fill of `numel` elements, with `later` elements of fills still to come, should be
    split: when the later fills cannot keep the other threads busy while it runs whole."""
    return workers >= 2 and later < numel * (workers - 1)


def split_fill(
    graph: InitGraph, op: OpNode, args: tuple, parts: int, min_elements: int | None = None
) -> list[list[Piece]] | None:
    """Pieces to run in-place random fill `op` (resolved `args`) as `parts` side by side, or None
    when it runs whole: too small, not contiguous, reading other tensors, or draws not positional."""
    target = args[0]
    min_elements = MIN_PIECE_ELEMENTS if min_elements is None else min_elements
    if parts < 2 or target.numel() < 2 * min_elements or not target.is_contiguous():
        return None
    if any(isinstance(value, torch.Tensor) for value in args[1:]):
        return None  # bernoulli_(p tensor): p would need the same pieces
    family = family_of(graph, op)
    layout = None if family is None else fill_layout(family, target.dtype, target.numel())
    if layout is None:
        return None
    groups = layout.split(parts, min_elements)
    return groups if len(groups) > 1 else None


def _pieces_in_mode(
    inference: bool, fill: RecordedFill, target: torch.Tensor, state: torch.Tensor, pieces: list[Piece]
) -> None:
    """Some pieces of a split fill, on a pool thread under the op's recorded inference mode."""
    with torch.inference_mode(inference):
        fill_pieces(fill, target.view(-1), state, pieces)


def _fill_in_mode(inference: bool, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run a fill on a pool thread under the op's recorded inference mode (that mode is per thread)."""
    with torch.inference_mode(inference):
        return func(*args, **kwargs)
