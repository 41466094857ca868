"""Files of a checkpoint appear complete or not at all: write under a temporary name, then rename.

Every file `save_checkpoint` writes goes through `open_for_writing` (the one place bytes reach the
disk, so tests can stand in for a full disk) into a hidden temporary (`.<name>.partial`, or a
`.dcp-<id>.partial` directory), and is renamed to its final name once complete. A cancel, a crash
or a full disk therefore leaves no partial file under a final name, and files written before are
not touched. A write that fails is re-raised as the same OSError subclass with a message naming
the file, the bytes it needed and the space left (`disk_error`).

A set of files read together (a sharded checkpoint: its shards and its index) is renamed together
(`written_together`): every file first goes to its temporary name, and only when all are complete
are they renamed, so a failed save never leaves some new shards beside an earlier save's others,
and a model saved back into the directory it was read from reads the old files to the end.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from ..naming import format_bytes


def open_for_writing(path: Path) -> io.BufferedWriter:
    """A new binary file at `path` (truncated if it exists)."""
    return open(path, "wb")


def partial_name(path: Path) -> Path:
    """Where `path` is written before it is complete: a hidden sibling."""
    return path.with_name(f".{path.name}.partial")


def disk_error(error: OSError, path: Path, needed: int, remaining: int | None = None) -> OSError:
    """`error` again, its message naming `path`, the bytes the file needed and the free space, so
    a full disk says what to free ("writing …/model-00002-of-00004.safetensors failed: No space
    left on device; the file needs 4.7 GiB (5000000000 bytes), the checkpoint 9.3 GiB more in
    all, 1.2 GiB free on /data")."""
    reason = error.strerror or str(error)
    text = f"writing {path} failed: {reason}; the file needs {format_bytes(needed)} ({needed} bytes)"
    if remaining is not None and remaining > needed:
        text += f", the checkpoint {format_bytes(remaining)} more in all"
    free = _free_bytes(path.parent)
    if free is not None:
        text += f", {format_bytes(free)} free on {path.parent}"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        text += "; nothing under a final name was left half written"
    return type(error)(error.errno, text) if error.errno is not None else type(error)(text)


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


WriteFile = Callable[..., None]  # (path, needed bytes, write(stream), remaining=None)


@contextlib.contextmanager
def written_together() -> Iterator[WriteFile]:
    """A function that writes a file through `write(stream)`, for the block: each file goes to its
    partial name; when the block completes, all are renamed to their final names in the order
    written; when it raises (a cancel included), every partial file is removed and no final name
    changes. A failed write's OSError comes back as `disk_error`'s, naming the file and the bytes
    it needed."""
    staged: list[tuple[Path, Path]] = []

    def write_file(path: Path, needed: int, write: Callable[[IO[bytes]], object], remaining: int | None = None) -> None:
        temporary = partial_name(path)
        staged.append((temporary, path))
        try:
            with open_for_writing(temporary) as stream:
                write(stream)
        except OSError as error:
            raise disk_error(error, path, needed, remaining) from error

    try:
        yield write_file
        for temporary, path in staged:
            os.replace(temporary, path)
    except BaseException:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def removed_on_error(directory: Path) -> Iterator[Path]:
    """`directory` (created), removed with its contents if the block raises (a cancel included)."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        yield directory
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
