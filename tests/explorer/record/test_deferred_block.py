"""`with explorer.deferred():` — ordinary code, every module and tensor built inside is deferred."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import explorer
from explorer import DeferredInitError, deferred, deferred_roots, is_deferred, is_fake, materialize_module
from tests.support.parity import assert_module_equals_eager

ORIGINAL_MODULE_INIT = nn.Module.__init__


def build_three():
    first = nn.Linear(4, 3)
    second = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    noise = torch.randn(5)
    return first, second, noise


def test_modules_built_in_the_block_are_deferred_and_those_outside_are_not(restore_rng):
    torch.manual_seed(0)
    before = nn.Linear(2, 2)
    state = torch.get_rng_state()
    with deferred() as block:
        first, second, noise = build_three()
        relu = nn.ReLU()
    assert torch.equal(torch.get_rng_state(), state), "the block advanced the global RNG"
    after = nn.Linear(2, 2)
    assert is_deferred(first) and is_deferred(second) and is_fake(noise)
    assert not is_deferred(before) and not is_deferred(after) and not is_fake(after.weight)
    assert block.modules == [first, second]  # top level, holding deferred tensors, in order
    assert relu not in block.modules and nn.Module.__init__ is ORIGINAL_MODULE_INIT
    assert first in deferred_roots() and second in deferred_roots()


def test_each_module_materializes_on_its_own_with_eager_values(restore_rng):
    torch.manual_seed(7)
    eager_first, eager_second, eager_noise = build_three()
    torch.manual_seed(7)
    with deferred():
        first, second, noise = build_three()
    del first  # the recording second needs does not depend on the other module
    materialize_module(second)
    assert_module_equals_eager("second", second, eager_second)
    assert torch.equal(explorer.materialize_tensor(noise), eager_noise)


def test_a_failing_block_restores_everything_and_keeps_the_partial_graph():
    with pytest.raises(ValueError, match="config says no") as error:
        with deferred():
            nn.Linear(2, 2)
            raise ValueError("config says no")
    assert len(error.value.deferred_graph.ops) > 0
    assert _get_current_dispatch_mode_stack() == [] and nn.Module.__init__ is ORIGINAL_MODULE_INIT
    assert not is_fake(torch.ones(2)) and torch.ones(2).sum().item() == 2.0


def test_blocks_do_not_nest():
    with pytest.raises(DeferredInitError, match="explorer.deferred cannot be nested"):
        with deferred():
            with deferred():
                pass
    with pytest.raises(DeferredInitError, match="deferred_init cannot be nested"):
        with deferred():
            explorer.deferred_init(nn.Linear, 2, 2)


def test_seeding_before_the_first_random_op_moves_the_start_and_later_splits_the_stream(restore_rng):
    with deferred():
        torch.manual_seed(3)  # a %%deferred cell that starts by seeding
        seeded = nn.Linear(4, 3)
    materialize_module(seeded)
    torch.manual_seed(3)
    assert_module_equals_eager("seeded", seeded, nn.Linear(4, 3))
    torch.manual_seed(11)
    with deferred():
        first = nn.Linear(4, 3)
        torch.manual_seed(5)  # a cell that seeds again between two layers
        second = nn.Linear(4, 3)
    materialize_module(second)
    materialize_module(first)
    torch.manual_seed(11)
    assert_module_equals_eager("first", first, nn.Linear(4, 3))
    torch.manual_seed(5)
    assert_module_equals_eager("second", second, nn.Linear(4, 3))
    assert torch.manual_seed is torch.random.manual_seed and torch.manual_seed.__name__ == "manual_seed"
    assert torch.manual_seed.__qualname__ == "manual_seed"  # the original function is back
