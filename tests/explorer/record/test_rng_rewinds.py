"""Rewinding the CPU generator inside a recording (note [Rewinding the generator while recording]
in explorer/record/seeding.py): refused once something was drawn, as eager's numbers would repeat."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explorer import DeferredInitError, deferred_init, materialize_module


class RewindsBetweenLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        state = torch.get_rng_state()
        self.a = nn.Linear(3, 3)
        torch.set_rng_state(state)  # eager: b draws a's numbers again
        self.b = nn.Linear(3, 3)


class ForksAroundALayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng():
            self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)


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


@pytest.mark.parametrize("module", [RewindsBetweenLayers, ForksAroundALayer])
def test_a_rewind_after_draws_is_refused_naming_the_draws(module, restore_rng) -> None:
    before = torch.get_rng_state()
    with pytest.raises(DeferredInitError) as caught:
        deferred_init(module)
    assert str(caught.value).startswith(
        "torch.set_rng_state was called while recording, 2 random op(s) after that state was read. It rewinds "
        "the generator (torch.random.fork_rng does so on exit), which replay does not model"
    )
    assert torch.equal(torch.get_rng_state(), before)
    wrappers_left = [f for f in (torch.set_rng_state, torch.random.get_rng_state) if "seeding" in f.__qualname__]
    assert wrappers_left == []


def test_a_restore_with_nothing_drawn_since_the_read_matches_eager(restore_rng) -> None:
    torch.manual_seed(0)
    eager = ReadsAndRestoresWithNothingBetween()
    torch.manual_seed(0)
    model = materialize_module(deferred_init(ReadsAndRestoresWithNothingBetween))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), eager.state_dict().values()))


def test_a_state_set_before_any_draw_moves_the_start_as_a_seed_does(restore_rng) -> None:
    state = torch.Generator().manual_seed(7).get_state()
    torch.manual_seed(0)
    eager = StartsFromAGivenState(state)
    torch.manual_seed(0)
    model = materialize_module(deferred_init(StartsFromAGivenState, state))
    assert torch.equal(model.a.weight, eager.a.weight)
    assert torch.equal(model.a.weight, StartsFromAGivenState(state).a.weight)


def test_torch_seed_after_draws_is_refused(restore_rng) -> None:
    def build() -> nn.Module:
        layer = nn.Linear(2, 2)
        torch.seed()
        return layer

    with pytest.raises(DeferredInitError, match=r"^torch\.seed\(\) was called while recording, after 2 random ops"):
        deferred_init(build)


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
        "could not reproduce eager's numbers. Call torch.manual_seed / torch.set_rng_state instead (before the "
        "first random op), or seed before deferred_init"
    )
