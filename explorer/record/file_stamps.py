"""Which version of each checkpoint file a recording read: size, modification time and inode.

Note: [A checkpoint changed since recording]
A read op names its file and key; the layout comes from the header read while recording. A file
rewritten in between with the same keys, shapes and dtypes would be read without complaint, and
one module could mix two checkpoints (a layer materialized before the rewrite, another after), or
give other bytes after `release_module`. So the first read of each file in a recording stamps it
here, and a replay refuses to run reads of a file whose stamp changed (replay/preflight.py), naming
the file. A directory (DCP) is stamped by every file in it.
"""

from __future__ import annotations

import os

from .scope import recording_graph

FileStamp = tuple


def file_stamp(path: str) -> FileStamp | None:
    """(size, mtime_ns, inode) of file `path`, or of every file in directory `path`; None when it
    cannot be read (a Hub stub that is not a local file, a file gone)."""
    try:
        if os.path.isdir(path):
            return tuple(
                sorted(
                    (entry.name, stat.st_size, stat.st_mtime_ns, stat.st_ino)
                    for entry in os.scandir(path)
                    if entry.is_file()
                    for stat in (entry.stat(),)
                )
            )
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_size, stat.st_mtime_ns, stat.st_ino)


def stamped(path: str) -> str:
    """`path`, stamped into the running recording the first time it reads it."""
    graph = recording_graph()
    if graph is not None and path not in graph.file_stamps and (stamp := file_stamp(path)) is not None:
        graph.file_stamps[path] = stamp
    return path
