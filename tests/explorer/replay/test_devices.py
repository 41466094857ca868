"""device= at materialization: meta, maps, absent and unknown devices."""

import pytest
import torch
from torch import nn

from explorer import MaterializationError, deferred_init, is_deferred, materialize_module, materialize_tensor


def test_meta_device_gives_shapes_only():
    module = materialize_module(deferred_init(nn.Linear, 4, 3), device="meta")
    assert module.weight.is_meta and module.weight.shape == (3, 4)
    assert isinstance(module.weight, nn.Parameter) and not is_deferred(module)


def test_cuda_recorded_module_materializes_on_cpu_through_a_map():
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("steps", torch.arange(6, device="cuda").view(2, 3) * 2)

    module = materialize_module(deferred_init(Counter), device={"cuda": "cpu"})
    assert module.steps.device == torch.device("cpu")
    assert torch.equal(module.steps, torch.arange(6).view(2, 3) * 2)
    assert module.steps.stride() == (3, 1)


def test_moving_to_another_device_keeps_views_sharing_storage():
    class Viewed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            base = torch.arange(6.0)
            self.register_buffer("base", base)
            self.register_buffer("tail", base[3:])

    module = materialize_module(deferred_init(Viewed), device="meta")
    assert module.tail.storage_offset() == 3
    module = materialize_module(deferred_init(Viewed), device={"cpu": "cpu"})
    assert module.tail.untyped_storage().data_ptr() == module.base.untyped_storage().data_ptr()


def test_eager_rng_on_absent_cuda_fails_with_a_clear_message():
    module = deferred_init(nn.Linear, 4, 3, device="cuda")
    with pytest.raises(MaterializationError, match=r"rng='eager' draws aten\.uniform_\.default .* from the cuda:0 "
                       r"generator.*use rng='fast'"):
        materialize_module(module, device="cpu")
    assert is_deferred(module.weight) and is_deferred(module.bias)
    materialize_module(module, device="cpu", rng="fast")
    assert module.weight.device == torch.device("cpu")


def test_materializing_onto_an_absent_recorded_device_names_the_tensor():
    module = deferred_init(nn.Linear, 4, 3, device="cuda")
    with pytest.raises(MaterializationError, match=r"'weight' was recorded on cuda:0 .* not available"):
        materialize_module(module, rng="fast")


def test_unknown_device_string_is_rejected_before_anything_runs():
    module = deferred_init(nn.Linear, 4, 3)
    with pytest.raises(MaterializationError, match=r"unknown device 'gpu0'"):
        materialize_module(module, device="gpu0")
    assert is_deferred(module)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_absent_target_device_is_rejected():
    with pytest.raises(MaterializationError, match=r"cannot materialize onto cuda:1: device cuda:1 is not available"):
        materialize_tensor(deferred_init(nn.Linear, 2, 2).weight, device="cuda:1")


def test_unknown_rng_mode_is_rejected():
    with pytest.raises(MaterializationError, match=r"rng must be one of \('eager', 'fast'\), got 'exact'"):
        materialize_tensor(deferred_init(nn.Linear, 2, 2).weight, rng="exact")


def test_a_tensor_recorded_on_meta_asked_for_on_a_device_is_refused_naming_it():
    with torch.device("meta"):
        module = deferred_init(nn.Linear, 4, 3)
    for device in ("cpu", {"meta": "cpu"}):
        with pytest.raises(
            MaterializationError,
            match=r"^'weight' was recorded on the meta device .* so there are none to put on cpu: materialize it "
            r"with device='meta'",
        ):
            materialize_module(module, device=device)
        assert is_deferred(module.weight) and is_deferred(module.bias)
    materialize_module(module, device="meta")
    assert module.weight.is_meta and module.weight.shape == (3, 4)
