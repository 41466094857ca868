"""Real tensors from outside the constructor are used by reference and checked before replay."""

import numpy as np
import pytest
import torch
from torch import nn

from explorer import MaterializationError, deferred_init, materialize_module


class FromOutside(nn.Module):
    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scaled", table * 2)
        self.register_buffer("constant", torch.tensor([1.0, 2.0]))
        self.register_buffer("numpy_backed", torch.from_numpy(np.arange(3.0)) + 1)


def test_external_tensors_are_used_by_reference():
    table = torch.arange(4.0)
    module = materialize_module(deferred_init(FromOutside, table))
    assert torch.equal(module.scaled, torch.arange(4.0) * 2)
    assert torch.equal(module.constant, torch.tensor([1.0, 2.0]))
    assert torch.equal(module.numpy_backed, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))


def test_external_tensor_modified_after_deferred_init_fails_naming_tensor_and_op():
    table = torch.arange(4.0)
    module = deferred_init(FromOutside, table)
    table.add_(1)
    with pytest.raises(MaterializationError) as error:
        materialize_module(module)
    message = str(error.value)
    assert "external tensor float32[4] on cpu read by aten.mul.Tensor at" in message
    assert "test_external_tensors.py" in message
    assert "modified in place after deferred_init (version 0, now 1)" in message
    assert "'scaled'" in message
    assert module.scaled.__class__.__name__ == "DeferredTensor"  # nothing changed


def test_inference_tensor_input_fails_with_a_clear_message():
    with torch.inference_mode():
        table = torch.arange(4.0)
    module = deferred_init(FromOutside, table)
    with pytest.raises(MaterializationError, match=r"read by aten\.mul\.Tensor .* is an inference tensor"):
        materialize_module(module)
