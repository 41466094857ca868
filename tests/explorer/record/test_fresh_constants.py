"""Constants made by `torch.tensor(...)` inside a constructor and then written in place.

`torch.tensor` records `lift_fresh(constant)`, which returns the constant itself; the replay must
run it as `lift_fresh_copy`, or later recorded in-place ops would write into the graph's constant
and every replay after the first would start from a changed value (and be refused).
"""

import torch
from torch import nn

from explorer import deferred_init, materialize_module, materialize_tensor


class ScaledConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        values = torch.tensor([1.0, 2.0])
        values.mul_(3)
        self.total = float(values.sum())  # a value read: replays the constant's ops once already
        self.register_buffer("values", values)


def test_constant_written_in_place_materializes_after_a_value_read():
    module = deferred_init(ScaledConstant)
    assert module.total == 9.0
    materialize_module(module)
    assert torch.equal(module.values, torch.tensor([3.0, 6.0]))


def test_constant_written_in_place_replays_the_same_every_time():
    module = deferred_init(ScaledConstant)
    first = materialize_tensor(module.values)
    second = materialize_tensor(module.values, rng="fast")  # another plan: replays the ops again
    assert torch.equal(first, torch.tensor([3.0, 6.0]))
    assert torch.equal(second, torch.tensor([3.0, 6.0]))
