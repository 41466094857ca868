"""`explorer.replay.positional`: which values are made by position, and why the others are not."""

from __future__ import annotations

import torch
from torch import nn

from explorer import deferred_init
from explorer.record.fake import handle_of
from explorer.replay.positional import PositionalValue, positional_value


class Values(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.zeros = nn.Parameter(torch.zeros(4, 3))
        self.full = nn.Parameter(torch.full((4, 3), 2.5))
        with torch.no_grad():
            self.scaled_constant = nn.Parameter(torch.empty(4, 3).fill_(3.0).mul_(2))
            self.filled = nn.Parameter(torch.empty(40, 3).uniform_(-1, 1).erfinv_())
            base = torch.empty(10, 3).normal_()
            self.part = nn.Parameter(base[2:])
            self.reads_another = nn.Parameter(torch.empty(40, 3).normal_().mul_(torch.arange(3.0)))
        with torch.inference_mode():
            self.register_buffer("inference", torch.ones(4, 3))


def _value(module: nn.Module, name: str) -> PositionalValue | str:
    handle = handle_of(getattr(module, name))
    return positional_value(handle.graph, handle.graph.tensors[handle.tensor_id])


def test_constants_and_fills_with_their_pointwise_tails() -> None:
    module = deferred_init(Values)
    zeros, full, scaled, filled = (_value(module, n) for n in ("zeros", "full", "scaled_constant", "filled"))
    assert (zeros.kind, zeros.source.label, zeros.constant, zeros.tail) == ("constant", "aten.zeros.default", 0, ())
    assert (full.kind, full.constant, full.tail) == ("constant", 2.5, ())
    assert (scaled.kind, scaled.source.label, scaled.constant) == ("constant", "aten.fill_.Scalar", 3.0)
    assert [(step.op.label, step.window) for step in scaled.tail] == [("aten.mul_.Tensor", None)]
    assert (filled.kind, filled.source.label) == ("random fill", "aten.uniform_.default")
    assert [step.op.label for step in filled.tail] == ["aten.erfinv_.default"]


def test_values_not_made_by_position_say_why() -> None:
    module = deferred_init(Values)
    handle = handle_of(module.part)
    assert positional_value(handle.graph, handle.graph.tensors[handle.tensor_id]) == (
        "the tensor is not contiguous over its whole storage"
    )
    assert _value(module, "reads_another") == "aten.mul_.Tensor after the fill reads another tensor"
    assert _value(module, "inference") == (
        "it was made under torch.inference_mode() (an inference tensor, made whole as eager made it)"
    )
