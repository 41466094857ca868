"""Lazy modules (`nn.LazyLinear`, ...) under deferred_init.

`UninitializedParameter(...)` calls `Tensor._make_subclass` on a fresh tensor, which a FakeTensor
refuses. While `deferred_init` runs (and only then) the two uninitialized classes instead hand back
a fake tensor whose class mixes the uninitialized behaviour into `DeferredTensor`; its
`materialize(shape)` (run by the module's first forward) then works on fakes like any `.data = x`.
A forward of the deferred model after `deferred_init` returned (outside any deferred scope) shapes
it the same way, recorded into the model's recording: `materialize` re-opens it for the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast

import torch
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

from .._torch_compat.dispatch import tensor_shape
from .fake import DeferredTensor, handle_of
from .scope import active_scope


class _ShapedInTheRecording:
    """`materialize(shape)` recorded into the tensor's recording when no deferred scope runs."""

    def materialize(self, shape, device=None, dtype=None) -> None:  # torch's signature
        handle = handle_of(self)
        recorder = handle.graph.recorder if handle is not None else None
        if active_scope() is not None or recorder is None:
            return super().materialize(shape, device, dtype)  # type: ignore[misc]  # the mixin's, next in the MRO
        with recorder.reopened(lambda: [cast(torch.Tensor, self)]):
            super().materialize(shape, device, dtype)  # type: ignore[misc]  # the mixin's, next in the MRO


class DeferredUninitializedParameter(_ShapedInTheRecording, UninitializedParameter, DeferredTensor):
    """A not-yet-shaped lazy parameter recorded by deferred_init.

    A subclass of `UninitializedParameter` itself, not only of its mixin: lazy modules check
    `isinstance(self.weight, UninitializedParameter)` before shaping it (`LazyConv2d` asserts it).
    """

    cls_to_become = DeferredTensor
    shape = tensor_shape  # fake mode reads it; the mixin would refuse


class DeferredUninitializedBuffer(_ShapedInTheRecording, UninitializedBuffer, DeferredTensor):
    """A not-yet-shaped lazy buffer recorded by deferred_init (an `UninitializedBuffer`, as above)."""

    cls_to_become = DeferredTensor
    shape = tensor_shape


def _new_parameter(cls, requires_grad=True, device=None, dtype=None):  # torch's signature
    data = torch.empty(0, device=device, dtype=dtype).requires_grad_(requires_grad)
    data.__class__ = DeferredUninitializedParameter
    data._is_param = True
    return data


def _new_buffer(cls, requires_grad=False, device=None, dtype=None, persistent=True):
    data = torch.empty(0, device=device, dtype=dtype).requires_grad_(requires_grad)
    data.__class__ = DeferredUninitializedBuffer
    data.persistent = persistent
    data._is_buffer = True
    return data


@contextlib.contextmanager
def deferred_lazy_modules() -> Iterator[None]:
    """Within this scope, lazy modules create fake uninitialized tensors; undone on any exit."""
    originals = {cls: cls.__dict__["__new__"] for cls in (UninitializedParameter, UninitializedBuffer)}
    UninitializedParameter.__new__ = staticmethod(_new_parameter)  # type: ignore[method-assign]  # for the block
    UninitializedBuffer.__new__ = staticmethod(_new_buffer)  # type: ignore[method-assign]  # for the block
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.__new__ = original  # type: ignore[method-assign]  # restoring torch's own
