"""What eager and deferred construction must agree on, as plain comparable data.

`snapshot(module, externals)` reduces a built module to facts that must be identical bit for bit:
for every parameter and buffer slot (shared modules listed under each of their paths) its Python
kind, dtype, shape, stride (except for zero-element tensors, whose strides address nothing), storage
offset, storage size, requires_grad, whether it is an inference tensor, and value bytes; which slots
share a storage (externals included, so "this buffer is a view of the table passed in" is checked);
which slots are one object (tie groups); and every value `.item()` returned inside the constructor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import nn

from explorer import is_fake


@dataclass(frozen=True)
class TensorFacts:
    kind: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    storage_nbytes: int
    requires_grad: bool
    inference: bool
    device: str
    value: bytes


@dataclass(frozen=True)
class Snapshot:
    tensors: dict[str, TensorFacts]
    sharing: frozenset[frozenset[str]]  # slots (and "<external i>") over one storage
    ties: frozenset[frozenset[str]]  # slots holding the very same tensor object
    values_read: tuple[str, ...]  # repr() of each `.item()` result: -0.0 and nan compare exactly


def slots(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every (qualified name, tensor) of parameters and buffers, under every path of a module."""
    for path, sub in module.named_modules(remove_duplicate=False):
        prefix = f"{path}." if path else ""
        for kind in ("_parameters", "_buffers"):
            for key, tensor in getattr(sub, kind).items():
                if tensor is not None:
                    yield prefix + key, tensor


def module_paths(module: nn.Module) -> list[str]:
    return [path for path, _ in module.named_modules(remove_duplicate=False)]


def tensor_facts(tensor: torch.Tensor) -> TensorFacts:
    kind = "Parameter" if isinstance(tensor, nn.Parameter) else "Tensor"
    if is_fake(tensor):
        return TensorFacts("fake " + kind, tensor.dtype, tuple(tensor.shape), tensor.stride(),
                           tensor.storage_offset(), -1, tensor.requires_grad, tensor.is_inference(),
                           str(tensor.device), b"")
    # A fresh dense copy: `.contiguous()` keeps odd strides of size-1 dims, which `view(uint8)` refuses.
    # `.data`, not `.detach()`: a parameter made from an inference tensor and cast after construction
    # has no version counter for `detach()` to share ("Inference tensors do not track version counter").
    flat = torch.empty(tensor.numel(), dtype=tensor.dtype).copy_(tensor.data.reshape(-1))
    return TensorFacts(
        kind, tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.storage_offset(),
        tensor.untyped_storage().nbytes(), tensor.requires_grad, tensor.is_inference(), str(tensor.device),
        bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b"",
    )


def _groups(keys: dict[str, object]) -> frozenset[frozenset[str]]:
    by_key: dict[object, set[str]] = {}
    for name, key in keys.items():
        by_key.setdefault(key, set()).add(name)
    return frozenset(frozenset(group) for group in by_key.values() if len(group) > 1)


def snapshot(module: nn.Module, externals: Sequence[torch.Tensor]) -> Snapshot:
    named = list(slots(module))
    storage_keys: dict[str, object] = {
        f"<external {i}>": ("storage", t.untyped_storage()._cdata) for i, t in enumerate(externals)
    }
    for name, tensor in named:
        storage_keys[name] = (
            ("fake", id(tensor)) if is_fake(tensor) else ("storage", tensor.untyped_storage()._cdata)
        )
    return Snapshot(
        tensors={name: tensor_facts(tensor) for name, tensor in named},
        sharing=_groups(storage_keys),
        ties=_groups({name: id(tensor) for name, tensor in named}),
        values_read=tuple(repr(v) for v in getattr(module, "values_read", ())),
    )


def differences(
    expected: Snapshot, actual: Snapshot, only: Sequence[str] | None = None, values: bool = True
) -> list[str]:
    """Human-readable mismatches between an eager snapshot and a deferred one (empty: equal).

    With `only`, compares just those slots (and no sharing between slots); with `values=False`,
    everything but the values of the slots (for rng="fast", whose random values differ from eager).
    """
    found: list[str] = []
    names = list(only) if only is not None else sorted(set(expected.tensors) | set(actual.tensors))
    if only is None and list(expected.tensors) != list(actual.tensors):
        found.append(f"slot names differ: eager {list(expected.tensors)}, deferred {list(actual.tensors)}")
    for name in names:
        want, got = expected.tensors.get(name), actual.tensors.get(name)
        if want is None or got is None:
            continue
        for field in TensorFacts.__dataclass_fields__:
            if field == "value" and not values:
                continue
            if field == "stride" and 0 in want.shape:
                # No element has an address: PyTorch's own fake/eager cross-checks skip these too
                # (torch._prims_common.check_significant_strides), and its meta kernels disagree
                # with CPU kernels here (e.g. a zero-size out= tensor resized by `add`).
                continue
            a, b = getattr(want, field), getattr(got, field)
            if a != b:
                if field == "value":
                    a, b = _decode(want), _decode(got)
                found.append(f"{name}: {field} eager {a} != deferred {b}")
    if only is None:
        if expected.sharing != actual.sharing:
            found.append(f"storage sharing: eager {_show(expected.sharing)} != deferred {_show(actual.sharing)}")
        if expected.ties != actual.ties:
            found.append(f"tie groups: eager {_show(expected.ties)} != deferred {_show(actual.ties)}")
    if expected.values_read != actual.values_read:
        found.append(f".item() values: eager {expected.values_read} != deferred {actual.values_read}")
    return found


def _decode(facts: TensorFacts) -> object:
    if not facts.value:
        return "<no values>"
    flat = torch.frombuffer(bytearray(facts.value), dtype=torch.uint8).view(facts.dtype)
    return flat.tolist()


def _show(groups: frozenset[frozenset[str]]) -> list[list[str]]:
    return sorted(sorted(group) for group in groups)
