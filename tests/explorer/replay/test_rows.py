"""`explorer.replay.rows`: rows drawn alone equal those rows of the whole materialized tensor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explorer import deferred_init, materialize_tensor
from explorer.replay.rows import draw_rows

SHAPES = ((37, 5), (16, 16), (3, 7), (100,), (9, 1, 3), (1, 17), (64, 33))
FILLS = {
    "normal_": lambda t: t.normal_(0.5, 0.02),
    "uniform_": lambda t: t.uniform_(-3, 3),
    "uniform_ then normal_": lambda t: nn.init.normal_(nn.init.uniform_(t), std=0.02),
    "exponential_": lambda t: t.exponential_(2.0),
    "random_(0, 1000)": lambda t: t.random_(0, 1000),
}


class Filled(nn.Module):
    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, fill) -> None:
        super().__init__()
        self.before = nn.Parameter(torch.empty(50).uniform_())  # the generator is not at its start
        self.weight = nn.Parameter(fill(torch.empty(shape, dtype=dtype)))


@pytest.mark.parametrize("rng", ["eager", "fast"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rows_drawn_alone_equal_the_whole_tensors_rows(shape, dtype, fill, rng, restore_rng) -> None:
    torch.manual_seed(3)
    module = deferred_init(Filled, shape, dtype, FILLS[fill])
    whole = materialize_tensor(module.weight, rng=rng)
    rows = shape[0]
    for start, stop in {(0, rows), (0, rows // 2), (rows // 2, rows), (1, rows - 1), (rows - 1, rows), (2, 2)}:
        if not 0 <= start <= stop <= rows:
            continue
        part = draw_rows(module.weight, start, stop, rng)
        assert part is not None
        assert part.dtype == dtype and part.shape == whole[start:stop].shape
        assert part.view(torch.uint8).equal(whole[start:stop].contiguous().view(torch.uint8)), (start, stop)


def test_eager_rows_equal_eager_construction(restore_rng) -> None:
    torch.manual_seed(11)
    def hugging_face_init(t: torch.Tensor) -> torch.Tensor:  # reset_parameters, then _init_weights
        return nn.init.normal_(nn.init.kaiming_uniform_(t), std=0.02)

    expected = Filled((40, 3), torch.float32, hugging_face_init).weight.detach()
    torch.manual_seed(11)
    module = deferred_init(Filled, (40, 3), torch.float32, hugging_face_init)
    assert torch.equal(draw_rows(module.weight, 20, 40), expected[20:])
    assert torch.equal(draw_rows(module.weight, 0, 20), expected[:20])


def test_tensors_not_made_by_one_fill_are_refused(restore_rng) -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scaled = nn.Parameter(torch.empty(8, 4).normal_() * 2)  # an op after the fill
            base = torch.empty(10, 4).uniform_()
            self.view = nn.Parameter(base[2:])  # part of a larger storage
            self.small = nn.Parameter(torch.empty(3, 2).normal_())  # normal_ below 16: cached sample

    module = deferred_init(Mixed)
    assert [draw_rows(t, 0, 1) for t in module.parameters()] == [None] * 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(32, 2), (9, 5), (3, 16)], ids=str)
def test_half_precision_normal_rows_equal_the_whole_tensors_rows(shape, dtype, restore_rng) -> None:
    # Half precision draws its tail after the whole blocks, not after every element (fill_layout).
    torch.manual_seed(4)
    module = deferred_init(Filled, shape, dtype, FILLS["normal_"])
    whole = materialize_tensor(module.weight)
    for start in range(shape[0]):
        part = draw_rows(module.weight, start, shape[0])
        assert part.view(torch.uint8).equal(whole[start:].contiguous().view(torch.uint8)), start
