"""`Module._apply` inside a constructor: `.to(dtype)`, `.float()`, `.half()` on fake parameters.

PyTorch swaps a fake parameter with its converted copy through `torch.utils.swap_tensors`, which
refuses a tensor that has a weak reference, and the recorder keeps one on every fake it made
(GraphBuilder._fakes). Inside `deferred_init` only (undone on every exit), `swap_tensors` drops
those references for the swap and takes them again after; the conversion itself (`_to_copy`) is
recorded like any op, and the parameter object ends up holding the converted fake, as in eager.

Note: [A cast keeps a parameter's attributes]
`Module._apply` keeps a real parameter object and sets its `.data`, so attributes set on it
(`p._no_weight_decay = True`) survive `.half()`. A fake parameter is swapped instead, and
`swap_tensors` swaps the `__dict__`s too: the module's parameter object would end up with the
converted copy's attributes, none of the user's. From the first deferred recording on, for the rest
of the process (casts of a deferred model come after `deferred_init` returned), `swap_tensors`
is wrapped: a swap of two fakes keeps the first one's attributes, next to the fake state it takes
from the second; any other swap is PyTorch's, made without the replay's weak references to
materialized tensors (note [Materialized tensors swap too] in record/weak_holders.py).

Note: mirrors `torch.nn.Module._apply` (2.13), which looks `torch.utils.swap_tensors` up at call
time; re-check on upgrades (tests/explorer/record/test_recording.py casts inside a constructor).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.utils

from .builder import GraphBuilder
from .fake import handle_of, is_fake, user_attributes
from .weak_holders import without_weak_holders

_installed = False


def install_attribute_keeping_swap() -> None:
    """Wrap `torch.utils.swap_tensors` once per process (note [A cast keeps a parameter's attributes])."""
    global _installed
    if _installed:
        return
    _installed = True
    original = torch.utils.swap_tensors

    def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
        fakes = is_fake(t1) and is_fake(t2)
        kept, before = (user_attributes(t1), handle_of(t1)) if fakes else (None, None)
        with contextlib.nullcontext() if fakes else without_weak_holders((t1, t2)):
            original(t1, t2)
        if kept:
            t1.__dict__.update(kept)
        after = handle_of(t1) if fakes else None
        if before is not None and after is not None and after.graph is before.graph:
            live = before.graph.replay_state
            if live is not None:  # note [Writes after a tensor was made] in replay/replay.py
                live.after_recorded_swap(before.tensor_id, after.tensor_id)

    swap_tensors.__doc__ = original.__doc__
    torch.utils.swap_tensors = swap_tensors


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
