"""Fixtures every test gets."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def seeded_generator() -> None:
    """Each test starts from `torch.manual_seed(0)`: its random numbers do not depend on which tests
    ran before, and no deferred draws are owed from their models (a reseed clears what the real
    generator owes eager; see note [Eager's generator after construction])."""
    torch.manual_seed(0)
