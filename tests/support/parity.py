"""What "equal to eager construction" means, in one place for every parity test."""

from __future__ import annotations

import torch
from torch import nn

from explorer import is_deferred, is_fake


def slots(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and buffer name (duplicates included) with its tensor, parameters first."""
    return list(module.named_parameters(remove_duplicate=False)) + [
        (f"[buffer] {name}", b) for name, b in module.named_buffers(remove_duplicate=False)
    ]


def tie_groups(named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, ...]]:
    """Names grouped by the tensor object they hold."""
    groups: dict[int, list[str]] = {}
    for name, tensor in named:
        groups.setdefault(id(tensor), []).append(name)
    return sorted(tuple(names) for names in groups.values())


def storage_groups(named: list[tuple[str, torch.Tensor]]) -> list[tuple[tuple[str, int], ...]]:
    """Names grouped by the storage they view, with their storage offsets (empty storages apart)."""
    groups: dict[object, list[tuple[str, int]]] = {}
    for name, tensor in named:
        storage = tensor.untyped_storage()
        key = storage.data_ptr() if storage.nbytes() else name
        groups.setdefault(key, []).append((name, tensor.storage_offset()))
    return sorted(tuple(names) for names in groups.values())


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of values (NaN payloads and signed zeros included), whatever the strides."""
    return torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))


def assert_same_kind_and_layout(where: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """A materialized tensor (`got`) is real and has eager's (`want`) type, dtype, device, shape and stride."""
    assert not is_fake(got), f"{where} is still fake"
    assert type(got) is type(want), f"{where}: type {type(got).__name__} != {type(want).__name__}"
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
    assert got.device == want.device, f"{where}: device {got.device} != {want.device}"
    assert got.shape == want.shape, f"{where}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.stride() == want.stride(), f"{where}: stride {got.stride()} != {want.stride()}"


def assert_module_equals_eager(label: str, module: nn.Module, eager: nn.Module) -> None:
    """`module` (materialized) holds what eager construction gave: the same submodule classes, every
    parameter and buffer (duplicates included) bit for bit with eager's type, dtype, device, shape,
    stride and requires_grad, and one object wherever eager shares one."""
    assert not is_deferred(module), f"{label}: still deferred"
    mine, theirs = dict(module.named_modules()), dict(eager.named_modules())
    assert list(mine) == list(theirs), f"{label}: submodule names differ"
    for name, sub in mine.items():
        assert type(sub) is type(theirs[name]), f"{label}: {name!r} is {type(sub).__name__}"
    expected, actual = slots(eager), slots(module)
    assert [n for n, _ in actual] == [n for n, _ in expected], f"{label}: parameter/buffer names differ"
    for (name, want), (_, got) in zip(expected, actual):
        where = f"{label}: {name}"
        assert_same_kind_and_layout(where, got, want)
        assert got.requires_grad == want.requires_grad, f"{where}: requires_grad {got.requires_grad}"
        assert same_bits(got, want), f"{where}: values differ at {int((got != want).sum())}/{got.numel()} entries"
    assert tie_groups(actual) == tie_groups(expected), f"{label}: tie groups differ"
