"""Real tensors laid over recorded layouts: views by metadata, whole storages moved at once.

Replay reproduces storage sharing exactly: a tensor is never copied on its own, it is a layout
(shape, stride, offset, dtype) over a storage, and a storage moves between devices once, as bytes,
for all of its views.
"""

from __future__ import annotations

import torch

from .._torch_compat.dispatch import neg_view
from ..graph import TensorInfo
from ..record.fake import carry_gradient_hooks, user_attributes
from ..record.parameter_classes import parameter_class


def alias_on(
    base: torch.Tensor,
    shape: tuple,
    stride: tuple,
    offset: int,
    dtype: torch.dtype,
    *,
    conj: bool = False,
    neg: bool = False,
) -> torch.Tensor:
    """A tensor with the given layout over `base`'s storage (an inference tensor if `base` is one,
    as a view of it would be), read through the conjugate or negative bit when `conj` / `neg`."""
    with torch.inference_mode(base.is_inference()):
        alias = torch.empty(0, dtype=dtype, device=base.device).set_(base.untyped_storage(), offset, shape, stride)
        if neg:
            alias = neg_view(alias)
        return alias.conj() if conj else alias


def alias_of(base: torch.Tensor, info: TensorInfo) -> torch.Tensor:
    """`alias_on` with the layout and bits recorded for one tensor."""
    return alias_on(
        base, info.shape, info.stride, info.storage_offset, info.dtype, conj=info.conj, neg=info.neg
    )  # fmt: skip


def storage_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The whole storage under `tensor` as one uint8 tensor (to move it once for all its views)."""
    with torch.inference_mode(tensor.is_inference()):
        return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())


def storage_moved(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of the whole storage under `tensor` on `device`, as uint8 (inference stays inference)."""
    with torch.inference_mode(tensor.is_inference()):
        return storage_bytes(tensor).to(device)


def as_recorded_kind(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """Parameters come back as nn.Parameter, or the subclass they were made as (same requires_grad);
    buffers as plain tensors. Either
    way with the attributes a user or library set on the fake (`user_attributes`), as eager's
    tensor has them."""
    if real.is_inference() and not torch.is_inference_mode_enabled():
        with torch.inference_mode():  # where eager made it: requires_grad is refused elsewhere
            return as_recorded_kind(real, fake)
    if isinstance(fake, torch.nn.Parameter):  # of its class, without its own __new__ (eager's ran on the fake)
        real = torch.nn.Parameter.__new__(parameter_class(fake), real, fake.requires_grad)
    elif fake.requires_grad and not real.requires_grad and real.is_leaf and _differentiable(real):
        real.requires_grad_(True)
    for name, value in user_attributes(fake).items():
        setattr(real, name, value)
    carry_gradient_hooks(fake, real)
    return real


def _differentiable(tensor: torch.Tensor) -> bool:
    """Whether autograd lets `tensor` require grad: floating and complex dtypes."""
    return tensor.is_floating_point() or tensor.is_complex()


def as_fake_now(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """A real tensor made earlier for `fake`, given what was set on the fake since: requires_grad
    (`requires_grad_(False)` to freeze it) and attributes, as they would be on eager's one tensor."""
    if real.is_leaf and real.requires_grad != fake.requires_grad and _differentiable(real):
        real.requires_grad_(fake.requires_grad)
    for name, value in user_attributes(fake).items():
        setattr(real, name, value)
    carry_gradient_hooks(fake, real)
    return real
