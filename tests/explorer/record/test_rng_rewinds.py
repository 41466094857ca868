"""Reseeding and rewinding the CPU generator inside a recording (note [Reseeding while recording] in
explorer/record/seeding.py): the draws after the call start where eager's generator is then."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from explorer import DeferredInitError, deferred, deferred_init, materialize_module, materialize_tensor
from tests.support.parity import assert_module_equals_eager


class RewindsBetweenLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        state = torch.get_rng_state()
        self.a = nn.Linear(3, 3)
        torch.set_rng_state(state)  # eager: b draws a's numbers again
        self.b = nn.Linear(3, 3)


class ForksAroundALayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        with torch.random.fork_rng():
            torch.manual_seed(7)
            self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)  # continues after `first`, as if the block had drawn nothing


class SeedsEachLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        for index in range(3):
            torch.manual_seed(100 + index)
            self.layers.append(nn.Linear(4, 5))
        self.head = nn.Linear(5, 2)  # after the last seed's draws
        self.noise = nn.Buffer(torch.randn(6))


class SeedsInAForkThatDrawsNothing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        with torch.random.fork_rng():
            torch.manual_seed(7)  # a helper that seeds but, this time, draws nothing
        self.a = nn.Linear(3, 3)  # eager: continues after `first`


class RestoresACopiedState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        saved = torch.get_rng_state().clone()  # a tensor the constructor computed
        self.b = nn.Linear(3, 3)
        torch.set_rng_state(saved)
        self.c = nn.Linear(3, 3)  # b's numbers again


class ReadsAndRestoresWithNothingBetween(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        torch.set_rng_state(torch.get_rng_state())
        self.b = nn.Linear(3, 3)


class StartsFromAGivenState(nn.Module):
    def __init__(self, state: torch.Tensor) -> None:
        super().__init__()
        torch.set_rng_state(state)  # before any draw: like a seed
        self.a = nn.Linear(3, 3)


class ReseedsBetweenLayersOfANormalInit(nn.Module):
    """A normal_ of fewer than 16 elements reads the generator's cached sample, which a reseed resets."""

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Parameter(torch.empty(5).normal_())
        torch.manual_seed(3)
        self.also_small = nn.Parameter(torch.empty(7).normal_())
        self.large = nn.Parameter(torch.empty(40).normal_())


RESEEDING = [RewindsBetweenLayers, ForksAroundALayer, SeedsEachLayer, ReadsAndRestoresWithNothingBetween,
             ReseedsBetweenLayersOfANormalInit, SeedsInAForkThatDrawsNothing, RestoresACopiedState]


@pytest.mark.parametrize("build", RESEEDING, ids=lambda build: build.__name__)
def test_a_model_that_reseeds_while_recording_equals_eager(build: Callable[[], nn.Module], restore_rng) -> None:
    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    model = materialize_module(deferred_init(build))
    assert_module_equals_eager(build.__name__, model, eager)


@pytest.mark.parametrize("build", RESEEDING, ids=lambda build: build.__name__)
def test_each_tensor_of_a_reseeding_model_made_alone_latest_first_equals_eager(build, restore_rng) -> None:
    torch.manual_seed(0)
    eager = dict(build().named_parameters())
    torch.manual_seed(0)
    model = deferred_init(build)
    for name, fake in reversed(list(model.named_parameters())):
        assert torch.equal(materialize_tensor(fake), eager[name]), name
        if fake.dim() == 2:
            assert torch.equal(materialize_tensor(fake[1:]), eager[name][1:]), name


class SeedsInTwoForks(nn.Module):
    """Seeds inside `fork_rng` twice, with draws before, between and after (PEFT's PSOFT, per layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Parameter(torch.rand(4))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
        self.second = nn.Parameter(torch.rand(4))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
        self.third = nn.Parameter(torch.rand(4))


@pytest.mark.parametrize("materialize_first", [True, False], ids=["materialized-first", "recorded-twice"])
def test_a_model_seeding_in_forks_recorded_again_equals_eager(materialize_first, restore_rng):
    torch.manual_seed(0)
    eager = SeedsInTwoForks()
    torch.manual_seed(0)
    first = deferred_init(SeedsInTwoForks)
    if materialize_first:
        materialize_module(first)
    torch.manual_seed(0)
    second = deferred_init(SeedsInTwoForks)  # a notebook cell run again
    materialize_module(second)
    materialize_module(first)
    assert_module_equals_eager("SeedsInTwoForks (first)", first, eager)
    assert_module_equals_eager("SeedsInTwoForks (second)", second, eager)


def test_the_submodules_of_a_reseeding_model_materialized_one_by_one_in_reverse_equal_eager(restore_rng) -> None:
    torch.manual_seed(0)
    eager = SeedsEachLayer()
    torch.manual_seed(0)
    model = deferred_init(SeedsEachLayer)
    for layer in [model.head, *reversed(model.layers)]:
        materialize_module(layer)
    materialize_module(model)
    assert_module_equals_eager("SeedsEachLayer", model, eager)


def test_a_layer_seeded_by_its_index_equals_that_seeds_eager_layer(restore_rng) -> None:
    model = deferred_init(SeedsEachLayer)
    torch.manual_seed(101)
    assert torch.equal(materialize_tensor(model.layers[1].weight), nn.Linear(4, 5).weight)


def test_draws_recorded_after_a_reseeding_construction_continue_as_eagers(restore_rng) -> None:
    torch.manual_seed(0)
    eager = SeedsEachLayer()
    nn.init.normal_(eager.head.weight)
    eager_next = RewindsBetweenLayers()
    torch.manual_seed(0)
    model = deferred_init(SeedsEachLayer)
    with deferred(model):
        nn.init.normal_(model.head.weight)  # starts where SeedsEachLayer left eager's generator
    following = deferred_init(RewindsBetweenLayers)  # a second model built after it
    materialize_module(following)
    materialize_module(model)
    assert_module_equals_eager("SeedsEachLayer", model, eager)
    assert_module_equals_eager("RewindsBetweenLayers", following, eager_next)


def test_torch_seed_after_draws_starts_the_next_draws_from_the_seed_it_chose(restore_rng) -> None:
    def build() -> nn.Module:
        layer = nn.Linear(2, 2)
        torch.seed()  # a fresh, unknowable seed: the real generator shows which
        return nn.Sequential(layer, nn.Linear(2, 2))

    torch.manual_seed(0)
    model = deferred_init(build)
    torch.manual_seed(torch.initial_seed())
    second = nn.Linear(2, 2)
    torch.manual_seed(0)
    first = nn.Linear(2, 2)
    materialize_module(model)
    assert torch.equal(model[0].weight, first.weight)
    assert torch.equal(model[1].weight, second.weight) and torch.equal(model[1].bias, second.bias)


def test_a_state_set_before_any_draw_moves_the_start_as_a_seed_does(restore_rng) -> None:
    state = torch.Generator().manual_seed(7).get_state()
    torch.manual_seed(0)
    eager = StartsFromAGivenState(state)
    torch.manual_seed(0)
    model = materialize_module(deferred_init(StartsFromAGivenState, state))
    assert torch.equal(model.a.weight, eager.a.weight)
    assert torch.equal(model.a.weight, StartsFromAGivenState(state).a.weight)


def test_reseeding_a_cuda_stream_that_has_draws_is_refused_naming_the_call(restore_rng) -> None:
    def build() -> nn.Module:
        layer = nn.Linear(2, 2, device="cuda")
        torch.manual_seed(5)
        return nn.Sequential(layer, nn.Linear(2, 2, device="cuda"))

    before = torch.get_rng_state()
    with pytest.raises(DeferredInitError) as caught:
        deferred_init(build)
    message = str(caught.value)
    assert message.startswith(f"torch.manual_seed(5) at {__file__}:"), message
    assert message.endswith(
        "reseeds the cuda:0 generator, after 2 random op(s) were recorded on it; replay follows a CUDA stream from "
        "its start only, so eager's numbers after the reseed could not be reproduced. Seed before deferred_init / "
        "the deferred block (or before the first CUDA random op)"
    ), message
    assert torch.manual_seed is torch.random.manual_seed and torch.manual_seed.__qualname__ == "manual_seed"
    torch.set_rng_state(before)


def test_a_seed_set_on_the_generator_object_itself_is_refused_at_the_end_of_the_recording(restore_rng) -> None:
    def build() -> nn.Module:
        first = nn.Linear(2, 2)
        torch.default_generator.manual_seed(5)  # a C method: unseen until the recording ends
        return nn.Sequential(first, nn.Linear(2, 2))

    with pytest.raises(DeferredInitError) as caught:
        deferred_init(build)
    assert str(caught.value) == (
        "the CPU generator's state was changed while recording by a call on the generator itself "
        "(torch.default_generator.manual_seed, .set_state or .seed), which the recording does not see, so replay "
        "could not reproduce eager's numbers. Call torch.manual_seed / torch.set_rng_state instead, or seed "
        "before deferred_init"
    )
    wrappers_left = [f for f in (torch.set_rng_state, torch.random.get_rng_state) if "seeding" in f.__qualname__]
    assert wrappers_left == []


class KeepsAndForksTheState(nn.Module):
    """Reads the generator mid-construction: keeps the state, and seeds a generator of its own from it."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        self.forked = nn.Parameter(torch.randn(4, generator=generator))
        self.register_buffer("state", torch.get_rng_state())
        self.after = nn.Linear(3, 3)


def test_the_generator_state_read_while_recording_is_eagers(restore_rng) -> None:
    torch.manual_seed(0)
    eager = KeepsAndForksTheState()
    torch.manual_seed(0)
    model = materialize_module(deferred_init(KeepsAndForksTheState))
    assert_module_equals_eager("KeepsAndForksTheState", model, eager)
    assert not torch.equal(model.state, torch.manual_seed(0).get_state())  # past `first`'s draws


def test_a_state_read_while_draws_were_owed_and_set_first_thing_in_a_constructor_owes_them(restore_rng) -> None:
    torch.manual_seed(0)
    nn.Linear(4, 4)
    eager = StartsFromAGivenState(torch.get_rng_state())
    torch.manual_seed(0)
    deferred_init(nn.Linear, 4, 4)  # its draws are owed: the real generator did not take them
    model = materialize_module(deferred_init(StartsFromAGivenState, torch.get_rng_state()))
    assert torch.equal(model.a.weight, eager.a.weight)


class _ReadsTheStateFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.get_rng_state())


def test_eager_draws_between_models_are_not_forgotten_by_a_model_that_draws_nothing(restore_rng) -> None:
    torch.manual_seed(0)
    nn.Linear(4, 4), torch.randn(20), nn.Identity()
    eager_state, eager_third = _ReadsTheStateFirst().state, nn.Linear(4, 4)
    torch.manual_seed(0)
    deferred_init(nn.Linear, 4, 4)
    torch.randn(20)  # eager draws between the models
    deferred_init(nn.Identity)  # draws nothing
    reads, third = deferred_init(_ReadsTheStateFirst), deferred_init(nn.Linear, 4, 4)
    assert torch.equal(materialize_module(reads).state, eager_state)
    assert torch.equal(materialize_module(third).weight, eager_third.weight)


def test_a_seed_set_on_the_generator_object_is_refused_even_when_a_wrapped_call_follows(restore_rng) -> None:
    def build() -> nn.Module:
        first = nn.Linear(3, 3)
        torch.default_generator.manual_seed(5)
        second = nn.Linear(3, 3)
        torch.manual_seed(6)  # a wrapped call after it must not hide it
        return nn.Sequential(first, second, nn.Linear(3, 3))

    with pytest.raises(DeferredInitError, match=r"^the CPU generator's state was changed while recording by a call"):
        deferred_init(build)


def test_the_state_read_in_a_surgery_block_is_eagers(restore_rng) -> None:
    torch.manual_seed(0)
    eager = nn.Linear(4, 4)
    eager.register_buffer("state", torch.get_rng_state())
    torch.manual_seed(0)
    model = deferred_init(nn.Linear, 4, 4)
    with deferred(model):
        model.register_buffer("state", torch.get_rng_state())
    materialize_module(model)
    assert torch.equal(model.state, eager.state)


def test_reading_the_generator_where_eagers_state_is_unknown_is_refused_naming_the_read(restore_rng) -> None:
    class Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.Parameter(torch.empty(5).normal_())  # reads the cached normal sample: count unknown

    class ForksAfterDraws(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(2, 2)
            with torch.random.fork_rng():
                self.b = nn.Linear(2, 2)

    torch.manual_seed(0)
    deferred_init(Small)
    torch.randn(20)  # eager draws while Small's draws are owed
    with pytest.raises(DeferredInitError) as caught:
        deferred_init(ForksAfterDraws)
    assert str(caught.value).startswith(f"torch.get_rng_state at {__file__}:"), str(caught.value)
    assert "reads the CPU generator, whose eager state there cannot be known: " in str(caught.value)
