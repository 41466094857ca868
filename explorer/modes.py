"""The two modes that watch a constructor run: one below the dispatcher, one above it.

`RecordingDispatchMode` sits on top of a FakeTensorMode: every aten call runs on fake tensors and
is then handed to the `GraphBuilder`. `.item()`-like reads (`aten._local_scalar_dense`) are
answered with real values by materializing the small tensor on the spot.

`RecordingFunctionMode` catches the few things that never reach the dispatcher: `.data = x`
(which swaps a tensor's storage in C++) and `.numpy()`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .errors import DeferredInitError
from .record import GraphBuilder
from .replay import outside_recording
from .source import user_location

_aten = torch.ops.aten
_DATA_DESCRIPTOR = torch._C.TensorBase.data
_NUMPY = torch.Tensor.numpy

# Reads a fake tensor's true value: (fake) -> real tensor with the values eager construction has.
ValueReader = Callable[[FakeTensor], torch.Tensor]


class RecordingDispatchMode(TorchDispatchMode):
    """Records every aten op that reaches it, after FakeTensorMode (below it) has run the op."""

    def __init__(self, builder: GraphBuilder, read_value: ValueReader) -> None:
        super().__init__()
        self.builder = builder
        self.read_value = read_value

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace == "prim":
            return func(*args, **kwargs)
        if func is _aten._local_scalar_dense.default and isinstance(args[0], FakeTensor):
            source = user_location(2)
            real = self.read_value(args[0])
            with outside_recording():
                value = real.item()
            self.builder.record(func, args, kwargs, value, source)
            return value
        try:
            out = func(*args, **kwargs)
        except DeferredInitError:
            raise
        except Exception as error:
            raise self.builder.failure(func, error, user_location(2)) from error
        self.builder.record(func, args, kwargs, out, user_location(2))
        return out


class RecordingFunctionMode(TorchFunctionMode):
    """Sees `Tensor.data` assignment and `.numpy()`, which the dispatcher never does."""

    def __init__(self, builder: GraphBuilder, read_value: ValueReader) -> None:
        super().__init__()
        self.builder = builder
        self.read_value = read_value

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _NUMPY and args and isinstance(args[0], FakeTensor):
            real = self.read_value(args[0])
            with outside_recording():
                return real.numpy(**kwargs)
        if getattr(func, "__self__", None) is _DATA_DESCRIPTOR and func.__name__ == "__set__":
            target, value = args
            result = func(*args, **kwargs)
            if isinstance(target, FakeTensor) and isinstance(value, FakeTensor):
                self.builder.record_set_data(target, value, user_location(2))
            return result
        return func(*args, **kwargs)
