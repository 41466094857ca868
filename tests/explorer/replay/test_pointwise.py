"""`explorer.replay.pointwise`: the probe that a pointwise kernel rounds alike in every position, and
the ops of a value's tail applied to a run of its elements."""

from __future__ import annotations

import torch

from explorer.graph import OpNode
from explorer.replay.pointwise import apply_tail, gives_the_same_bits_in_short_runs
from explorer.replay.positional import TailOp
from tests.support.run_length_op import add_length_

CPU = torch.device("cpu")
aten = torch.ops.aten

def _op(func, *args) -> OpNode:
    return OpNode(0, func, (None, *args), {}, None, (), (0,), frozenset({0}), (), (0,), (), False, False, None)


def test_exact_ops_pass_the_probe_in_every_float_dtype() -> None:
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        assert gives_the_same_bits_in_short_runs(aten.mul_.Tensor, (0.02,), (), dtype, CPU)
        assert gives_the_same_bits_in_short_runs(aten.clamp_.default, (-2.0, 2.0), (), dtype, CPU)
        assert gives_the_same_bits_in_short_runs(aten.add_.Tensor, (0.5,), (), dtype, CPU)


def test_an_op_whose_result_depends_on_its_run_fails_the_probe() -> None:
    assert not gives_the_same_bits_in_short_runs(add_length_, (), (), torch.float32, CPU)


def test_an_op_that_raises_on_the_probe_fails_it() -> None:
    # erfinv_ has no kernel for integers
    assert not gives_the_same_bits_in_short_runs(aten.erfinv_.default, (), (), torch.int64, CPU)


def test_the_tail_scales_every_element_and_sets_constants_only_where_its_run_meets_the_elements() -> None:
    tail = (TailOp(_op(aten.mul_.Tensor, 2.0)), TailOp(_op(aten.fill_.Scalar, -1.0), window=(3, 6)))
    values = torch.arange(5.0, 10.0)  # elements [5, 10) of the storage: the run [3, 6) meets element 5
    assert apply_tail(tail, values, first=5).tolist() == [-1.0, 12.0, 14.0, 16.0, 18.0]
    assert apply_tail(tail, torch.arange(6.0, 8.0), first=6).tolist() == [12.0, 14.0]  # no overlap


def test_a_tail_op_failing_the_probe_or_with_unhashable_arguments_gives_none() -> None:
    values = torch.ones(4)
    assert apply_tail((TailOp(_op(add_length_)),), values, 0) is None
    assert apply_tail((TailOp(_op(aten.mul_.Tensor, [2.0])),), values, 0) is None
    assert values.tolist() == [1.0] * 4  # left as it was
