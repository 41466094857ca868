"""What eager refuses of an in-place pointwise op before it runs, where a fake kernel does not.

An in-place pointwise op writes its result into `self` through ATen's TensorIterator, which checks
two things up front: the result has `self`'s shape (it never resizes `self`), and the result's
dtype can be cast to `self`'s (`int_tensor.mul_(1.5)` raises). Some meta kernels check neither.
Recorded anyway, such an op would fail only at materialization, far from the line that issued it;
refused while recording instead, with eager's words, the error names the op and the line.
"""

from __future__ import annotations

from typing import Any

import torch

# By id(func), with the overload kept alive in the value (as record/modes.py's kinds).
_INPLACE_POINTWISE: dict[int, tuple[Any, bool]] = {}
_FUNCTIONAL: dict[int, tuple[Any, Any]] = {}

# c10's names for dtypes, as TensorIterator's messages spell them (`ScalarType` in c10/core).
_C10_NAMES = {
    torch.bool: "Bool",
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.complex32: "ComplexHalf",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
}


def inplace_pointwise(func: Any) -> bool:
    """Whether `func` is an in-place pointwise op writing its first argument (`atan2_`, `add_`)."""
    entry = _INPLACE_POINTWISE.get(id(func))
    if entry is None:
        arguments = func._schema.arguments
        first_written = bool(arguments) and arguments[0].alias_info is not None and arguments[0].alias_info.is_write
        inplace = first_written and not arguments[0].kwarg_only and func._schema.name.endswith("_")
        entry = _INPLACE_POINTWISE[id(func)] = (func, inplace and _pointwise(func))
    return entry[1]


def _functional_of(inplace: Any) -> Any:
    """The out-of-place overload of an in-place one (`copysign.Tensor` for `copysign_.Tensor`), or None."""
    entry = _FUNCTIONAL.get(id(inplace))
    if entry is None:
        packet = getattr(getattr(torch.ops, inplace.namespace), inplace._schema.name.split("::")[-1][:-1], None)
        entry = _FUNCTIONAL[id(inplace)] = (inplace, getattr(packet, inplace._overloadname, None) if packet else None)
    return entry[1]


def _pointwise(inplace: Any) -> bool:
    """Whether an in-place overload is pointwise: by its tag, or (`copysign_`, `eq_`, `gcd_` carry
    none) by its functional overload's (`copysign.Tensor`)."""
    if torch.Tag.pointwise in inplace.tags:
        return True
    functional = _functional_of(inplace)
    return functional is not None and torch.Tag.pointwise in functional.tags


def broadcast_refusal(args: tuple) -> RuntimeError | None:
    """Eager's error when the other operands broadcast `self` (`args[0]`) to a larger shape:
    `x[10, 1, 5].atan2_(y[10, 10, 5])` raises, where some fake kernels resize `self` instead."""
    if not args or not isinstance(args[0], torch.Tensor):
        return None  # a list of tensors (`_foreach_add_`): each pair is checked by its own kernel
    shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
    try:
        broadcast = tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None  # not broadcastable at all: the op's own check says so
    if broadcast == shapes[0]:
        return None
    return RuntimeError(f"output with shape {list(shapes[0])} doesn't match the broadcast shape {list(broadcast)}")


def cast_refusal(func: Any, args: tuple, kwargs: dict) -> RuntimeError | None:
    """Eager's error when `func`'s result type cannot be cast to `self`'s dtype (a float result
    into an integer or bool tensor, a complex one into a real tensor), found by running the
    functional overload on the same (fake) arguments. Only asked where a promotion past `self`'s
    dtype is possible at all; None when the check does not apply or the functional op fails (the
    in-place op's own kernel then says what is wrong)."""
    target = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if target is None or not _may_promote_past(target.dtype, args[1:], kwargs):
        return None
    functional = _functional_of(func)
    if functional is None:
        return None
    try:
        result = functional(*args, **kwargs)
    except Exception:
        return None
    if not isinstance(result, torch.Tensor) or torch.can_cast(result.dtype, target.dtype):
        return None
    return RuntimeError(
        f"result type {_C10_NAMES.get(result.dtype, result.dtype)} can't be cast to the desired output type "
        f"{_C10_NAMES.get(target.dtype, target.dtype)}"
    )


def _may_promote_past(dtype: torch.dtype, others: tuple, kwargs: dict) -> bool:
    """Whether a result could be of a higher category than `dtype`: always for integer and bool
    tensors (true division, `sqrt_`, a float operand), for real floating ones with a complex operand."""
    if dtype.is_complex:
        return False
    if not dtype.is_floating_point:
        return True
    return any(
        type(value) is complex or (isinstance(value, torch.Tensor) and value.dtype.is_complex)
        for value in (*others, *kwargs.values())
    )
