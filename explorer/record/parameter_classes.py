"""Parameter subclasses (`class Scaled(nn.Parameter)`) under deferred init: the class each was made as.

`nn.Parameter.__new__(cls, data)` given a fake takes PyTorch's path for tensor subclasses: it returns
`data.detach()` marked `_is_param`, so the fake cannot be an instance of `cls`. Inside a deferred
scope `nn.Parameter.__new__` is wrapped (and restored on every exit) to note `cls` on such a fake;
materialization then makes the real parameter of that class (`parameter_class`), as eager has it.
Mirrors `torch/nn/parameter.py` (`Parameter.__new__`); re-check on upgrades.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .._torch_compat.fake import FakeTensor

PARAMETER_CLASS_ATTR = "_deferred_parameter_class"


def parameter_class(fake: torch.Tensor) -> type[nn.Parameter]:
    """The class deferred parameter `fake` was made as (nn.Parameter unless a subclass was noted)."""
    return fake.__dict__.get(PARAMETER_CLASS_ATTR, nn.Parameter)


@contextlib.contextmanager
def recorded_parameter_classes() -> Iterator[None]:
    """Within this scope, a fake made as a subclass of nn.Parameter notes its class; undone on any exit."""
    original = nn.Parameter.__dict__["__new__"]
    make = original.__func__ if isinstance(original, staticmethod) else original

    def new(cls: type[nn.Parameter], data: Any = None, requires_grad: bool = True) -> Any:
        out = make(cls, data, requires_grad)
        if cls is not nn.Parameter and isinstance(out, FakeTensor) and not isinstance(out, cls):
            out.__dict__[PARAMETER_CLASS_ATTR] = cls
        return out

    nn.Parameter.__new__ = staticmethod(new)  # type: ignore[method-assign,assignment]  # for the block
    try:
        yield
    finally:
        nn.Parameter.__new__ = original  # type: ignore[method-assign]  # restoring torch's own
