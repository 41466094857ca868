"""Progress of `save_checkpoint`: a callback, a tqdm bar, or nothing.

`progress` is a function `(done_tensors, total_tensors, done_bytes, total_bytes)` (what the
explorer's materialize bar takes; it may raise to cancel, e.g. KeyboardInterrupt), True for a tqdm
bar on stderr, False for none, or None: a bar when stderr is a terminal (a script run by hand),
none otherwise (logs, tests, notebooks that pass their own callback).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

# progress(done_tensors, total_tensors, done_bytes, total_bytes); may raise to cancel.
SaveProgress = Callable[[int, int, int, int], None]
ProgressOption = SaveProgress | bool | None


class SaveReport:
    """Counts what was written and tells the callback or bar; `start` once the totals are known."""

    def __init__(self, progress: ProgressOption, description: str) -> None:
        if progress is not None and not isinstance(progress, bool) and not callable(progress):
            raise TypeError(
                f"progress must be a function (done, total, done_bytes, total_bytes), True, False or "
                f"None, got {type(progress).__name__}"
            )
        wants_bar = progress is True or (progress is None and sys.stderr is not None and sys.stderr.isatty())
        self.callback: SaveProgress | None = progress if callable(progress) else None
        self.description = description
        self.bar: Any = None
        self._wants_bar = wants_bar
        self.done = self.total = self.done_bytes = self.total_bytes = 0

    def start(self, total: int, total_bytes: int) -> None:
        self.total, self.total_bytes = total, total_bytes
        if self._wants_bar and self.bar is None:
            from tqdm.auto import tqdm  # untyped (pyproject: ignore_missing_imports); the bar is held as Any

            self.bar = tqdm(
                total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc=self.description, file=sys.stderr
            )

    def advance(self, tensors: int, nbytes: int) -> None:
        """`tensors` more tensors (`nbytes` bytes) are written under their final names."""
        self.done += tensors
        self.done_bytes += nbytes
        if self.bar is not None:
            self.bar.update(nbytes)
            self.bar.set_postfix_str(f"{self.done}/{self.total} tensors", refresh=False)
        if self.callback is not None:
            self.callback(self.done, self.total, self.done_bytes, self.total_bytes)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
