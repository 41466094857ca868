"""Random ops given a generator of the constructor's own (note [A constructor's own generators] in
explorer/record/private_generators.py): replayed from the state that generator had, so every
subset, order and rng mode gives eager's values, and the generator is left where eager leaves it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explorer import DeferredInitError, deferred_init, is_deferred, materialize_module, materialize_tensor, to_fx
from explorer.graph import GeneratorState
from explorer.record.fake import handle_of
from tests.explorer.test_bad_input import assert_clean_global_state

SEED = 0


class DrawsFromItsOwnGenerator(nn.Module):
    """Every kind of random op PyTorch offers a generator to, interleaved with default draws."""

    def __init__(self, generator: torch.Generator | None = None) -> None:
        super().__init__()
        own = generator if generator is not None else torch.Generator().manual_seed(7)
        self.kaiming = nn.Parameter(torch.empty(40, 30))
        nn.init.kaiming_uniform_(self.kaiming, a=5**0.5, generator=own)
        self.linear = nn.Linear(30, 20)  # default generator, between two draws from `own`
        self.factory = nn.Parameter(torch.randn(17, 5, generator=own))
        self.scalar_path = nn.Parameter(torch.empty(10).normal_(generator=own))  # < 16: the cached sample
        self.permutation = nn.Buffer(torch.randperm(12, generator=own))
        self.truncated = nn.Parameter(torch.empty(6, 6))
        nn.init.trunc_normal_(self.truncated, std=0.02, generator=own)
        self.mask = nn.Buffer(torch.bernoulli(torch.full((4, 4), 0.5), generator=own))
        self.after = nn.Parameter(torch.randn(9))
        self.left_at = own.get_state()


def _eager(generator: torch.Generator | None = None) -> DrawsFromItsOwnGenerator:
    torch.manual_seed(SEED)
    return DrawsFromItsOwnGenerator(generator)


def _deferred(generator: torch.Generator | None = None) -> DrawsFromItsOwnGenerator:
    torch.manual_seed(SEED)
    return deferred_init(DrawsFromItsOwnGenerator, generator)


def _assert_equal_state(module: nn.Module, eager: nn.Module) -> None:
    expected = eager.state_dict()
    got = module.state_dict()
    assert list(got) == list(expected)
    assert [name for name in expected if not torch.equal(got[name], expected[name])] == []


def test_a_model_drawing_from_its_own_generator_materializes_as_eager():
    module = _deferred()
    assert is_deferred(module)
    materialize_module(module)
    _assert_equal_state(module, _eager())
    assert_clean_global_state()


def test_the_constructors_generator_is_left_where_eager_leaves_it():
    eager_generator, deferred_generator = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    eager = _eager(eager_generator)
    module = _deferred(deferred_generator)
    assert torch.equal(module.left_at, eager.left_at)  # read inside the constructor
    assert torch.equal(deferred_generator.get_state(), eager_generator.get_state())  # and after it
    assert torch.equal(torch.rand(5, generator=deferred_generator), torch.rand(5, generator=eager_generator))


@pytest.mark.parametrize(
    "order",
    [["after", "scalar_path"], ["mask", "kaiming"], ["truncated", "linear", "factory"]],
    ids=lambda order: "-".join(order),
)
def test_any_subset_in_any_order_gives_eagers_values(order: list[str]):
    eager, module = _eager(), _deferred()
    for name in order:
        if name == "linear":
            materialize_module(module.linear)
            _assert_equal_state(module.linear, eager.linear)
        else:
            assert torch.equal(materialize_tensor(getattr(module, name)), getattr(eager, name)), name
    materialize_module(module)
    _assert_equal_state(module, eager)


def test_rng_fast_still_gives_eagers_values_for_the_own_generators_draws():
    eager, module = _eager(), _deferred()
    materialize_module(module, rng="fast")
    own = ["kaiming", "factory", "scalar_path", "permutation", "truncated", "mask"]
    assert [name for name in own if not torch.equal(getattr(module, name), getattr(eager, name))] == []
    assert not torch.equal(module.after, eager.after)  # a default draw: fast's own numbers


def test_the_recorded_op_carries_the_generators_state_and_names_its_seed():
    module = _deferred()
    graph = handle_of(module.permutation).graph
    (randperm,) = [op for op in graph.ops if str(op.func) == "aten.randperm.generator"]
    state = randperm.kwargs["generator"]
    assert isinstance(state, GeneratorState)
    assert (state.device, repr(state), randperm.stream) == ("cpu", "<own cpu generator, seed 7>", None)
    expected = torch.Generator().manual_seed(7)
    torch.empty(40, 30).uniform_(generator=expected)
    torch.randn(17, 5, generator=expected)
    torch.empty(10).normal_(generator=expected)
    assert torch.equal(state.state, expected.get_state())  # eager's state just before randperm


def test_to_fx_runs_the_own_generators_draws_from_their_recorded_states():
    program = to_fx(_deferred())
    values = program()
    expected = _eager().state_dict()
    assert [name for name, value in values.items() if not torch.equal(value, expected[name])] == []
    assert "generator_in_state" in program.code


class DrawsWithTheDefaultGeneratorPassedExplicitly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Parameter(torch.empty(20).normal_(generator=torch.default_generator))
        self.c = nn.Parameter(torch.randn(3, 3, generator=torch.default_generator))
        self.d = nn.Linear(4, 4)


def test_the_default_generator_passed_as_generator_is_the_default_stream():
    torch.manual_seed(SEED)
    eager = DrawsWithTheDefaultGeneratorPassedExplicitly()
    torch.manual_seed(SEED)
    module = deferred_init(DrawsWithTheDefaultGeneratorPassedExplicitly)
    materialize_module(module.d)  # after b and c in the default stream: their draws are counted
    _assert_equal_state(module.d, eager.d)
    materialize_module(module)
    _assert_equal_state(module, eager)


def test_a_generator_on_another_device_type_is_refused_as_eager_refuses_it():
    generator = torch.Generator().manual_seed(1)
    state = generator.get_state()

    def cuda_tensor_cpu_generator() -> nn.Module:
        module = nn.Module()
        module.w = nn.Parameter(torch.empty(3, device="cuda").normal_(generator=generator))
        return module

    with pytest.raises(DeferredInitError) as error:
        deferred_init(cuda_tensor_cpu_generator)
    message = str(error.value)
    assert message.startswith("aten.normal_.default at ")
    assert "test_private_generators.py" in message
    assert "was given a generator on cpu for a tensor on cuda:0, which eager construction refuses too: " in message
    assert message.endswith("pass a torch.Generator(device='cuda')")
    assert torch.equal(generator.get_state(), state)
    assert_clean_global_state()


def test_a_rejection_sampler_drawing_from_its_own_generator_is_refused_naming_the_op():
    generator = torch.Generator().manual_seed(1)
    state = generator.get_state()

    def poisson_counts() -> nn.Module:
        module = nn.Module()
        module.counts = nn.Buffer(torch.poisson(torch.rand(8) * 5, generator=generator))
        return module

    with pytest.raises(DeferredInitError) as error:
        deferred_init(poisson_counts)
    message = str(error.value)
    assert message.startswith("aten.poisson.default at ")
    assert "may draw from its own torch.Generator as many times as its inputs' values need" in message
    assert torch.equal(generator.get_state(), state)  # nothing drawn from it
    assert_clean_global_state()


def test_a_draw_from_an_own_generator_after_construction_is_recorded_as_eager():
    def build() -> nn.Linear:
        return nn.Linear(8, 8)

    torch.manual_seed(SEED)
    eager = build()
    nn.init.normal_(eager.weight, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(SEED)
    module = deferred_init(build)
    nn.init.normal_(module.weight, generator=torch.Generator().manual_seed(5))
    assert is_deferred(module.weight)
    materialize_module(module)
    _assert_equal_state(module, eager)
