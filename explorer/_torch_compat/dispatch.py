"""Dispatch-level switches and tensor identity: the guards recording and replay put around kernels,
storage identity, and the mode-stack helpers of `torch.utils._python_dispatch`.

These are C-level entry points (`torch._C`) with no public spelling. Each is looked up once here,
so a release that renames one fails at import of this module with its name, not mid-recording.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

__all__ = [
    "OpOverload",
    "TorchDispatchMode",
    "disable_current_modes",
    "disable_torch_dispatch",
    "disable_torch_function",
    "metadata_access",
    "meta_in_tls_dispatch_include",
    "neg_view",
    "never_traced_by_dynamo",
    "preserve_dispatch_key_guard",
    "pytree",
    "storage_id",
    "storage_of",
    "throw_on_mutable_data_ptr",
    "tensor_shape",
    "tree_flatten",
    "tree_map",
]

tree_flatten = pytree.tree_flatten
tree_map = pytree.tree_map

# Guards: context-manager classes, entered per op on the hot paths.
disable_torch_dispatch: Callable[[], Any] = torch._C._DisableTorchDispatch
"""Ops inside run their kernels with no __torch_dispatch__ (modes or subclasses) in the way."""
disable_torch_function: Callable[[], Any] = torch._C.DisableTorchFunction
"""No __torch_function__ handling at all inside."""
metadata_access: Callable[[], Any] = torch._C.DisableTorchFunctionSubclass
"""Tensor subclasses' __torch_function__ off: reads shape, dtype, device of lazy parameters, which
refuse metadata reads through their own __torch_function__."""
preserve_dispatch_key_guard: Callable[[], Any] = torch._C._PreserveDispatchKeyGuard
"""Thread-local dispatch key sets restored on exit."""
disable_current_modes = _disable_current_modes
"""Every active TorchDispatchMode popped for the block (restored on exit)."""
neg_view: Callable[[torch.Tensor], torch.Tensor] = torch._neg_view
"""A view read through the negative bit (what `is_neg()` reports): no public spelling."""


def meta_in_tls_dispatch_include(value: bool) -> None:
    """Add (or drop) Meta in the thread's dispatch include set: kernels run their meta versions.
    Use inside `preserve_dispatch_key_guard()`."""
    torch._C._set_meta_in_tls_dispatch_include(value)


def never_traced_by_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as torch.compile's frame tracer must leave it: run as plain Python, with every frame it
    calls (see note [A deferred model under torch.compile] in record/fake.py). The decorator torch
    puts on TorchDispatchMode handlers; it imports torch._dynamo on the first call only, which
    FakeTensorMode has done by then. A torch without it leaves `fn` as it is."""
    disable = getattr(torch, "_disable_dynamo", None)
    return fn if disable is None else disable(fn, recursive=True)


def throw_on_mutable_data_ptr(tensor: torch.Tensor) -> None:
    """Make `tensor.data_ptr()` raise, as FakeTensor.__new__ does for its fakes."""
    torch._C._set_throw_on_mutable_data_ptr(tensor)


storage_id: Callable[[torch.Tensor], int] = torch._C._storage_id  # type: ignore[attr-defined]  # untyped in the stubs
"""An integer naming `tensor`'s storage: equal for tensors sharing one, without a storage object."""
storage_of: Callable[[torch.Tensor], torch.UntypedStorage] = torch._C.TensorBase.untyped_storage
"""`Tensor.untyped_storage` without a subclass's __torch_function__ in the way."""
tensor_shape = torch._C.TensorBase.shape
"""The `shape` descriptor of the base tensor class (a class attribute for subclasses that refuse
their own metadata reads)."""
