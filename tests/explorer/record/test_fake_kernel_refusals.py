"""An op whose fake kernel refuses (NotImplementedError) is decided by its CPU kernel on the true
values (note [Fake kernels stricter than the CPU's] in explorer/record/modes.py): eager's output,
or eager's own error unchanged, so that a constructor's `except NotImplementedError` takes the same
branch as in eager (torch 2.15's ParametrizationList does so for weight_norm of an int64 tensor)."""

from __future__ import annotations

import torch
from torch import nn

from explorer import deferred_init, materialize_module


@torch.library.custom_op("explorer_test::halved_floats", mutates_args=())
def halved_floats(x: torch.Tensor) -> torch.Tensor:
    if not x.is_floating_point():
        raise NotImplementedError(f"halved_floats: {x.dtype} is not supported")
    return x / 2


@halved_floats.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    if not x.is_floating_point():
        raise NotImplementedError(f"halved_floats: {x.dtype} is not supported")
    return torch.empty_like(x)


class FallsBack(nn.Module):
    """Halves a float buffer; an int buffer's halving is refused, and the constructor falls back."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("floats", torch.arange(4.0))
        self.register_buffer("ints", torch.arange(4))
        self.halved = nn.Buffer(halved_floats(self.floats))
        try:
            self.halved_ints = nn.Buffer(halved_floats(self.ints))
        except NotImplementedError:
            self.halved_ints = nn.Buffer(self.ints.clone())


def test_a_constructor_catching_a_kernels_not_implemented_takes_eagers_branch() -> None:
    eager = FallsBack()
    module = deferred_init(FallsBack)
    materialize_module(module)
    assert module.halved.equal(eager.halved) and module.halved.equal(torch.tensor([0.0, 0.5, 1.0, 1.5]))
    assert module.halved_ints.equal(eager.halved_ints) and module.halved_ints.equal(torch.arange(4))
    assert module.halved_ints.dtype == torch.int64
