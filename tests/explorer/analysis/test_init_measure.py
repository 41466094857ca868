"""init_measure: moments of values with memory, and agreement up to sampling error and rounding."""

from __future__ import annotations

import math

import torch

from explorer.analysis.init_measure import Measured, disagrees, measure


def test_measure_counts_nan_and_inf_and_leaves_them_out():
    measured = measure(torch.tensor([1.0, 3.0, float("nan"), float("inf"), float("-inf")]))
    assert measured == Measured(2.0, 1.0, 1.0, 3.0, 1, 2)


def test_measure_of_integers_and_of_one_element():
    assert measure(torch.tensor([0, 2, 4])) == Measured(2.0, math.sqrt(8 / 3), 0.0, 4.0, 0, 0)
    assert measure(torch.tensor([5.0])) == Measured(5.0, 0.0, 5.0, 5.0, 0, 0)


def test_sampling_error_shrinks_with_the_element_count():
    # a sample std 2 % off: plausible for 100 draws, not for a million
    measured = Measured(0.0, 1.02, -3.0, 3.0, 0, 0)
    assert not disagrees(measured, 0.0, 1.0, 100, True, torch.float32)
    assert disagrees(measured, 0.0, 1.0, 1_000_000, True, torch.float32)


def test_fixed_values_allow_only_rounding():
    assert not disagrees(Measured(1.0, 0.0, 1.0, 1.0, 0, 0), 1.0, 0.0, 10, False, torch.float32)
    assert disagrees(Measured(1.001, 0.0, 1.001, 1.001, 0, 0), 1.0, 0.0, 10, False, torch.float32)
    assert not disagrees(Measured(1.001, 0.0, 1.001, 1.001, 0, 0), 1.0, 0.0, 10, False, torch.bfloat16)


def test_nothing_expected_never_disagrees_and_nan_always_does():
    assert not disagrees(Measured(7.0, 1.0, 0.0, 9.0, 0, 0), math.nan, math.nan, 10, True, torch.float32)
    assert disagrees(Measured(0.0, 1.0, -1.0, 1.0, 1, 0), 0.0, 1.0, 10, True, torch.float32)


def test_a_module_holding_tensors_with_no_float_reading_is_reported_with_their_rows_unmeasured():
    from torch import nn

    from explorer import deferred_init, init_report, materialize_module

    def build() -> nn.Module:
        module = nn.Linear(4, 4)
        module.register_buffer("packed", torch.zeros(8, dtype=torch.float4_e2m1fn_x2))  # packed FP4
        module.register_buffer("bits", torch.zeros(3, dtype=torch.bits8))
        module.register_buffer("sparse", torch.eye(3).to_sparse())
        return module

    eager = build()  # eager: a report of the module as it is
    rows = init_report(eager).set_index("name")
    assert math.isnan(rows.loc["packed", "measured_mean"]) and math.isnan(rows.loc["sparse", "measured_mean"])
    assert rows.loc["weight", "measured_mean"] == float(eager.weight.detach().double().mean())
    model = deferred_init(lambda: nn.Linear(4, 4))
    model.register_buffer("packed", torch.zeros(8, dtype=torch.float4_e2m1fn_x2))
    materialize_module(model)
    assert math.isnan(init_report(model).set_index("name").loc["packed", "measured_mean"])
