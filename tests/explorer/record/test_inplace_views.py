"""In-place view ops (`t_`, `squeeze_`...) change a tensor's layout in place: replayed exactly once."""

import torch
from torch import nn

from explorer import deferred_init, materialize_module


class Orthogonal(nn.Module):
    """torch.nn.init.orthogonal_ transposes in place (t_) when rows < cols, as RWKV does."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(rows, cols))
        nn.init.orthogonal_(self.w)


class InplaceTranspose(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        x = torch.empty(2, 3).normal_()
        x.t_()
        y = torch.arange(6.0).view(1, 6, 1)
        y.squeeze_()
        y.unsqueeze_(0)
        self.register_buffer("transposed", x.contiguous() * 1)
        self.register_buffer("reshaped", y)


def assert_matches_eager(factory, *args):
    torch.manual_seed(0)
    eager = factory(*args)
    torch.manual_seed(0)
    module = materialize_module(deferred_init(factory, *args))
    for name, value in eager.state_dict().items():
        actual = module.state_dict()[name]
        assert actual.shape == value.shape and actual.stride() == value.stride(), name
        assert torch.equal(actual, value), name


def test_orthogonal_init_of_wide_matrix_matches_eager():
    assert_matches_eager(Orthogonal, 32, 64)
    assert_matches_eager(Orthogonal, 64, 32)


def test_inplace_transpose_and_squeeze_are_replayed_once():
    assert_matches_eager(InplaceTranspose)
