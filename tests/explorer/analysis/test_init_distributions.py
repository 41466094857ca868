"""init_distributions: names in words, analytic moments, mixtures and scalings."""

from __future__ import annotations

import math

from explorer.analysis.init_distributions import UNINITIALIZED, constant, mixture, normal, orthogonal, uniform


def test_uniform_moments():
    dist = uniform(-0.125, 0.125)
    assert (dist.text, dist.mean, dist.std, dist.random) == ("uniform(-0.125, 0.125)", 0.0, 0.25 / math.sqrt(12), True)


def test_mixture_moments_are_exact_and_equal_parts_merge():
    # 6 draws of N(0, 1) and 2 zeros, given as three parts
    dist = mixture([(3, normal(0.0, 1.0)), (2, constant(0.0)), (3, normal(0.0, 1.0))])
    assert dist.text == "normal(mean=0.0, std=1.0); 2 elements: zeros"
    assert (dist.family, dist.mean, dist.std) == ("mixed", 0.0, math.sqrt(6 / 8))


def test_mixture_of_constants_is_fixed():
    dist = mixture([(1, constant(1.0)), (3, constant(0.0))])
    assert (dist.mean, dist.std, dist.random) == (0.25, math.sqrt(0.25 * 0.75), False)


def test_a_mixture_with_unwritten_elements_has_no_moments():
    dist = mixture([(4, constant(0.0)), (4, UNINITIALIZED)])
    assert dist.text == "zeros; 4 elements: uninitialized" and math.isnan(dist.std)


def test_scaling_keeps_the_family_and_changes_the_key():
    scaled = normal(0.0, 0.02).scaled(0.5, "*")
    assert (scaled.text, scaled.family, scaled.std) == ("normal(mean=0.0, std=0.02) * 0.5", "normal", 0.01)
    assert scaled.key != normal(0.0, 0.01).key
    assert orthogonal((6, 4)).scaled(2.0, "*").text == "orthogonal(gain=2.0)"
    assert constant(2.0).shifted(1.0, "+").text == "constant(3.0)"
