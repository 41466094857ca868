"""`Module._apply` inside a constructor: `.to(dtype)`, `.float()`, `.half()` on fake parameters.

PyTorch swaps a fake parameter with its converted copy through `torch.utils.swap_tensors`, which
refuses a tensor that has a weak reference, and the recorder keeps one on every fake it made
(GraphBuilder._fakes). Inside `deferred_init` only (undone on every exit), `swap_tensors` drops
those references for the swap and takes them again after; the conversion itself (`_to_copy`) is
recorded like any op, and the parameter object ends up holding the converted fake, as in eager.

Note: mirrors `torch.nn.Module._apply` (2.13), which looks `torch.utils.swap_tensors` up at call
time; re-check on upgrades (tests/explorer/record/test_recording.py casts inside a constructor).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.utils

from .builder import GraphBuilder


@contextlib.contextmanager
def swappable_fakes(builder: GraphBuilder) -> Iterator[None]:
    """While the block runs, `torch.utils.swap_tensors` works on the fakes `builder` recorded."""
    original = torch.utils.swap_tensors

    def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
        with builder.unreferenced((t1, t2)):
            original(t1, t2)

    torch.utils.swap_tensors = swap_tensors
    try:
        yield
    finally:
        torch.utils.swap_tensors = original
