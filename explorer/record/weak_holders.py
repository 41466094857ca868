"""Weak tables of real tensors that `torch.utils.swap_tensors` must not trip over.

Note: [Materialized tensors swap too]
The replay keeps weak references to the real tensors it handed out (memos, deferred forms,
provenance), and `swap_tensors` refuses a tensor any weak reference points at: with
`torch.__future__.set_swap_module_params_on_conversion(True)`, `model.half()` of a materialized
model failed where the eager one converts. Each table registers how to let go of a tensor
(`register_weak_holder`); a swap of real tensors (record/swaps.py) drops those references for the
swap and takes them again on the same objects after (the module's slot object stays the one the
tables name). A leaf module: the tables live in replay/, the swap in record/.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

WeakHolder = Callable[[torch.Tensor], "Callable[[], None] | None"]
_WEAK_HOLDERS: list[WeakHolder] = []


def register_weak_holder(let_go: WeakHolder) -> None:
    """`let_go(t)` drops a table's weak references to `t` and returns what restores them (or None
    when it held none): note [Materialized tensors swap too]."""
    _WEAK_HOLDERS.append(let_go)


@contextlib.contextmanager
def without_weak_holders(tensors: tuple[torch.Tensor, ...]) -> Iterator[None]:
    """Within the block, no registered table holds a weak reference to any of `tensors`."""
    restores = [restore for tensor in tensors for let_go in _WEAK_HOLDERS if (restore := let_go(tensor)) is not None]
    try:
        yield
    finally:
        for restore in restores:
            restore()
