"""Which bytes of a storage a tensor layout touches, as sorted disjoint byte intervals.

The init audit asks, per storage, which bytes each write covers, which bytes later writes cover
again, and which bytes nothing ever wrote. A layout (shape, stride, offset, element size) touches a
set of byte runs: the innermost dimensions that are contiguous make one run, the outer ones repeat
it. `Region` keeps those runs as two numpy arrays (starts, ends), merged and sorted, so union,
difference and intersection are a few vectorised numpy calls, whatever the tensor's size.

A layout covering its whole storage (the common case: a parameter and every initializer on it) is
one interval, so a 70B model costs nothing here. A layout of more than `MAX_RUNS` runs (a column
slice of a huge matrix) is approximated by its extent, the bytes from its first to its last
element; the audit then may miss unwritten bytes between its runs (never invents them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_RUNS = 1 << 22  # more runs than this: the layout is approximated by its extent


@dataclass(frozen=True)
class Region:
    """A set of bytes: sorted, disjoint, non-adjacent half-open intervals [starts[i], ends[i])."""

    starts: np.ndarray
    ends: np.ndarray

    @staticmethod
    def empty() -> Region:
        return Region(np.zeros(0, np.int64), np.zeros(0, np.int64))

    @staticmethod
    def span(start: int, end: int) -> Region:
        """The bytes [start, end): one interval (none when end <= start)."""
        if end <= start:
            return Region.empty()
        return Region(np.array([start], np.int64), np.array([end], np.int64))

    @staticmethod
    def of_layout(shape: Sequence[int], stride: Sequence[int], offset: int, itemsize: int) -> Region:
        """The bytes a strided layout's elements occupy (`offset` and `stride` in elements)."""
        dims = sorted(((size, step) for size, step in zip(shape, stride) if size != 1), key=lambda d: abs(d[1]))
        if any(size == 0 for size, _ in dims):
            return Region.empty()
        base = offset
        for size, step in dims:  # negative strides cannot occur in torch; kept general
            if step < 0:
                base += (size - 1) * step
        run = 1
        outer: list[tuple[int, int]] = []  # (size, step) of the dims beyond the contiguous run
        for size, step in dims:
            if not outer and abs(step) == run:
                run *= size
            elif not outer and step == 0:
                continue  # an expanded dim: the same bytes again
            else:
                outer.append((size, abs(step)))
        runs = math.prod(size for size, _ in outer)
        if runs > MAX_RUNS:
            extent = sum((size - 1) * step for size, step in outer) + run
            return Region.span(base * itemsize, (base + extent) * itemsize)
        starts = np.zeros(1, np.int64) + base
        for size, step in outer:
            starts = (starts[:, None] + np.arange(size, dtype=np.int64)[None, :] * step).ravel()
        return Region._merged(starts * itemsize, (starts + run) * itemsize)

    @staticmethod
    def _merged(starts: np.ndarray, ends: np.ndarray) -> Region:
        if starts.size <= 1:
            return Region(starts.astype(np.int64), ends.astype(np.int64))
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        reach = np.maximum.accumulate(ends)
        new = np.ones(starts.size, bool)
        new[1:] = starts[1:] > reach[:-1]
        group = np.cumsum(new) - 1
        merged_ends = np.zeros(int(group[-1]) + 1, np.int64)
        np.maximum.at(merged_ends, group, ends)
        return Region(starts[new], merged_ends)

    # Single intervals (a whole storage, a row) are the common case: plain integer arithmetic for
    # them, numpy sweeps only for many-interval regions.
    def _single(self) -> tuple[int, int] | None:
        return (int(self.starts[0]), int(self.ends[0])) if self.starts.size == 1 else None

    @property
    def nbytes(self) -> int:
        if self.starts.size == 1:
            return int(self.ends[0]) - int(self.starts[0])
        return int((self.ends - self.starts).sum())

    def is_empty(self) -> bool:
        return self.starts.size == 0

    def union(self, other: Region) -> Region:
        if other.is_empty():
            return self
        if self.is_empty():
            return other
        first, second = self._single(), other._single()
        if first is not None and second is not None and first[0] <= second[1] and second[0] <= first[1]:
            return Region.span(min(first[0], second[0]), max(first[1], second[1]))
        return Region._merged(np.concatenate([self.starts, other.starts]), np.concatenate([self.ends, other.ends]))

    def intersection(self, other: Region) -> Region:
        if self.is_empty() or other.is_empty():
            return Region.empty()
        first, second = self._single(), other._single()
        if first is not None and second is not None:
            return Region.span(max(first[0], second[0]), min(first[1], second[1]))
        # Boundaries of both sets, swept once: a byte is in the intersection where both counts are 1.
        points = np.concatenate([self.starts, self.ends, other.starts, other.ends])
        deltas = np.concatenate(
            [
                np.ones(self.starts.size, np.int64),
                -np.ones(self.ends.size, np.int64),
                np.ones(other.starts.size, np.int64),
                -np.ones(other.ends.size, np.int64),
            ]
        )
        order = np.lexsort((deltas, points))  # at equal points, ends (-1) before starts
        points, depth = points[order], np.cumsum(deltas[order])
        inside = depth == 2
        starts, ends = points[:-1][inside[:-1]], points[1:][inside[:-1]]
        keep = ends > starts
        return Region._merged(starts[keep], ends[keep])

    def difference(self, other: Region) -> Region:
        """The bytes of this region that `other` does not hold."""
        if self.is_empty() or other.is_empty():
            return self
        first, second = self._single(), other._single()
        if first is not None and second is not None:
            if second[1] <= first[0] or first[1] <= second[0]:
                return self
            pieces = [(first[0], second[0]), (second[1], first[1])]
            pieces = [piece for piece in pieces if piece[1] > piece[0]]
            return Region(np.array([p[0] for p in pieces], np.int64), np.array([p[1] for p in pieces], np.int64))
        low = min(int(self.starts[0]), int(other.starts[0]))
        high = max(int(self.ends[-1]), int(other.ends[-1]))
        return self.intersection(other.complement(low, high))

    def complement(self, low: int, high: int) -> Region:
        """The bytes of [low, high) outside this region."""
        starts = np.concatenate([[low], self.ends])
        ends = np.concatenate([self.starts, [high]])
        keep = ends > starts
        return Region(starts[keep].astype(np.int64), ends[keep].astype(np.int64))

    def covers(self, other: Region) -> bool:
        if other.is_empty():
            return True
        first, second = self._single(), other._single()
        if first is not None and second is not None:
            return first[0] <= second[0] and second[1] <= first[1]
        return other.difference(self).is_empty()

    def overlaps(self, other: Region) -> bool:
        return not self.intersection(other).is_empty()
