"""Batch norm recorded as its CPU and CUDA kernels run it: what it writes, and its output's layout.

Note: [Batch norm as its kernels run it]
Two facts about `native_batch_norm` are not what the recorder reads from it.
- Its schema hides a write: it takes `Tensor? running_mean, Tensor? running_var` unmarked, yet in
  training it updates both in place (PyTorch's functionalization special-cases it for the same
  reason). Recorded as its schema says, a training-mode forward of a deferred model (a recorded
  forward, a shape probe or a lazy module's first call inside a constructor, InstanceNorm's running
  statistics) would replay with the running statistics as they were before it. So the training call
  is recorded as `_native_batch_norm_legit`, whose schema marks both writes: the same kernel on the
  CPU and CUDA (`batch_norm_cpu` / `batch_norm_cuda`), so eager's values, bit for bit.
- Its fake output keeps the input's strides (the meta kernel is elementwise arithmetic), while the
  kernels allocate `empty_like(input, input.suggest_memory_format())`: contiguous for a transposed
  (N, C, L) input. An op after it that depends on strides (`matmul` choosing `view` or a copy) would
  be recorded as eager never ran it, and fail or differ on replay. So the output is re-made with the
  kernels' layout.
tests/explorer/record/test_batch_norm.py compares both with eager on every release.
"""

from __future__ import annotations

from typing import Any

import torch

from .._torch_compat.dispatch import disable_torch_dispatch
from .._torch_compat.fake import FakeTensor, fake_device_of, kernel_memory_format

_aten = torch.ops.aten
_NATIVE_BATCH_NORM = _aten.native_batch_norm.default
_LEGIT = getattr(_aten, "_native_batch_norm_legit", None)
_BATCH_NORM_WITH_STATS = getattr(_LEGIT, "default", None)

BATCH_NORMS = frozenset(
    op
    for op in (
        _NATIVE_BATCH_NORM,
        _BATCH_NORM_WITH_STATS,
        getattr(_LEGIT, "no_stats", None),
        getattr(getattr(_aten, "_native_batch_norm_legit_no_training", None), "default", None),
    )
    if op is not None
)
"""The op overloads recorded through `as_kernels_run_it` and `with_kernel_layout`."""


def as_kernels_run_it(func: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """`func` called with `args`, `kwargs`, as an op whose schema names every tensor it writes:
    the call itself unless it is a training `native_batch_norm` with running statistics."""
    if func is not _NATIVE_BATCH_NORM or _BATCH_NORM_WITH_STATS is None:
        return func, args, kwargs
    names = [argument.name for argument in func._schema.arguments]
    bound = dict(zip(names, args)) | kwargs
    if not bound.get("training") or bound.get("running_mean") is None or bound.get("running_var") is None:
        return func, args, kwargs  # no running statistics updated: the schema tells the truth
    return _BATCH_NORM_WITH_STATS, tuple(bound[name] for name in names), {}


def with_kernel_layout(out: Any, args: tuple, make_fake: Any) -> Any:
    """Batch norm's fake outputs with the normalized output laid out as the kernels lay it out."""
    if not isinstance(out, tuple) or not out or not isinstance(out[0], FakeTensor) or not args:
        return out
    normalized, source = out[0], args[0]
    memory_format = kernel_memory_format(source)
    if normalized.is_contiguous(memory_format=memory_format):
        return out
    with disable_torch_dispatch():
        elem = torch.empty(normalized.shape, dtype=normalized.dtype, device="meta", memory_format=memory_format)
        relaid = make_fake(elem, fake_device_of(normalized), normalized.requires_grad)
    return (relaid, *out[1:])
