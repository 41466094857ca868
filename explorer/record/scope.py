"""The recording scope: which graph this thread is recording, and how to step outside it.

Like PyTorch's mode stack, this state sits below everything that consults it: the fake tensors
(`DeferredTensor.numpy`, `__deepcopy__`), the recording mode, the analyses that refuse to run
inside a recording, and `deferred_init`, which opens the scope. Keeping it in a leaf module is what
lets the tensor class ask "am I being recorded?" without importing the entry point above it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .._torch_compat.dispatch import disable_current_modes, disable_torch_function

if TYPE_CHECKING:
    from .._torch_compat.fake import FakeTensor
    from ..graph import InitGraph

# Reads a fake tensor's true value: (fake) -> real tensor with the values eager construction has.
ValueReader = Callable[["FakeTensor"], torch.Tensor]


@dataclass(frozen=True, slots=True)
class RecordingScope:
    """One running `deferred_init`: the graph it records into and how it answers value reads."""

    graph: InitGraph
    read_value: ValueReader


_local = threading.local()


def active_scope() -> RecordingScope | None:
    """The scope of the `deferred_init` running on this thread, if any."""
    return getattr(_local, "scope", None)


def recording_graph() -> InitGraph | None:
    """The graph being recorded on this thread, if `deferred_init` is running."""
    scope = active_scope()
    return scope.graph if scope is not None else None


@contextlib.contextmanager
def recording(scope: RecordingScope) -> Iterator[RecordingScope]:
    """Make `scope` this thread's recording scope until the block exits (on any exit path), then
    the one before it again (a read of another recording records into it for a moment: note
    [Reading another recording] in record/foreign.py)."""
    before = active_scope()
    _local.scope = scope
    try:
        yield scope
    finally:
        _local.scope = before


@contextlib.contextmanager
def outside_recording() -> Iterator[None]:
    """Real tensor ops with no fake or recording mode active, autograd off, and no autocast: a
    recording holds the casts autocast made when it ran, so a replay under the caller's autocast
    would cast twice (and give other dtypes and values than eager)."""
    with disable_current_modes(), disable_torch_function(), torch.no_grad(), autocast_off():
        yield


_AUTOCAST_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu")


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Autocast disabled, for every device type it is enabled on, until the block exits."""
    with contextlib.ExitStack() as stack:
        for device_type in _AUTOCAST_DEVICE_TYPES:
            if _autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type this torch build has no autocast for
        return False
