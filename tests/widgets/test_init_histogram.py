"""init_histogram: bar counts of the values, and the expected count per bin from the distribution."""

from __future__ import annotations

import math
import re

import torch

from widgets.init_histogram import expected_density, histogram_svg


def bar_heights(svg: str) -> list[float]:
    return [float(h) for h in re.findall(r"class='de-init-bar' [^>]*height='([0-9.]+)'", svg)]


def test_bars_follow_the_counts():
    values = torch.tensor([0.0, 0.0, 0.0, 1.0])
    svg = histogram_svg(values, "computed", (), math.nan, math.nan, bins=2)
    assert bar_heights(svg) == [122.0, 40.7]  # 3 and 1 of a 122 px plot whose top is 3
    assert "de-init-density" not in svg


def test_normal_density_is_the_expected_count_per_bin():
    density = expected_density("normal", (0.0, 2.0), 0.0, 2.0)
    assert density(0.0) == 1 / (2 * math.sqrt(2 * math.pi))
    assert expected_density("uniform", (-1.0, 1.0), 0.0, 2 / math.sqrt(12))(0.5) == 0.5
    assert expected_density("computed", (), math.nan, math.nan) is None


def test_truncated_normal_density_integrates_to_one_on_its_interval():
    density = expected_density("trunc_normal", (0.0, 1.0, -1.0, 1.0), 0.0, 0.54)
    steps = 10000
    total = sum(density(-1 + 2 * (i + 0.5) / steps) for i in range(steps)) * 2 / steps
    assert abs(total - 1) < 1e-6
    assert density(1.5) == 0.0


def test_a_constant_gets_a_spike():
    svg = histogram_svg(torch.ones(5), "constant", (1.0,), 1.0, 0.0, title="w: constant(1.0)")
    assert svg.count("class='de-init-spike'") == 1
    assert "w: constant(1.0)" in svg


def test_non_finite_values_only():
    svg = histogram_svg(torch.tensor([float("nan")]), "normal", (0.0, 1.0), 0.0, 1.0)
    assert "no finite values" in svg
