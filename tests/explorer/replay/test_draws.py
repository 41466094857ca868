"""`explorer.replay.draws`: the draw count of every recorded random op equals what its CPU kernel
really takes, over sizes around the 16-element blocks of `normal_` and every floating dtype.

Each case records the op under `deferred_init`, asks `draw_count` for the recorded op, then runs the
op for real and checks that jumping the generator by that count gives the state after the op.
"""

from __future__ import annotations

import functools
from typing import Callable

import pytest
import torch

from explorer import deferred_init
from explorer.graph import InitGraph
from explorer.record.fake import handle_of
from explorer.replay.draws import draw_count
from explorer.replay.mt19937 import jump_state

SIZES = (0, 1, 15, 16, 17, 31, 33, 1023, 4096 + 3)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

OPS: dict[str, Callable[[int, torch.dtype], torch.Tensor]] = {
    "uniform_": lambda n, d: torch.empty(n, dtype=d).uniform_(-2, 3),
    "normal_": lambda n, d: torch.empty(n, dtype=d).normal_(0, 0.02),
    "rand": lambda n, d: torch.rand(n, dtype=d),
    "randn": lambda n, d: torch.randn(n, dtype=d),
    "rand_like": lambda n, d: torch.rand_like(torch.zeros(n, dtype=d)),
    "randn_like": lambda n, d: torch.randn_like(torch.zeros(n, dtype=d)),
    "normal(mean tensor)": lambda n, d: torch.normal(torch.zeros(n, dtype=d), 2.0),
    "bernoulli_(p)": lambda n, d: torch.empty(n, dtype=d).bernoulli_(0.3),
    "bernoulli_(tensor)": lambda n, d: torch.empty(n, dtype=d).bernoulli_(torch.full((n,), 0.3, dtype=d)),
    "bernoulli": lambda n, d: torch.bernoulli(torch.full((n,), 0.3, dtype=d)),
    "random_": lambda n, d: torch.empty(n, dtype=d).random_(),
    "random_(to)": lambda n, d: torch.empty(n, dtype=d).random_(100),
    "random_(from, to)": lambda n, d: torch.empty(n, dtype=d).random_(-50, 50),
    "exponential_": lambda n, d: torch.empty(n, dtype=d).exponential_(),
    "cauchy_": lambda n, d: torch.empty(n, dtype=d).cauchy_(),
    "geometric_": lambda n, d: torch.empty(n, dtype=d).geometric_(0.3),
    "log_normal_": lambda n, d: torch.empty(n, dtype=d).log_normal_(),
    "normal_ strided": lambda n, d: torch.empty(n, 2, dtype=d).t().normal_(),
    "uniform_ strided": lambda n, d: torch.empty(n, 3, dtype=d).t().uniform_(),
}
INTEGER_OPS: dict[str, Callable[[int, torch.dtype], torch.Tensor]] = {
    "randint": lambda n, d: torch.randint(0, 10, (n,), dtype=d),
    "randint_like": lambda n, d: torch.randint_like(torch.zeros(n, dtype=d), 3, 9),
    "random_": lambda n, d: torch.empty(n, dtype=d).random_(),
    "random_(to)": lambda n, d: torch.empty(n, dtype=d).random_(2),
    "randperm": lambda n, d: torch.randperm(n, dtype=torch.int64 if d == torch.uint8 else d),  # n > 255
}
INTEGERS = (torch.int64, torch.int32, torch.uint8)


def recorded_random_op(make: Callable[[], torch.Tensor]) -> tuple[InitGraph, int]:
    holder = deferred_init(lambda: torch.nn.ParameterList([torch.nn.Parameter(make(), requires_grad=False)]))
    graph = handle_of(holder[0]).graph
    (stream,) = graph.random_streams.values()
    assert len(stream) == 1
    return graph, stream[0]


def check_count(make: Callable[[], torch.Tensor]) -> int | None:
    graph, index = recorded_random_op(make)
    count = draw_count(graph, graph.ops[index])
    generator_state = torch.get_rng_state()
    make()
    if count is not None:
        assert jump_state(generator_state, count).equal(torch.get_rng_state())
    return count


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", OPS)
def test_draw_count_of_float_ops_is_what_the_kernel_takes(name: str, dtype: torch.dtype, restore_rng) -> None:
    counts = {}
    for n in SIZES:
        torch.manual_seed(n)
        torch.rand(5)  # start mid-block
        counts[n] = check_count(lambda: OPS[name](n, dtype))
    if name in ("uniform_", "rand", "rand_like", "uniform_ strided"):
        factor = 3 if "strided" in name else 1
        assert counts == {n: n * factor * (2 if dtype == torch.float64 else 1) for n in SIZES}
    if name in ("normal_", "randn"):
        assert counts[0] == 0 and counts[1] is None and counts[15] is None  # scalar path: cached sample
        assert counts[16] is not None and counts[4099] is not None
    if name in ("log_normal_", "normal_ strided"):
        assert all(counts[n] is None for n in SIZES if n)


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
@pytest.mark.parametrize("name", INTEGER_OPS)
def test_draw_count_of_integer_ops_is_what_the_kernel_takes(name: str, dtype: torch.dtype, restore_rng) -> None:
    counts = {}
    for n in SIZES:
        torch.manual_seed(n)
        counts[n] = check_count(lambda: INTEGER_OPS[name](n, dtype))
    if name == "randint":
        assert counts == {n: n for n in SIZES}
    if name == "randperm":
        assert set(counts.values()) == {None}


def test_a_randint_range_past_2_to_the_32_takes_two_draws_per_value(restore_rng) -> None:
    counts = [check_count(lambda: torch.randint(-(2**40), 2**40, (n,))) for n in SIZES]
    assert counts == [2 * n for n in SIZES]


@pytest.mark.parametrize("dtype", (torch.int64, torch.int32, torch.float32, torch.float64), ids=str)
def test_a_randint_range_from_2_to_the_28_below_2_to_the_32_is_left_to_scratch(dtype: torch.dtype, restore_rng) -> None:
    # torch 2.13 takes two draws per value there for some dtypes and ranges, one for others
    counts = [check_count(functools.partial(torch.randint, 0, 2**30, (n,), dtype=dtype)) for n in SIZES]
    assert counts == [None] * len(SIZES)


def test_cuda_ops_have_no_cpu_draw_count(restore_rng) -> None:
    graph, index = recorded_random_op(lambda: torch.empty(100, device="cuda").uniform_())
    assert draw_count(graph, graph.ops[index]) is None


@pytest.mark.parametrize("name", [*OPS, "uniform_ 4 args", "random_(from, to) other range"])
def test_remembered_draw_counts_are_the_counted_ones(name: str, restore_rng) -> None:
    """note [Draw counts by layout]: an answer given again from memory is the one counting gives,
    for ops of the same layout that differ only in a plain argument, dtype or stride too."""
    from explorer.replay.draws import _draw_count

    extra = {
        "uniform_ 4 args": lambda n, d: torch.empty(n, dtype=d).uniform_(0, 1),
        "random_(from, to) other range": lambda n, d: torch.empty(n, dtype=d).random_(-5, 2**40),
    }
    make = OPS.get(name) or extra[name]
    for dtype in (torch.float32, torch.float64, torch.float32):
        for n in (17, 17, 4099):
            graph, index = recorded_random_op(functools.partial(make, n, dtype))
            op = graph.ops[index]
            assert draw_count(graph, op) == _draw_count(graph, op)
            assert draw_count(graph, op) == _draw_count(graph, op)  # the remembered answer
