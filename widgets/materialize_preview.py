"""What a click on "Materialize" will do, said before it is done.

From the inspection's tensors table: the fake tensors the click would fill (the selected modules'
own tensors, or all), their bytes (each storage once) on the target device, whether that fits the
device's free memory now, and how long it should take at the throughput the last materialization
of this session measured. A click above `CONFIRM_ABOVE_BYTES`, or one that does not fit, asks for
confirmation first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

import pandas as pd
import psutil
import torch

from .formatting import bytes_text

CONFIRM_ABOVE_BYTES = 4 << 30  # 4 GiB


@dataclass(frozen=True)
class MaterializePreview:
    """`tensors` fake names to fill, `bytes` they need on `device`, `free` bytes there now (None:
    unknown, e.g. meta), `seconds` expected (None: nothing measured yet)."""

    what: str
    device: str
    tensors: int
    bytes: int
    free: int | None
    seconds: float | None
    throughput: float | None = None

    @property
    def fits(self) -> bool:
        return self.free is None or self.bytes <= self.free

    @property
    def needs_confirmation(self) -> bool:
        return self.tensors > 0 and (self.bytes > CONFIRM_ABOVE_BYTES or not self.fits)

    def text(self) -> str:
        """One line, e.g. "selection: 9 tensors, 772.0 MiB on cpu — fits (20.1 GiB free) — about 2.1 s
        at the last measured 367.6 MiB/s"."""
        if self.tensors == 0:
            return f"{self.what}: nothing to materialize (no fake tensors)"
        line = f"{self.what}: {self.tensors:,} tensor{'s' * (self.tensors != 1)}, {bytes_text(self.bytes)} on {self.device}"
        if self.device == "meta":
            line += " — no memory (shapes only)"
        elif self.free is not None:
            line += f" — {'fits' if self.fits else 'does NOT fit'} ({bytes_text(self.free)} free)"
        if self.seconds is not None and self.throughput:
            line += f" — about {_duration(self.seconds)} at the last measured {bytes_text(self.throughput)}/s"
        else:
            line += " — time: known after a first materialization of 16 MiB or more"
        return line


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def free_bytes(device: str) -> int | None:
    """Free memory of `device` now: available RAM for cpu, `cuda.mem_get_info` for CUDA, None for meta."""
    if device == "meta":
        return None
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return int(psutil.virtual_memory().available)


def preview(tensors: pd.DataFrame, scope: Collection[str] | None, *, what: str, device: str,
            throughput: float | None) -> MaterializePreview:
    """The preview for materializing the fake tensors held by modules in `scope` (None: all) on
    `device`, at `throughput` bytes per second (None: unknown)."""
    rows = tensors[tensors["state"] == "fake"]
    if scope is not None:
        rows = rows[rows["module"].isin(set(scope))]
    size = int(rows.drop_duplicates("storage_id")["bytes"].sum()) if len(rows) else 0
    seconds = size / throughput if throughput else None
    return MaterializePreview(what, device, len(rows), size, free_bytes(device), seconds, throughput)
