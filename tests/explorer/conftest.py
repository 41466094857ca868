"""Fixtures shared by the engine tests (helpers that are not fixtures live in tests/support/)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def restore_rng():
    """The CPU generator state is put back after the test, whatever the test did to it."""
    state = torch.get_rng_state()
    yield state
    torch.set_rng_state(state)
