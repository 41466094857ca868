"""The init audit's flags, how bad each is (`SEVERITY`), and what a wasted write costs.

A flag is a *defect* when the values a training run starts from are not the ones intended: wrong,
random from run to run, or not what the code would give again. It is *waste* when the final values
are right and only the work spent reaching them is lost; its cost is the bytes the lost writes write
and an estimate of their time. A defect is worth a person's attention before any waste: on a
Hugging Face model every tensor carries the waste flag "overwritten", which must not hide the one
defect among them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import Literal, NamedTuple, get_args

import pandas as pd
import torch

Flag = Literal[
    "uninitialized",
    "overwritten",
    "outlier",
    "constant matrix",
    "nan/inf",
    "measured differs",
    "uninitialized after reinit",
    "reinit differs",
]
FLAGS: tuple[Flag, ...] = get_args(Flag)  # in report order
Severity = Literal["defect", "waste"]
SEVERITIES: tuple[Severity, ...] = ("defect", "waste")  # most severe first
SEVERITY: dict[Flag, Severity] = {
    # elements no write covers: whatever the allocator left there, different from run to run
    "uninitialized": "defect",
    # every byte of a write was written again before anything read it (the module's own
    # reset_parameters, then Hugging Face's `_init_weights`): the final value is the intended one,
    # the first write only costs time and bandwidth at materialization
    "overwritten": "waste",
    # one name of a repeated role initialized unlike its siblings: most often a missed init
    "outlier": "defect",
    # a matrix of one value: its rows get the same gradient and never become different
    "constant matrix": "defect",
    # values that make the first step's loss NaN
    "nan/inf": "defect",
    # the memory holds values the recorded initializer cannot have drawn
    "measured differs": "defect",
    # the meta-init path (`to_empty()` then `reinit`) does not reproduce the values: it leaves
    # memory unwritten, or writes another distribution
    "uninitialized after reinit": "defect",
    "reinit differs": "defect",
}
_TIMED_ELEMENTS = 1 << 22  # a 16 MiB float32 tensor: large enough to run at memory speed
_TIMED_REPEATS = 3


def severity_of(flags: Iterable[str]) -> Severity | None:
    """The severity of a tensor's flags: "defect" if any flag is one, else "waste", None for no flags."""
    found = {SEVERITY[flag] for flag in flags}  # type: ignore[index]  # flags are FLAGS words
    return next((severity for severity in SEVERITIES if severity in found), None)


class FlagTotal(NamedTuple):
    """How many names of an init report carry `flag`, and for waste what their wasted writes cost."""

    flag: Flag
    severity: Severity
    names: int
    wasted_bytes: int  # the report's `wasted_bytes` summed over those names (0 for a defect)
    wasted_s: float


def flag_totals(report: pd.DataFrame) -> list[FlagTotal]:
    """Each flag some name of `report` (an `init_report` table) carries: defects first, then
    waste, each in `FLAGS` order."""
    totals = []
    for severity in SEVERITIES:
        for flag in FLAGS:
            carriers = report["flags"].map(lambda flags, flag=flag: flag in flags)
            if SEVERITY[flag] != severity or not carriers.any():
                continue
            waste = severity == "waste"
            wasted_bytes = int(report.loc[carriers, "wasted_bytes"].sum()) if waste else 0
            wasted_s = float(report.loc[carriers, "wasted_s"].sum()) if waste else 0.0
            totals.append(FlagTotal(flag, severity, int(carriers.sum()), wasted_bytes, wasted_s))
    return totals


def format_seconds(seconds: float) -> str:
    """An estimated duration, rounded as an estimate: 0.43 → "~0.4 s", 0.0021 → "~2.1 ms",
    0.0000031 → "~3.1 µs", 5.6e-8 → "~56.0 ns", 0 → "0 s"."""
    if seconds == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= 0.1 * scale:
            return f"~{seconds / scale:.1f} {unit}"
    return f"~{seconds / 1e-9:.1f} ns"


@functools.cache
def write_seconds_per_byte() -> float:
    """Seconds one byte of an initializing write costs: the fastest of 3 `uniform_` draws into a
    16 MiB float32 CPU tensor, divided by its bytes. Measured once per process (the first call,
    about 50 ms), with torch's current CPU threads.

    An estimate, and a stated one: wasted writes are mostly random draws (`kaiming_uniform_`,
    `normal_`) and fills, run by materialization on whatever device it targets; a CPU draw is the
    common case and the slower one, so the time it gives errs on the high side for fills and GPUs.
    """
    tensor = torch.empty(_TIMED_ELEMENTS, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)  # leaves the global random state alone
    best = float("inf")
    for _ in range(_TIMED_REPEATS):
        start = time.perf_counter()
        tensor.uniform_(generator=generator)
        best = min(best, time.perf_counter() - start)
    return best / (_TIMED_ELEMENTS * tensor.element_size())
