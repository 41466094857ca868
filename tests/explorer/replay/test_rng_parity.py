"""RNG parity with eager construction (rng="eager") and order independence (rng="fast")."""

import itertools

import pytest
import torch
from torch import nn

from explorer import deferred_init, materialize_module, materialize_tensor
from explorer.record.fake import handle_of


class DoubleInit(nn.Module):
    """Like Hugging Face models: every Linear is initialised by its constructor, then again."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
        self.register_buffer("noise", torch.randn(5))
        for layer in self.layers:
            layer.weight.data.normal_(0.0, 0.02)
            layer.bias.data.zero_()


def eager_state(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    return DoubleInit().state_dict()


def assert_equal_to_eager(module: nn.Module, seed: int = 0) -> None:
    expected = eager_state(seed)
    actual = module.state_dict()
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(actual[name], value), name


@pytest.mark.parametrize("order", list(itertools.permutations(range(4)))[::5])
def test_eager_rng_matches_eager_construction_in_any_order(order):
    torch.manual_seed(0)
    module = deferred_init(DoubleInit)
    for index in order:
        materialize_module(module.layers[index])
    materialize_module(module)
    assert_equal_to_eager(module)


def test_eager_rng_single_tensor_out_of_order_matches_eager():
    torch.manual_seed(0)
    module = deferred_init(DoubleInit)
    noise = materialize_tensor(module.noise)
    assert torch.equal(noise, eager_state()["noise"])


def test_global_rng_state_is_unchanged_by_deferred_init_and_materialization():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    module = deferred_init(DoubleInit)
    assert torch.equal(torch.get_rng_state(), before)
    materialize_module(module.layers[2])
    materialize_module(module)
    assert torch.equal(torch.get_rng_state(), before)
    assert_equal_to_eager(module, 123)


def test_fast_rng_is_reproducible_and_order_independent():
    torch.manual_seed(0)
    forward = deferred_init(DoubleInit)
    torch.manual_seed(0)
    backward = deferred_init(DoubleInit)
    materialize_module(forward, rng="fast")
    for layer in reversed(backward.layers):
        materialize_module(layer, rng="fast")
    materialize_module(backward, rng="fast")
    for name, value in forward.state_dict().items():
        assert torch.equal(value, backward.state_dict()[name]), name
    # and it really is random: a different start state gives different values
    torch.manual_seed(1)
    other = materialize_module(deferred_init(DoubleInit), rng="fast")
    assert not torch.equal(other.layers[0].weight, forward.layers[0].weight)


def test_fast_rng_skips_writes_that_a_later_op_overwrites():
    module = deferred_init(DoubleInit)
    graph = handle_of(module.layers[0].weight).graph
    weight_id = handle_of(module.layers[0].weight).tensor_id
    eager_ops = [graph.ops[i].label for i in graph.closure_of([weight_id])]
    fast_ops = [graph.ops[i].label for i in graph.closure_of([weight_id], skip_dead_writes=True)]
    assert "aten.uniform_.default" in eager_ops  # kaiming_uniform_ from reset_parameters
    assert "aten.uniform_.default" not in fast_ops
    assert "aten.normal_.default" in fast_ops


def test_fast_and_eager_draw_from_the_same_distribution_shape():
    torch.manual_seed(0)
    module = materialize_module(deferred_init(DoubleInit), rng="fast")
    weight = module.layers[0].weight
    assert weight.shape == (16, 16)
    assert 0.01 < weight.std().item() < 0.03  # normal_(0, 0.02) ran, not the overwritten kaiming init


class DeepMixed(nn.Module):
    """Twelve blocks drawing with every common initializer, sizes around the 16-element blocks of
    `normal_`, float32/float64/bfloat16, twice initialised like Hugging Face models."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList()
        for i in range(12):
            block = nn.Module()
            block.proj = nn.Linear(7 + i, 9 + 2 * i)  # kaiming_uniform_ + uniform_ bias
            block.gate = nn.Parameter(torch.empty(15 + i, dtype=torch.float64))
            block.emb = nn.Embedding(3 + i, 5)  # normal_
            block.low = nn.Parameter(torch.empty(33 + i, dtype=torch.bfloat16).uniform_(-1, 1))
            block.register_buffer("mask", torch.rand(4 + i).bernoulli_(0.3))
            block.register_buffer("ids", torch.randint(0, 100, (i + 1,)))
            nn.init.xavier_normal_(block.proj.weight)
            nn.init.normal_(block.gate, 0.0, 0.5)
            self.blocks.append(block)


def test_last_block_then_first_of_a_deep_model_equal_eager_bytes():
    torch.manual_seed(5)
    expected = DeepMixed().state_dict()
    torch.manual_seed(5)
    module = deferred_init(DeepMixed)
    for index in (11, 0, 6):
        materialize_module(module.blocks[index])
        for name, value in module.blocks[index].state_dict().items():
            reference = expected[f"blocks.{index}.{name}"]
            assert value.dtype == reference.dtype
            assert value.view(torch.uint8).equal(reference.view(torch.uint8)), f"blocks.{index}.{name}"
    materialize_module(module)
    for name, value in module.state_dict().items():
        assert value.view(torch.uint8).equal(expected[name].view(torch.uint8)), name


class SamplesByRejection(nn.Module):
    """Random ops whose draw count depends on their inputs' values, then ordinary draws after them."""

    def __init__(self) -> None:
        super().__init__()
        signed = torch.randn(40)
        self.leaky = nn.Buffer(nn.functional.rrelu(signed, training=True))  # one draw per negative element
        nn.functional.rrelu_(signed, training=True)
        self.signed = nn.Buffer(signed)
        self.ids = nn.Buffer(torch.randint_like(torch.empty(30, dtype=torch.int64), torch.tensor(2**40)))
        self.rates = nn.Buffer(torch.rand(64) * 20)
        self.counts = nn.Buffer(torch.poisson(self.rates))
        self.rates.mul_(3)  # written after poisson read it: the scratch run needs the earlier value
        self.gamma = nn.Buffer(torch._standard_gamma(self.rates))
        self.trials = nn.Buffer(torch.binomial(torch.full((30,), 50.0), torch.rand(30)))
        self.mixture = nn.Buffer(torch._sample_dirichlet(torch.rand(5, 4) + 0.1))
        self.linear = nn.Linear(5, 5)
        self.weight = nn.Parameter(torch.randn(10))


@pytest.mark.parametrize("first", ["weight", "linear", "trials", "gamma", "rates", "signed"])
def test_a_draw_after_rejection_samplers_materialized_first_equals_eager(first: str):
    # Reaching its generator state re-runs the samplers skipped before it: on eager's input values,
    # since on stand-ins they would draw another number of values.
    torch.manual_seed(0)
    eager = SamplesByRejection()
    torch.manual_seed(0)
    module = deferred_init(SamplesByRejection)
    if first == "linear":
        materialize_module(module.linear)
        assert torch.equal(module.linear.weight, eager.linear.weight)
        assert torch.equal(module.linear.bias, eager.linear.bias)
    else:
        assert torch.equal(materialize_tensor(getattr(module, first)), getattr(eager, first))
    materialize_module(module)
    assert [name for name, value in eager.state_dict().items() if not torch.equal(module.state_dict()[name], value)] == []


class DrawsIntoResizedOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.grown = nn.Buffer(torch.rand(20, 2, out=torch.empty(0)))  # out= resized from 0 to 40
        self.shrunk = nn.Buffer(torch.randint(0, 9, (4,), out=torch.empty(3, 3, dtype=torch.int64)))
        self.after = nn.Parameter(torch.empty(9, 5).normal_())


@pytest.mark.parametrize("first", ["after", "shrunk"])
def test_a_draw_after_an_out_variant_that_resized_its_out_tensor_equals_eager(first: str):
    torch.manual_seed(0)
    eager = DrawsIntoResizedOut()
    torch.manual_seed(0)
    module = deferred_init(DrawsIntoResizedOut)
    assert torch.equal(materialize_tensor(getattr(module, first)), getattr(eager, first))
    materialize_module(module)
    assert [name for name, value in eager.state_dict().items() if not torch.equal(module.state_dict()[name], value)] == []


def _stack_of_small_linears() -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(40)])  # fills small enough to run in line


def test_random_draws_by_other_code_during_a_materialization_change_none_of_its_values():
    # The progress callback runs between replayed ops, as a notebook cell or another thread may
    # (the explorer's Materialize bar runs in a thread): replay must not draw from the process's
    # generator (note [Replay draws from generators of its own]).
    torch.manual_seed(0)
    eager = _stack_of_small_linears()
    torch.manual_seed(0)
    module = deferred_init(_stack_of_small_linears)
    torch.manual_seed(123)
    materialize_module(module, progress=lambda *counts: torch.randn(3))
    assert [name for name, value in eager.state_dict().items() if not torch.equal(module.state_dict()[name], value)] == []
    expected = torch.Generator().manual_seed(123)
    for _ in range(len(list(module.parameters()))):
        torch.randn(3, generator=expected)
    assert torch.equal(torch.get_rng_state(), expected.get_state())  # only the callback's draws moved it
