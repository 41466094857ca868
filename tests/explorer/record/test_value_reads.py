"""`.item()`, `.tolist()`, `bool()`, `int()`, `.numpy()` inside constructors return true values."""

import numpy as np
import torch
from torch import nn

from explorer import deferred_init, materialize_module


class StochasticDepth(nn.Module):
    """ViT-style: a drop-path schedule read out of a tensor while building."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.rates = [x.item() for x in torch.linspace(0, 0.1, depth)]
        self.as_list = torch.linspace(0, 0.1, depth).tolist()
        self.random_width = int(torch.randint(3, 9, (1,)))  # data-dependent shape from the RNG
        self.proj = nn.Linear(self.random_width, 2)
        self.enabled = bool(torch.tensor(1.0) > 0)
        self.table = torch.arange(4).numpy()


def test_values_read_inside_the_constructor_are_the_eager_values():
    torch.manual_seed(0)
    eager = StochasticDepth()
    torch.manual_seed(0)
    module = deferred_init(StochasticDepth)
    assert module.rates == eager.rates
    assert module.as_list == eager.as_list
    assert module.random_width == eager.random_width
    assert module.proj.weight.shape == eager.proj.weight.shape
    assert module.enabled is True
    assert isinstance(module.table, np.ndarray) and module.table.tolist() == [0, 1, 2, 3]


def test_reading_a_random_value_keeps_later_parameters_in_parity():
    torch.manual_seed(0)
    eager = StochasticDepth()
    torch.manual_seed(0)
    module = materialize_module(deferred_init(StochasticDepth))
    assert torch.equal(module.proj.weight, eager.proj.weight)
    assert torch.equal(module.proj.bias, eager.proj.bias)


def test_value_reads_leave_the_global_rng_untouched():
    torch.manual_seed(5)
    before = torch.get_rng_state()
    deferred_init(StochasticDepth)
    assert torch.equal(torch.get_rng_state(), before)
