"""Gloo's worker threads given the CPU after each collective a tracked eager step waits on.

A ground truth measured under PyTorch's trackers on gloo ranks must be deterministic to be compared to
the byte. Gloo completes a collective's future on its own worker thread, and that thread drops its
reference to the collective's tensors only afterwards; the waiting rank can run on first. On a loaded
two-core machine a whole decoder layer of a tiny model passes before the worker thread is scheduled
again, so a buffer the model has already let go of is still alive at the next module boundaries, and
a snapshot holds one collective buffer more at boundaries that change from run to run (seen in CI: 2,048
bytes, a TP all-reduce of 2 × 8 × 32 floats, in random forward and backward snapshots).
"""

from __future__ import annotations

import time

from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class GlooThreadsCatchUp(TorchDispatchMode):
    """Sleeps 2 ms after each functional collective and each op that waits on one (an op taking an
    `AsyncCollectiveTensor`: its wait runs inside the subclass, out of this mode's sight), so gloo's
    worker thread releases the buffer before the rank moves on, as it does at once on an idle
    machine. Enter it inside the tracker; it allocates nothing."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        waited = func.namespace == "_c10d_functional" or any(
            isinstance(arg, AsyncCollectiveTensor) for arg in pytree.tree_leaves((args, kwargs))
        )
        if waited:
            time.sleep(0.002)
        return result
