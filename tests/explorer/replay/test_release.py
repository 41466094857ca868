"""release_module: materialized tensors go back to the very fakes they replaced, their memory is
returned, and materializing again gives eager's bytes, in any order of partial releases."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import explorer
from explorer import (
    MaterializationError, ReleaseError, deferred_init, inspect, is_deferred, materialize_module, materialize_tensor,
    release_module,
)
from tests.support.parity import assert_module_equals_eager, same_bits, slots, tie_groups

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]


def fakes_of(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every name with its tensor, kept so identity can be compared after a release."""
    return slots(module)


def assert_same_objects(module: nn.Module, before: list[tuple[str, torch.Tensor]]) -> None:
    after = slots(module)
    assert [name for name, _ in after] == [name for name, _ in before]
    for (name, got), (_, want) in zip(after, before):
        assert got is want, f"{name} is not the fake it held before materialization"


def build_pair(builder, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    eager = builder()
    torch.manual_seed(seed)
    return eager, deferred_init(builder)


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.Linear(4, 3))


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


class ViewOfParameter(nn.Module):
    """A buffer in another submodule that views a row of a parameter (one storage)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.probe = nn.Module()
        self.probe.register_buffer("row", self.linear.weight.detach()[1])


# -- bytes and identity -------------------------------------------------------------------------

@pytest.mark.parametrize("builder", [mlp, Tied, ViewOfParameter], ids=["sequential", "tied", "buffer_views_parameter"])
def test_release_restores_the_same_fakes_and_materializing_again_gives_eager_bytes(builder):
    eager, module = build_pair(builder)
    fakes = fakes_of(module)
    materialize_module(module)
    assert release_module(module) is module
    assert_same_objects(module, fakes)
    assert is_deferred(module)
    assert set(inspect(module).tensors["state"]) == {"fake"}
    materialize_module(module)
    assert_module_equals_eager(builder.__name__, module, eager)


def test_released_tie_is_one_fake_under_both_names():
    _, module = build_pair(Tied)
    fake = module.embed.weight
    release_module(materialize_module(module))
    assert module.head.weight is fake and module.embed.weight is fake


def test_buffer_view_shares_the_parameter_storage_after_rematerializing():
    _, module = build_pair(ViewOfParameter)
    release_module(materialize_module(module))
    materialize_module(module)
    weight, row = module.linear.weight, module.probe.row
    assert row.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    assert row.storage_offset() == 4


def test_releasing_the_parameter_alone_keeps_its_view_buffer_on_the_same_memory():
    eager, module = build_pair(ViewOfParameter)
    materialize_module(module)
    row = module.probe.row
    release_module(module, check_fn=lambda sub: sub is module.linear)
    assert is_deferred(module.linear.weight) and module.probe.row is row
    materialize_module(module)
    assert module.probe.row is row
    assert row.untyped_storage().data_ptr() == module.linear.weight.untyped_storage().data_ptr()
    assert_module_equals_eager("view kept", module, eager)


def test_release_one_layer_then_materialize_all_gives_eager_bytes_and_keeps_the_others():
    eager, module = build_pair(mlp)
    fake = module[2].weight
    materialize_module(module)
    kept = [module[0].weight, module[3].weight]
    release_module(module[2])
    assert module[2].weight is fake
    assert is_deferred(module[2]) and not is_deferred(module[0]) and not is_deferred(module[3])
    materialize_module(module)
    assert module[0].weight is kept[0] and module[3].weight is kept[1]
    assert_module_equals_eager("layer 2 released", module, eager)


def test_partial_orders_of_release_and_materialization_give_eager_bytes():
    eager, module = build_pair(mlp)
    materialize_module(module[3])
    release_module(module)
    materialize_module(module[0])
    materialize_module(module[2])
    release_module(module[0])
    materialize_module(module)
    assert_module_equals_eager("mixed order", module, eager)


def test_releasing_one_name_of_a_tie_chosen_by_check_fn_releases_both_and_keeps_the_tie():
    eager, module = build_pair(Tied)
    materialize_module(module)
    release_module(module, check_fn=lambda sub: sub is module.head)
    assert is_deferred(module.head.weight) and module.embed.weight is module.head.weight  # one tensor, as eager's
    materialize_module(module)
    assert module.head.weight is module.embed.weight
    assert tie_groups(slots(module)) == tie_groups(slots(eager))


def test_released_tensor_still_held_elsewhere_is_not_handed_back():
    eager, module = build_pair(mlp)
    materialize_module(module)
    held = module[0].weight
    release_module(module)
    with torch.no_grad():
        held.zero_()  # the user's copy; the module materializes anew
    materialize_module(module)
    assert module[0].weight is not held
    assert same_bits(module[0].weight, eager[0].weight)


def test_materialize_tensor_assigned_by_the_user_is_released_too():
    _, module = build_pair(mlp)
    fake = module[0].weight
    module[0].weight = materialize_tensor(fake)
    release_module(module)
    assert module[0].weight is fake


def test_transformers_llama_releases_and_rematerializes_bit_for_bit():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(config)
    torch.manual_seed(0)
    module = deferred_init(transformers.LlamaForCausalLM, config)
    fakes = fakes_of(module)
    materialize_module(module)
    release_module(module.model.layers[1])
    materialize_module(module)
    release_module(module)
    assert_same_objects(module, fakes)
    assert set(inspect(module).tensors["state"]) == {"fake"}
    materialize_module(module)
    assert_module_equals_eager("llama", module, eager)


def test_checkpoint_backed_tensors_go_back_to_disk_and_read_the_same_bytes_again(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    torch.manual_seed(1)
    saved = nn.Linear(6, 5)
    safetensors.save_file(saved.state_dict(), tmp_path / "linear.safetensors")
    module = deferred_init(nn.Linear, 6, 5)
    explorer.load_checkpoint(module, tmp_path / "linear.safetensors")
    fakes = fakes_of(module)
    materialize_module(module)
    weight = weakref.ref(module.weight)
    release_module(module)
    gc.collect()
    assert weight() is None
    assert_same_objects(module, fakes)
    materialize_module(module)
    assert same_bits(module.weight, saved.weight) and same_bits(module.bias, saved.bias)


# -- what is left alone -------------------------------------------------------------------------

def test_eager_and_user_assigned_tensors_are_left_alone():
    _, module = build_pair(mlp)
    materialize_module(module)
    mine = nn.Parameter(torch.ones(5, 6))
    module[0].weight = mine
    eager_layer = module[3] = nn.Linear(4, 3)
    release_module(module)
    assert module[0].weight is mine
    assert module[3].weight is eager_layer.weight and module[3].bias is eager_layer.bias
    assert is_deferred(module[0].bias) and is_deferred(module[2].weight)


def test_releasing_a_deferred_or_released_module_changes_nothing():
    _, module = build_pair(mlp)
    fakes = fakes_of(module)
    release_module(module)
    assert_same_objects(module, fakes)
    materialize_module(module)
    release_module(module)
    release_module(module)
    assert_same_objects(module, fakes)


# -- memory -------------------------------------------------------------------------------------

def test_released_tensor_is_freed():
    _, module = build_pair(Tied)
    materialize_module(module)
    weight = weakref.ref(module.embed.weight)
    release_module(module)
    gc.collect()
    assert weight() is None


# Run in a fresh process: in one that already holds gigabytes from earlier tests, the allocator
# may serve the 200 MB from pages it still has resident, and RSS then shows less than the tensor.
_RELEASE_PROBE = """
import ctypes, gc, json
import psutil
from torch import nn
from explorer import deferred_init, materialize_module, release_module

def rss():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return psutil.Process().memory_info().rss

module = deferred_init(nn.Linear, 8192, 6400)
before = rss()
materialize_module(module)
materialized = rss()
release_module(module)
released = rss()
print(json.dumps({"grown": materialized - before, "left": released - before}))
"""


def test_releasing_a_200_mb_module_returns_its_memory():
    probe = subprocess.run(
        [sys.executable, "-c", _RELEASE_PROBE], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    measured = json.loads(probe.stdout.strip().splitlines()[-1])
    size = (8192 * 6400 + 6400) * 4
    assert measured["grown"] > size - 30 * MIB, f"{measured['grown'] / MIB:.0f} MiB"
    assert measured["left"] < 30 * MIB, f"RSS is {measured['left'] / MIB:.0f} MiB above the start"


# -- refusals -----------------------------------------------------------------------------------

def test_tensor_modified_in_place_is_refused_naming_it_and_nothing_is_released():
    _, module = build_pair(mlp)
    materialize_module(module)
    version = module[2].weight._version
    with torch.no_grad():
        module[2].weight.mul_(2)
    reals = slots(module)
    with pytest.raises(ReleaseError) as error:
        release_module(module)
    assert str(error.value) == (
        "release_module refused: 1 tensor changed since materialization, and materializing again would "
        f"not reproduce the change: parameter '2.weight': it was modified in place (version counter "
        f"{version} → {version + 1}: an optimizer step, `copy_`, `mul_`...). Save what you need first "
        "(state_dict), or pass force=True to release anyway and lose the change; nothing was released"
    )
    assert isinstance(error.value, MaterializationError)
    assert_same_objects(module, reals)


def test_replaced_data_is_refused_and_several_changes_are_listed():
    _, module = build_pair(mlp)
    materialize_module(module)
    module[0].weight.data = torch.zeros(5, 6)
    version = module[3].bias._version
    with torch.no_grad():
        module[3].bias.add_(1)
    with pytest.raises(ReleaseError) as error:
        release_module(module)
    assert str(error.value) == (
        "release_module refused: 2 tensors changed since materialization, and materializing again would "
        "not reproduce the change: parameter '0.weight': its memory was replaced (`.data = ...`, or "
        "`module.to(...)`/`.half()` on parameters); parameter '3.bias': it was modified in place (version "
        f"counter {version} → {version + 1}: an optimizer step, `copy_`, `mul_`...). Save what you need "
        "first (state_dict), or pass force=True to release anyway and lose the change; nothing was released"
    )


def test_force_releases_a_modified_tensor_and_materializing_again_gives_eager_bytes():
    eager, module = build_pair(mlp)
    fakes = fakes_of(module)
    materialize_module(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    module(torch.ones(2, 6)).sum().backward()
    optimizer.step()
    with pytest.raises(ReleaseError):
        release_module(module)
    release_module(module, force=True)
    assert_same_objects(module, fakes)
    materialize_module(module)
    assert_module_equals_eager("forced", module, eager)


def test_check_fn_that_raises_names_the_submodule_and_releases_nothing():
    _, module = build_pair(mlp)
    materialize_module(module)
    reals = slots(module)

    def check(sub: nn.Module) -> bool:
        if isinstance(sub, nn.ReLU):
            raise ValueError("no activations")
        return True

    with pytest.raises(MaterializationError) as error:
        release_module(module, check_fn=check)
    assert str(error.value) == (
        "check_fn raised ValueError for submodule '1' (ReLU): no activations; nothing was released"
    )
    assert_same_objects(module, reals)


def test_release_module_refuses_what_is_not_a_module():
    with pytest.raises(TypeError) as error:
        release_module(torch.ones(2))
    assert str(error.value) == "explorer.release_module expects an nn.Module, got Tensor tensor([1., 1.])"
    with pytest.raises(TypeError) as error:
        release_module(nn.Linear(2, 2), check_fn=3)
    assert str(error.value) == "check_fn must be a function of a submodule returning bool, got int"


def test_release_module_is_exported():
    assert "release_module" in explorer.__all__ and "ReleaseError" in explorer.__all__


def test_a_gradient_hook_registered_after_materializing_survives_release_and_materializing_again():
    model = deferred_init(nn.Linear, 2, 2)
    materialize_module(model)
    model.weight.register_hook(lambda grad: torch.zeros_like(grad))
    release_module(model)
    materialize_module(model)
    model(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad.tolist() == [[0.0, 0.0], [0.0, 0.0]] and model.bias.grad.tolist() == [1.0, 1.0]


def test_a_freeze_and_attributes_set_after_materializing_survive_release_and_materializing_again():
    torch.manual_seed(0)
    eager = nn.Linear(4, 4)
    eager.weight.requires_grad_(False)
    torch.manual_seed(0)
    model = deferred_init(nn.Linear, 4, 4)
    materialize_module(model)
    model.weight.requires_grad_(False)
    model.bias._no_weight_decay = True
    release_module(model)
    assert is_deferred(model.weight) and not model.weight.requires_grad and model.bias._no_weight_decay
    materialize_module(model)
    assert (model.weight.requires_grad, model.bias.requires_grad) == (False, True)
    assert model.bias._no_weight_decay is True
    assert torch.equal(model.weight, eager.weight) and torch.equal(model.bias, eager.bias)
