"""`explorer.replay.rows`: rows drawn alone equal those rows of the whole materialized tensor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explorer import WholeBaseWarning, deferred_init, materialize_tensor, slice_plan
from explorer.record.fake import handle_of
from explorer.replay.pointwise import gives_the_same_bits_in_short_runs
from explorer.replay.positional import positional_value
from explorer.replay.rows import draw_rows
from tests.support.run_length_op import add_length_

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


def _inverse_cdf_trunc_normal(t: torch.Tensor) -> torch.Tensor:
    """timm's trunc_normal_ (and torch's before 2.13): uniform_, then pointwise ops in place."""
    with torch.no_grad():
        t.uniform_(-0.95, 0.95)
        t.erfinv_()
        t.mul_(0.02 * 2**0.5)
        t.add_(0.01)
        return t.clamp_(min=-0.04, max=0.04)


TAILS = {
    "inverse-CDF trunc_normal_": _inverse_cdf_trunc_normal,
    "normal_ then scaled": lambda t: t.normal_().mul_(0.5).div_(3).sub_(1.25),
    "ones then added to": lambda t: t.fill_(1).add_(2.5),
    "zeroed then a row set": lambda t: (t.zero_(), t[1].fill_(7.0))[0],
    "normal_ then a row zeroed": lambda t: (t.normal_(), t[2].zero_())[0],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("tail", TAILS)
def test_rows_of_a_fill_then_pointwise_ops_equal_eager_constructions_rows(tail, dtype, restore_rng) -> None:
    torch.manual_seed(5)
    eager = Filled((40, 24), dtype, TAILS[tail]).weight.detach()
    torch.manual_seed(5)
    module = deferred_init(Filled, (40, 24), dtype, TAILS[tail])
    for start, stop in ((0, 40), (1, 3), (2, 3), (17, 40), (39, 40)):
        part = draw_rows(module.weight, start, stop)
        assert part is not None, (start, stop)
        assert part.view(torch.uint8).equal(eager[start:stop].contiguous().view(torch.uint8)), (start, stop)


@pytest.mark.parametrize("tail", TAILS)
def test_fast_rows_of_a_fill_then_pointwise_ops_equal_the_whole_fast_tensors_rows(tail, restore_rng) -> None:
    module = deferred_init(Filled, (40, 24), torch.float32, TAILS[tail])
    whole = materialize_tensor(module.weight, rng="fast")
    for start, stop in ((0, 40), (1, 3), (17, 40)):
        part = draw_rows(module.weight, start, stop, "fast")
        assert part is not None and part.view(torch.uint8).equal(whole[start:stop].contiguous().view(torch.uint8))


class Tailed(nn.Module):
    def __init__(self, tail) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(40, 24))
        with torch.no_grad():
            self.weight.normal_()
            tail(self.weight)


def test_ops_after_the_fill_that_are_not_positional_leave_rows_to_the_whole_tensor(restore_rng) -> None:
    refused = {
        "aten.mul_.Tensor after the fill reads another tensor": lambda w: w.mul_(torch.arange(24.0)),
        "aten.mul_.Tensor after the fill is neither a pointwise in-place op on the whole tensor nor a constant": (
            lambda w: w[:, :3].mul_(2)
        ),
        "aten.cumsum_.default after the fill is neither a pointwise in-place op on the whole tensor nor a constant": (
            lambda w: w.cumsum_(0)
        ),
    }
    for reason, tail in refused.items():
        torch.manual_seed(8)
        eager = Tailed(tail).weight.detach()
        torch.manual_seed(8)
        module = deferred_init(Tailed, tail)
        handle = handle_of(module.weight)
        assert positional_value(handle.graph, handle.graph.tensors[handle.tensor_id]) == reason
        assert draw_rows(module.weight, 0, 4) is None
        assert materialize_tensor(module.weight).equal(eager)


def test_a_pointwise_op_whose_result_depends_on_its_run_fails_the_probe(restore_rng) -> None:
    # tagged pointwise, but each element gets its run's length added: rows alone would differ
    torch.manual_seed(7)
    eager = Tailed(add_length_).weight.detach()
    torch.manual_seed(7)
    module = deferred_init(Tailed, add_length_)
    assert draw_rows(module.weight, 0, 4) is None
    assert materialize_tensor(module.weight).equal(eager)


def test_sigmoid_rows_are_drawn_alone_only_where_its_kernel_rounds_alike_in_every_position(restore_rng) -> None:
    # ATen's vectorized sigmoid_ rounds differently from its scalar loop on x86 (float32): the probe
    # sends such a tensor whole; where the two agree, the rows are drawn alone and equal eager's
    torch.manual_seed(6)
    eager = Tailed(torch.sigmoid_).weight.detach()
    torch.manual_seed(6)
    module = deferred_init(Tailed, torch.sigmoid_)
    part = draw_rows(module.weight, 3, 9)
    sigmoid_ = torch.ops.aten.sigmoid_.default
    same = gives_the_same_bits_in_short_runs(sigmoid_, (), (), torch.float32, torch.device("cpu"))
    assert (part is not None) == same
    if part is not None:
        assert part.view(torch.uint8).equal(eager[3:9].contiguous().view(torch.uint8))
    assert materialize_tensor(module.weight).view(torch.uint8).equal(eager.view(torch.uint8))


def test_every_parameter_of_a_timm_vit_is_drawn_by_rows_equal_to_eagers_rows(restore_rng) -> None:
    # timm's init: trunc_normal_ (uniform_ then pointwise ops), zero biases, LayerNorms of ones
    import timm

    def build() -> nn.Module:
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=32, num_classes=10)

    torch.manual_seed(12)
    eager = build().state_dict()
    torch.manual_seed(12)
    module = deferred_init(build)
    for name, fake in module.named_parameters():
        rows = fake.shape[0]
        for start, stop in ((0, rows), (rows // 3, rows), (rows - 1, rows)):
            part = draw_rows(fake, start, stop)
            assert part is not None, name
            assert part.view(torch.uint8).equal(eager[name][start:stop].contiguous().view(torch.uint8)), (name, start)


def test_rows_after_a_data_swap_nothing_used_are_the_swapped_values(restore_rng) -> None:
    # `.data = x` never reaches the dispatcher: rows, slices and their plans must catch it up first
    def swapped() -> nn.Module:
        module = Filled((12, 4), torch.float32, FILLS["normal_"])
        module.weight.data = module.before.data[:48].view(12, 4) * 2
        return module

    torch.manual_seed(5)
    eager = swapped().weight.detach()
    torch.manual_seed(5)
    module = deferred_init(Filled, (12, 4), torch.float32, FILLS["normal_"])
    module.weight.data = module.before.data[:48].view(12, 4) * 2
    assert draw_rows(module.weight, 3, 6) is None  # a computed value: not made by position
    plan = slice_plan(module.weight[3:6])
    assert plan.sliced is False and plan.reason.startswith("its base is not made by position")
    with pytest.warns(WholeBaseWarning):
        rows = materialize_tensor(module.weight[3:6])
    assert rows.equal(eager[3:6])
    assert materialize_tensor(module.weight).equal(eager)
