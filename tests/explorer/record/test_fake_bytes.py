"""Foreign code asking a deferred tensor for its bytes — `data_ptr()`, its storage's items, `numpy()`,
`np.asarray`, DLPack, pickling, `safetensors` saving — gets `NoDataError` naming the tensor, the call
and where it was asked, and saying to materialize first; inside `deferred_init` those calls keep
what they did, and outside a refused call changes nothing."""

from __future__ import annotations

import inspect
import io
import pickle
from typing import Callable

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from torch import nn

from explorer import DeferredInitError, deferred_init, materialize_module
from explorer.errors import NoDataError
from explorer.record.fake import handle_of

MATERIALIZE_FIRST = ("Materialize first: explorer.materialize_module(module) for the whole module, or "
                     "explorer.materialize_tensor(tensor) for one tensor")


def linear_and_norm() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))


def refusal(ask: Callable[[], object]) -> NoDataError:
    """The NoDataError `ask` raises (it must raise one)."""
    with pytest.raises(NoDataError) as caught:
        ask()
    return caught.value


def asked_at(*asks: Callable) -> str:
    """Where the message says the innermost of `asks` (one-line lambdas of this file, outermost
    first; builtins and library functions are passed over) asked."""
    ours = [ask for ask in asks if inspect.isfunction(ask) and ask.__code__.co_filename == __file__]
    return f"Asked at {__file__}:{ours[-1].__code__.co_firstlineno} in <lambda>"


def expected(call: str, name: str, where: str) -> str:
    return f"{call} needs the bytes of {name}, which is deferred (fake) and has no data yet. {MATERIALIZE_FIRST}. {where}"


WEIGHT = "parameter '0.weight' (shape (4, 3), float32)"
WEIGHT_STORAGE = "the storage of parameter '0.weight' (48 B)"


def test_data_ptr_outside_deferred_init_names_the_parameter_and_says_materialize_first():
    module = deferred_init(linear_and_norm)
    ask = lambda: module[0].weight.data_ptr()  # noqa: E731
    error = refusal(ask)
    assert str(error) == expected("Tensor.data_ptr()", WEIGHT, asked_at(ask))
    assert isinstance(error, DeferredInitError) and isinstance(error, RuntimeError)
    assert error.call == "Tensor.data_ptr()"
    assert error.graph is handle_of(module[0].weight).graph


def test_a_buffer_is_named_as_a_buffer():
    module = deferred_init(linear_and_norm)
    ask = lambda: module[1].running_mean.data_ptr()  # noqa: E731
    assert str(refusal(ask)) == expected(
        "Tensor.data_ptr()", "buffer '1.running_mean' (shape (4,), float32)", asked_at(ask))


def test_a_tensor_outside_the_module_is_named_by_shape_and_dtype():
    module = deferred_init(linear_and_norm)
    doubled = module[0].weight * 2
    ask = lambda: doubled.data_ptr()  # noqa: E731
    assert str(refusal(ask)) == expected(
        "Tensor.data_ptr()", "a deferred tensor (shape (4, 3), float32)", asked_at(ask))


def test_untyped_storage_data_ptr_names_the_parameter_owning_the_storage():
    module = deferred_init(linear_and_norm)
    ask = lambda: module[0].weight.untyped_storage().data_ptr()  # noqa: E731
    assert str(refusal(ask)) == expected("UntypedStorage.data_ptr()", WEIGHT_STORAGE, asked_at(ask))


def test_a_views_storage_is_named_after_the_parameter_it_views():
    module = deferred_init(linear_and_norm)
    row = module[0].weight[1]
    ask = lambda: row.untyped_storage().data_ptr()  # noqa: E731
    assert str(refusal(ask)) == expected("UntypedStorage.data_ptr()", WEIGHT_STORAGE, asked_at(ask))


def test_a_storage_no_parameter_uses_is_named_by_its_size():
    module = deferred_init(linear_and_norm)
    doubled = module[0].weight * 2
    ask = lambda: doubled.untyped_storage().data_ptr()  # noqa: E731
    assert str(refusal(ask)) == expected("UntypedStorage.data_ptr()", "a deferred storage (48 B)", asked_at(ask))


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_typed_storage_data_ptr_is_refused_through_its_untyped_storage():
    module = deferred_init(linear_and_norm)
    ask = lambda: module[0].weight.storage().data_ptr()  # noqa: E731
    assert str(refusal(ask)) == expected("UntypedStorage.data_ptr()", WEIGHT_STORAGE, asked_at(ask))


@pytest.mark.parametrize(("call", "read"), [
    ("iterating an UntypedStorage (bytes(storage), list(storage))", bytes),
    ("iterating an UntypedStorage (bytes(storage), list(storage))", list),
    ("UntypedStorage.__getitem__", lambda storage: storage[0]),
    ("UntypedStorage.tolist()", lambda storage: storage.tolist()),
    ("UntypedStorage.cpu()", lambda storage: storage.cpu()),
    ("pickling an UntypedStorage (pickle, torch.save)", pickle.dumps),
    ("pickling an UntypedStorage (pickle, torch.save)", lambda storage: torch.save(storage, io.BytesIO())),
])
def test_reading_a_deferred_storage_names_the_storage_and_the_call(call, read):
    module = deferred_init(linear_and_norm)
    ask = lambda: read(module[0].weight.untyped_storage())  # noqa: E731
    assert str(refusal(ask)) == expected(call, WEIGHT_STORAGE, asked_at(ask, read))


ALIAS = "an alias of " + WEIGHT


@pytest.mark.parametrize(("call", "name", "read"), [
    ("Tensor.numpy()", WEIGHT, lambda tensor: tensor.numpy()),
    ("Tensor.numpy()", ALIAS, lambda tensor: tensor.detach().numpy(force=True)),
    ("numpy.asarray(tensor) (Tensor.__array__)", WEIGHT, np.asarray),
    ("numpy.asarray(tensor) (Tensor.__array__)", WEIGHT, np.array),
    ("numpy.asarray(tensor) (Tensor.__array__)", WEIGHT, lambda tensor: np.asarray(tensor, dtype=np.float64)),
    ("Tensor.__dlpack__() (from_dlpack)", WEIGHT, lambda tensor: tensor.__dlpack__()),
    ("Tensor.__dlpack__() (from_dlpack)", ALIAS, lambda tensor: np.from_dlpack(tensor.detach())),
    ("Tensor.__dlpack__() (from_dlpack)", ALIAS, lambda tensor: torch.from_dlpack(tensor.detach())),
])
def test_numpy_and_dlpack_outside_deferred_init_name_the_tensor_and_the_call(call, name, read):
    module = deferred_init(linear_and_norm)
    ask = lambda: read(module[0].weight)  # noqa: E731
    assert str(refusal(ask)) == expected(call, name, asked_at(ask, read))


def _safetensors_storage_ptr_fallback() -> str:
    """Where safetensors asks (its storage_ptr's fallback `tensor.storage().data_ptr()`; the first
    try, `untyped_storage().data_ptr()`, is refused too, but it swallows every error there)."""
    source, first = inspect.getsourcelines(safetensors.torch.storage_ptr)
    offset = next(i for i, line in enumerate(source) if "tensor.storage().data_ptr()" in line)
    return f"Asked at {safetensors.torch.__file__}:{first + offset} in storage_ptr"


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("save", [
    lambda module, path: safetensors.torch.save_file(module.state_dict(), path),
    lambda module, path: safetensors.torch.save(module.state_dict()),
    lambda module, path: safetensors.torch.save_model(module, path),
], ids=["save_file", "save", "save_model"])
def test_safetensors_save_file_on_a_deferred_state_dict_says_materialize_first(save, tmp_path):
    module = deferred_init(linear_and_norm)
    error = refusal(lambda: save(module, str(tmp_path / "model.safetensors")))
    assert str(error) == expected("UntypedStorage.data_ptr()", WEIGHT_STORAGE, _safetensors_storage_ptr_fallback())
    assert not (tmp_path / "model.safetensors").exists()


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_transformers_save_pretrained_of_a_deferred_model_says_materialize_first(tmp_path):
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    module = deferred_init(transformers.LlamaForCausalLM, config)
    error = refusal(lambda: module.save_pretrained(tmp_path, safe_serialization=True))
    assert str(error) == expected("UntypedStorage.data_ptr()",
                                  "the storage of parameter 'model.embed_tokens.weight' (12.5 KiB)",
                                  _safetensors_storage_ptr_fallback())


def test_torch_save_of_a_deferred_state_dict_names_the_parameter_behind_the_alias():
    module = deferred_init(linear_and_norm)
    with pytest.raises(TypeError) as caught:
        torch.save(module.state_dict(), io.BytesIO())
    assert str(caught.value) == (
        f"cannot pickle an alias of {WEIGHT}: it is a deferred (fake) tensor with no data. Materialize first "
        "(explorer.materialize_module(module), then torch.save / pickle), or pickle the recipe (the module class "
        "and its arguments) and call deferred_init again where you load it"
    )


def test_a_refused_read_records_nothing_and_the_module_materializes_as_eager(restore_rng):
    torch.manual_seed(3)
    eager = linear_and_norm()
    torch.manual_seed(3)
    module = deferred_init(linear_and_norm)
    weight = module[0].weight
    graph = handle_of(weight).graph
    ops = len(graph.ops)
    for ask in (weight.data_ptr, weight.numpy, weight.__dlpack__, lambda: np.asarray(weight),
                lambda: weight.untyped_storage().data_ptr(), lambda: bytes(weight.untyped_storage())):
        refusal(ask)
    assert len(graph.ops) == ops
    assert module[0].weight is weight and handle_of(weight).tensor_id == handle_of(module[0].weight).tensor_id
    materialize_module(module)
    for name, value in eager.state_dict().items():
        assert torch.equal(module.state_dict()[name], value), name
    assert module[0].weight.data_ptr() != 0  # real now: bytes are there to ask for


def test_values_read_after_deferred_init_are_still_answered(restore_rng):
    torch.manual_seed(4)
    eager = linear_and_norm()
    torch.manual_seed(4)
    module = deferred_init(linear_and_norm)
    assert module[0].weight.tolist() == eager[0].weight.tolist()
    assert module[1].num_batches_tracked.item() == 0


class AsksForBytesWhileBuilding(nn.Module):
    """Constructor code that asks pointers (tying checks compare them) and reads small values through numpy."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 4)
        self.pointer = self.proj.weight.data_ptr()
        self.storage_pointer = self.proj.weight.untyped_storage().data_ptr()
        self.table = np.asarray(torch.arange(4))
        self.doubled = (torch.arange(3) * 2).numpy()


def test_inside_deferred_init_pointers_are_the_storages_own_and_numpy_reads_true_values():
    module = deferred_init(AsksForBytesWhileBuilding)
    assert module.pointer == module.storage_pointer != 0
    assert module.table.tolist() == [0, 1, 2, 3]
    assert module.doubled.tolist() == [0, 2, 4]


def test_share_memory_of_a_deferred_model_names_the_first_tensor_and_changes_nothing():
    # before: PyTorch's "_share_fd_: only available on CPU", naming no tensor, on a CPU fake
    module = deferred_init(linear_and_norm)
    ask = lambda: module.share_memory()  # noqa: E731
    assert str(refusal(ask)) == expected("Tensor.share_memory_() (Module.share_memory)", WEIGHT, asked_at(ask))
    assert all(handle_of(t) is not None for t in module.state_dict().values())


def test_share_memory_inside_a_deferred_block_leaves_the_values_to_replay(restore_rng):
    from explorer import deferred

    torch.manual_seed(0)
    eager = linear_and_norm().share_memory()
    torch.manual_seed(0)
    module = deferred_init(linear_and_norm)
    with deferred(module):
        module.share_memory()
    materialize_module(module)
    assert all(torch.equal(module.state_dict()[n], v) for n, v in eager.state_dict().items())


class _LogsItsBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        total = self.lin.bias.sum()
        self.label = f"bias sum {total:.4f} ({total})"


def test_formatting_a_0d_tensor_in_a_constructor_gives_eagers_text_and_after_it_needs_data():
    torch.manual_seed(0)
    eager = _LogsItsBias()
    torch.manual_seed(0)
    model = deferred_init(_LogsItsBias)
    assert model.label == eager.label
    with pytest.raises(NoDataError, match=r"^format\(tensor, '\.3f'\) needs the bytes of a deferred tensor"):
        f"{model.lin.bias.sum():.3f}"
    assert f"{model.lin.bias.sum()}".endswith("fake=True)")


class _TensorOfTensors(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        first, second = torch.tensor(1.0), torch.randn(())
        self.register_buffer("pair", torch.tensor([first, second]))  # C++ reads both values


def test_a_read_of_fake_values_in_cpp_names_the_line_and_what_works_instead():
    _TensorOfTensors()  # eager reads the values
    with pytest.raises(DeferredInitError) as caught:
        deferred_init(_TensorOfTensors)
    line = inspect.getsourcelines(_TensorOfTensors.__init__)[1] + 3
    assert str(caught.value).startswith(
        f"{__file__}:{line} in __init__: a PyTorch function read the values of a deferred (fake) tensor in C++"
    )
    assert "`torch.stack([t0, t1])` for `torch.tensor([t0, t1])`" in str(caught.value)
    assert isinstance(caught.value, RuntimeError) and caught.value.partial_module is not None


class _TiesByAddress(nn.Module):
    """Finds shared memory by address, as tie finders do, and keeps what it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.dec = nn.Linear(3, 3), nn.Linear(3, 3)
        self.table = nn.Parameter(torch.zeros(4, 3))
        self.rows = self.table[1:]  # a view: same storage, offset by one row
        self.empty = torch.zeros(0)
        self.seen = {
            "distinct weights": self.enc.weight.data_ptr() != self.dec.weight.data_ptr(),
            "storages": len({p.untyped_storage().data_ptr() for p in self.parameters()}),
            "view offset": self.rows.data_ptr() - self.table.data_ptr(),
            "same storage": self.rows.untyped_storage().data_ptr() == self.table.untyped_storage().data_ptr(),
            "empty": self.empty.data_ptr(),
        }


def test_addresses_inside_a_recording_tell_storages_apart_and_offset_views_as_eager():
    eager = _TiesByAddress()
    module = deferred_init(_TiesByAddress)
    assert module.seen == eager.seen == {
        "distinct weights": True, "storages": 5, "view offset": 12, "same storage": True, "empty": 0,
    }


def test_an_array_of_a_deferred_tensor_read_while_recording_refuses_writes_that_would_be_lost():
    def build() -> nn.Module:
        module = nn.Embedding(3, 2)
        module.weight.data.numpy()[0] = 0  # eager: writes row 0 of the weight
        return module

    build()  # eager takes it
    with pytest.raises(ValueError, match="read-only"):
        deferred_init(build)
