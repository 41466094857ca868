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


def test_a_loaded_state_dict_changed_before_materializing_says_to_load_a_clone():
    state = {"weight": torch.ones(2, 2), "bias": torch.zeros(2)}
    module = deferred_init(nn.Linear, 2, 2)
    module.load_state_dict(state)  # read after construction: eager copies here and then
    state["weight"].mul_(3)
    with pytest.raises(MaterializationError) as error:
        materialize_module(module)
    assert str(error.value).endswith(
        "materialize before changing that tensor, or give the call that read it a clone (a state_dict "
        "loaded: {k: v.clone() for k, v in state.items()})"
    )
    assert "pass the constructor a clone" in _constructor_case_message()
    assert "; 'weight' cannot be materialized with its original value" in str(error.value)  # bias reads the other


def test_a_changed_external_tensor_is_refused_naming_only_the_tensors_that_read_it():
    state = {f"{i}.{kind}": torch.ones(2, 2) if kind == "weight" else torch.zeros(2) for i in range(3)
             for kind in ("weight", "bias")}
    module = deferred_init(lambda: nn.Sequential(*[nn.Linear(2, 2) for _ in range(3)]))
    module.load_state_dict(state)
    state["2.weight"].mul_(3)
    with pytest.raises(MaterializationError) as error:
        materialize_module(module)
    assert "); '2.weight' cannot be materialized with its original value: " in str(error.value)
    materialize_module(module[0])  # the others read nothing changed
    assert torch.equal(module[0].weight, torch.ones(2, 2))


def _constructor_case_message() -> str:
    table = torch.arange(4.0)
    module = deferred_init(FromOutside, table)
    table.add_(1)
    with pytest.raises(MaterializationError) as error:
        materialize_module(module)
    return str(error.value)


def test_inference_tensor_input_fails_with_a_clear_message():
    with torch.inference_mode():
        table = torch.arange(4.0)
    module = deferred_init(FromOutside, table)
    with pytest.raises(MaterializationError, match=r"read by aten\.mul\.Tensor .* is an inference tensor"):
        materialize_module(module)


class ReadsItsArguments(nn.Module):
    """Sizes a layer from values in tensors it is given (a common config-from-checkpoint pattern)."""

    def __init__(self, width: torch.Tensor, scales: torch.Tensor, inference: bool) -> None:
        super().__init__()
        with torch.inference_mode(inference):
            self.proj = nn.Linear(4, int(width.item()))
            self.scales_seen = scales.tolist()
            self.first_scale = width.tolist()
        self.register_buffer("scales", scales * 2)


@pytest.mark.parametrize("inference", [False, True], ids=["grad-mode", "inference-mode"])
def test_value_reads_of_real_tensors_from_outside_give_their_values(inference):
    # `.item()` of a real argument reached fake mode as `_local_scalar_dense` and was refused as
    # data-dependent; under inference mode `.tolist()` first resolved the conjugate bit through
    # fake mode, which handed back a storage-less fake for tolist to read (found by `make fuzz`).
    width, scales = torch.tensor(3), torch.tensor([0.5, 1.5])
    torch.manual_seed(0)
    eager = ReadsItsArguments(width, scales, inference)
    torch.manual_seed(0)
    module = deferred_init(ReadsItsArguments, width, scales, inference)
    assert (module.proj.out_features, module.scales_seen, module.first_scale) == (3, [0.5, 1.5], 3)
    materialize_module(module)
    assert torch.equal(module.proj.weight, eager.proj.weight)
    assert torch.equal(module.scales, torch.tensor([1.0, 3.0]))


def test_constants_from_numpy_views_materialize_in_eagers_layout():
    # eager's tensor is the constant itself: numpy's strides, offset and storage extent
    import numpy as np

    array = np.arange(12, dtype=np.float32).reshape(3, 4)

    class FromNumpy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transposed = nn.Buffer(torch.from_numpy(array.T))
            self.columns = nn.Buffer(torch.as_tensor(array[:, 1:3]))
            self.copied = nn.Buffer(torch.tensor(array.T))

    eager, module = FromNumpy(), materialize_module(deferred_init(FromNumpy))

    def layout(t: torch.Tensor) -> tuple:
        return t.shape, t.stride(), t.storage_offset(), t.untyped_storage().nbytes()

    for name in ("transposed", "columns", "copied"):
        assert layout(getattr(module, name)) == layout(getattr(eager, name)), name
        assert torch.equal(getattr(module, name), getattr(eager, name))
    assert layout(module.columns) == ((3, 2), (4, 1), 0, 40)
    assert module.transposed.data_ptr() != eager.transposed.data_ptr()  # a copy, not numpy's memory


class _CopiesFromScratchArrays(nn.Module):
    """Copies out of numpy memory that changes afterwards: a scratch array refilled in a loop, an
    array scaled after its copy was taken, and the caller's table."""

    def __init__(self, table: np.ndarray) -> None:
        super().__init__()
        scratch = np.zeros(4, dtype=np.float32)
        for i in range(3):
            scratch[:] = np.arange(4) * (i + 1)
            self.register_buffer(f"row{i}", torch.tensor(scratch))  # torch.tensor copies
        weights = np.ones((2, 2), dtype=np.float32)
        self.scale = nn.Parameter(torch.as_tensor(weights).clone())
        weights *= 100
        self.halves = nn.Buffer(torch.from_numpy(weights[0]).half())  # a dtype change copies too
        weights *= 2
        self.emb = nn.Embedding.from_pretrained(torch.tensor(table), freeze=False)


def test_copies_of_numpy_memory_hold_the_values_the_array_had_when_the_constructor_copied_it():
    table = np.ones((3, 2), dtype=np.float32)
    eager, module = _CopiesFromScratchArrays(table), deferred_init(_CopiesFromScratchArrays, table)
    table[:] = 0  # the caller reuses its array before materializing
    materialize_module(module)
    assert [module.row0.tolist(), module.row2.tolist()] == [[0, 1, 2, 3], [0, 3, 6, 9]]
    assert module.halves.tolist() == [100, 100] and module.emb.weight.tolist() == [[1, 1]] * 3
    for name, tensor in eager.state_dict().items():
        assert torch.equal(module.state_dict()[name], tensor), name


def test_a_callers_conjugate_or_negative_view_is_read_with_its_bit():
    conjugate = torch.randn(3, dtype=torch.complex64).conj()  # the conjugate bit: read as conj(memory)
    negative = torch._neg_view(torch.randn(3))

    class Reads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("c", conjugate * 1)
            self.register_buffer("n", negative + 0)
            self.first = conjugate[0].item()

    eager = Reads()
    model = deferred_init(Reads)
    assert model.first == eager.first
    materialize_module(model)
    assert torch.equal(model.c, eager.c) and torch.equal(model.n, eager.n)


def test_resizing_as_a_callers_tensor_takes_its_shape():
    template = torch.randn(2, 3)

    class Resized(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("o", torch.arange(6.0).resize_as_(template))

    eager = Resized()
    model = materialize_module(deferred_init(Resized))
    assert model.o.shape == eager.o.shape == (2, 3) and torch.equal(model.o, eager.o)
