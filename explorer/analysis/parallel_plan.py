"""`plan_parallel`: which layout fits? Every FSDP × TP × PP × checkpointing layout of a step, on fakes.

A `ParallelPlan` holds one `LayoutResult` per layout asked about: the peak of each kind of rank (a
pipeline stage is a kind; without pipelining every rank is alike), by category, the communication
per step by collective, and a throughput proxy; or, for a layout the model does not allow, why.
`table()` lists them, the layouts that fit first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from .parallel_layout import Layout
from .train_budget import parse_budget

__all__ = ["LayoutResult", "ParallelPlan", "RankPeak", "TABLE_COLUMNS"]

TABLE_COLUMNS = (
    "layout",
    "fits",
    "peak_bytes",
    "headroom_bytes",
    "slowest_rank",
    "communication_bytes",
    "exposed_communication_s",
    "recompute_flops",
    "step_proxy_s",
    "global_batch",
    "problems",
)


@dataclass(frozen=True)
class RankPeak:
    """One kind of rank's step: `rank` names it ("every rank", "stage 0"...), `peak_bytes` the
    most bytes alive at once, `peak` those bytes by category (train_step's categories), `phase`
    the phase of the peak, `modules` the bytes by module (path → peak bytes) where measured."""

    rank: str
    peak_bytes: int
    peak: dict[str, int]
    phase: str = "forward"
    modules: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LayoutResult:
    """A layout and what one step needs under it.

    `problems`: why the layout cannot run on this model (empty when it can; then `ranks` is empty
    and the numbers are 0). `ranks`: one `RankPeak` per kind of rank. `communication`: bytes per
    step each rank moves, by collective ("all_gather", "reduce_scatter", "all_reduce", "send_recv"...).
    `recompute_flops`: floating-point operations activation checkpointing repeats per step;
    `exposed_communication_s`, `step_proxy_s`: the throughput proxy (see `plan_parallel`).
    """

    layout: Layout
    problems: tuple[str, ...] = ()
    ranks: tuple[RankPeak, ...] = ()
    communication: dict[str, int] = field(default_factory=dict)
    compute_flops: int = 0
    recompute_flops: int = 0
    exposed_communication_s: float = 0.0
    step_proxy_s: float = 0.0

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def peak_bytes(self) -> int:
        """The most any rank needs (the slowest rank's, with uneven stages)."""
        return max((rank.peak_bytes for rank in self.ranks), default=0)

    @property
    def slowest_rank(self) -> RankPeak | None:
        return max(self.ranks, key=lambda rank: rank.peak_bytes, default=None)


@dataclass(frozen=True)
class ParallelPlan:
    """The layouts of one model's training step over `gpus` GPUs of `gpu_memory` bytes each."""

    root_class: str
    gpus: int
    gpu_memory: int
    results: tuple[LayoutResult, ...]
    proxy_note: str = ""

    def fits(self, result: LayoutResult) -> bool:
        return result.valid and result.peak_bytes <= self.gpu_memory

    def ordered(self) -> list[LayoutResult]:
        """Layouts that fit first (fastest proxy first), then those that do not (smallest peak
        first), then the invalid ones."""
        return sorted(
            self.results,
            key=lambda r: (not r.valid, not self.fits(r), r.step_proxy_s if self.fits(r) else r.peak_bytes),
        )

    def best(self) -> LayoutResult | None:
        """The fitting layout with the smallest step proxy; None when nothing fits."""
        fitting = [r for r in self.ordered() if self.fits(r)]
        return fitting[0] if fitting else None

    def table(self) -> pd.DataFrame:
        """One row per layout (`TABLE_COLUMNS`), ordered as `ordered()`."""
        rows = []
        for result in self.ordered():
            slowest = result.slowest_rank
            rows.append(
                {
                    "layout": result.layout.label(),
                    "fits": self.fits(result),
                    "peak_bytes": result.peak_bytes,
                    "headroom_bytes": self.gpu_memory - result.peak_bytes if result.valid else 0,
                    "slowest_rank": slowest.rank if slowest else "",
                    "communication_bytes": sum(result.communication.values()),
                    "exposed_communication_s": result.exposed_communication_s,
                    "recompute_flops": result.recompute_flops,
                    "step_proxy_s": result.step_proxy_s,
                    "global_batch": result.layout.global_batch,
                    "problems": "; ".join(result.problems),
                }
            )
        return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))

    @staticmethod
    def budget(gpu_memory: float | str) -> int:
        return parse_budget(gpu_memory)
