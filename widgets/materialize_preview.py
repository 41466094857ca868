"""What a click on "Materialize" will do, said before it is done.

From the inspection's tensors table: the fake tensors the click would fill (the selected modules'
own tensors, or all), their bytes (each storage once) on the target device, the bytes it will read
from which checkpoint files (each recorded read once, at its on-disk size), how many of those bytes
each Hub host will send (ranges already in the range cache count apart: they transfer nothing,
`explorer.hub_fetch.bytes_to_fetch`), whether that fits the
device's free memory now, and how long it should take at the throughput the last materialization
of this session measured. A click above `CONFIRM_ABOVE_BYTES`, or one that does not fit, asks for
confirmation first.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import pandas as pd
import psutil
import torch

from explorer.hub_fetch import bytes_to_fetch

from .formatting import bytes_text, exact_bytes_text

CONFIRM_ABOVE_BYTES = 4 << 30  # 4 GiB
FILES_NAMED = 3  # a preview names this many files, then says how many more
DEFERRED_STATES = ("fake", "disk", "remote")  # explorer.inspection.census: no memory yet


@dataclass(frozen=True)
class MaterializePreview:
    """`tensors` fake names to fill, `bytes` they need on `device`, `free` bytes there now (None:
    unknown, e.g. meta), `seconds` expected (None: nothing measured yet), `reads` (file, bytes) to
    read from checkpoint files, most bytes first, `hub` (host, bytes to fetch, bytes cached) of the
    Hub-backed ones."""

    what: str
    device: str
    tensors: int
    bytes: int
    free: int | None
    seconds: float | None
    throughput: float | None = None
    reads: tuple[tuple[str, int], ...] = ()
    hub: tuple[tuple[str, int, int], ...] = ()

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
        tensors = f"{self.tensors:,} tensor{'s' * (self.tensors != 1)}"
        line = f"{self.what}: {tensors}, {bytes_text(self.bytes)} on {self.device}"
        if self.reads:
            line += f" — {self.reads_text()}"
        for host, fetch, cached in self.hub:
            line += f" — fetches {exact_bytes_text(fetch)} from {host}, {bytes_text(cached)} cached"
        if self.device == "meta":
            line += " — no memory (shapes only)"
        elif self.free is not None:
            line += f" — {'fits' if self.fits else 'does NOT fit'} ({bytes_text(self.free)} free)"
        if self.seconds is not None and self.throughput:
            line += f" — about {_duration(self.seconds)} at the last measured {bytes_text(self.throughput)}/s"
        else:
            line += " — time: known after a first materialization of 16 MiB or more"
        return line

    def reads_text(self) -> str:
        """The reads line: "reads 1.5 MiB from 2 files (model-00001-of-00002.safetensors: 1.0 MiB, ...: 512.0 KiB)"."""
        total = sum(size for _, size in self.reads)
        files = [f"{name}: {bytes_text(size)}" for name, size in self.reads[:FILES_NAMED]]
        if len(self.reads) > FILES_NAMED:
            files.append(f"{len(self.reads) - FILES_NAMED} more")
        count = len(self.reads)
        return f"reads {bytes_text(total)} from {count} file{'s' * (count != 1)} ({', '.join(files)})"


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def free_bytes(device: str) -> int | None:
    """Free memory of `device` now: available RAM for cpu, `cuda.mem_get_info` for CUDA, None for meta."""
    if device == "meta":
        return None
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return int(psutil.virtual_memory().available)


def preview(
    tensors: pd.DataFrame,
    scope: Collection[str] | None,
    *,
    what: str,
    device: str,
    throughput: float | None,
    reads: pd.DataFrame | None = None,
) -> MaterializePreview:
    """The preview for materializing the fake (and "disk") tensors held by modules in `scope` (None:
    all) on `device`, at `throughput` bytes per second (None: unknown); `reads` is the inspection's
    checkpoint reads table (None: no checkpoint)."""
    rows = tensors[tensors["state"].isin(DEFERRED_STATES)]
    if scope is not None:
        rows = rows[rows["module"].isin(set(scope))]
    size = int(rows.drop_duplicates("storage_id")["bytes"].sum()) if len(rows) else 0
    seconds = size / throughput if throughput else None
    names = set(rows["name"].tolist())
    files = file_reads(reads, names) if reads is not None and len(rows) else ()
    hub = hub_reads(reads, names) if reads is not None and len(rows) else ()
    return MaterializePreview(what, device, len(rows), size, free_bytes(device), seconds, throughput, files, hub)


def file_reads(reads: pd.DataFrame, names: set[str]) -> tuple[tuple[str, int], ...]:
    """(file, bytes) read from each checkpoint file to fill `names`, most bytes first: every read
    feeding one of them, once (a read feeding two names, tied or split, is read once)."""
    per_file: dict[str, int] = {}
    for file, size, fed in zip(reads["file"].tolist(), reads["bytes"].tolist(), reads["tensors"].tolist()):
        if not names.isdisjoint(fed):
            per_file[file] = per_file.get(file, 0) + int(size)
    return tuple(sorted(per_file.items(), key=lambda item: (-item[1], item[0])))


def hub_reads(reads: pd.DataFrame, names: set[str]) -> tuple[tuple[str, int, int], ...]:
    """(host, bytes to fetch, bytes cached) of the Hub-backed reads feeding `names`, by host (none
    for a reads table without `path` and `key`)."""
    if "path" not in reads or "key" not in reads:
        return ()
    wanted = [
        (path, key)
        for path, key, fed in zip(reads["path"].tolist(), reads["key"].tolist(), reads["tensors"].tolist())
        if not names.isdisjoint(fed)
    ]
    return tuple((host, held.fetch, held.cached) for host, held in sorted(bytes_to_fetch(wanted).items()))
