"""The fake tensors users hold: FakeTensors that know which recorded graph and tensor id they are.

`deferred_init` turns every FakeTensor it sees come out of an op into a `DeferredTensor` (a
FakeTensor subclass that only changes how it prints) and tags it with a `DeferredHandle`. The
handle holds the graph strongly; the graph never holds a fake, so dropping the module frees the
graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch._subclasses.fake_tensor import FakeTensor

if TYPE_CHECKING:
    from .graph import InitGraph, TensorId

HANDLE_ATTR = "_deferred_handle"


@dataclass(slots=True)
class DeferredHandle:
    """Which graph a fake tensor belongs to, which tensor id it currently is, and its version then."""

    graph: "InitGraph"
    tensor_id: "TensorId"
    version: int


class DeferredTensor(FakeTensor):
    """A FakeTensor recorded by `deferred_init`: prints with its metadata and `fake=True`."""

    def __repr__(self) -> str:  # noqa: D105 - the format is the documented API
        parts = [f"size={tuple(self.shape)}", f"device='{self.device}'"]
        if self.dtype != torch.get_default_dtype():
            parts.append(f"dtype={self.dtype}")
        if self.requires_grad:
            parts.append("requires_grad=True")
        return f"tensor(..., {', '.join(parts)}, fake=True)"

    __str__ = __repr__

    def numpy(self, *, force: bool = False):  # noqa: ANN201 - numpy is optional for users
        """Inside deferred_init: the true values (as eager construction has them). Outside: an error,
        since a fake tensor has no data until it is materialized."""
        from .deferred import recording_graph, read_value  # deferred imports fake: avoid a cycle
        from .replay import outside_recording

        handle = handle_of(self)
        if handle is None or recording_graph() is not handle.graph:
            raise RuntimeError(
                "this is a fake tensor (no storage): call explorer.materialize_tensor(t).numpy() to get values"
            )
        real = read_value(handle.graph, self)
        with outside_recording():
            return real.numpy(force=force)


def is_fake(tensor: object) -> bool:
    """True for any fake tensor (ours or another FakeTensorMode's): it has metadata but no storage."""
    return isinstance(tensor, FakeTensor)


def handle_of(tensor: object) -> DeferredHandle | None:
    """The recording handle of a fake tensor made under `deferred_init`, or None."""
    if not isinstance(tensor, FakeTensor):
        return None
    return tensor.__dict__.get(HANDLE_ATTR)
