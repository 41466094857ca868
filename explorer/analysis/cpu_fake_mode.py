"""`CpuFakeTensorMode`: the FakeTensorMode the analyses run in, with fake kernels torch gets wrong on CPU.

torch 2.13's fake (meta) kernel of `aten._grouped_mm` applies CUDA's rules and refuses anything but
bfloat16, while the CPU kernel takes float32 too; transformers 5 runs every fused MoE experts layer
(Mixtral, Qwen2-MoE, OLMoE, ...) through it on CPU, so their forward could not run on fakes. In this
mode such a call returns a contiguous fake of the CPU kernel's output shape and dtype (`out_dtype`,
else mat_a's), after the kernel's checks (same dtypes, 2-D or 3-D operands, matching contraction
dim, 16-byte strides); every other call, bfloat16 or off-CPU ones included, goes to the fake kernel
unchanged.

Why a subclass and not a dispatch mode above the fake one: a mode is one more Python hop for every
op of a step, about a tenth of a planner's fake step on a Llama that never calls `_grouped_mm`;
here the price is one identity test per op.
"""

from __future__ import annotations

from typing import cast

import torch

from .._torch_compat.fake import KeyedFakeTensorMode

__all__ = ["CpuFakeTensorMode"]

_GROUPED_MM = torch.ops.aten._grouped_mm.default
_EMPTY = torch.ops.aten.empty.memory_format


class CpuFakeTensorMode(KeyedFakeTensorMode):
    """FakeTensorMode, but `aten._grouped_mm` on CPU fakes follows the CPU kernel (module docstring); a dense
    fake's part of the op cache keys is read directly (note [A dense fake's cache key, read directly])."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _GROUPED_MM:
            made = _cpu_grouped_mm_output(args, kwargs or {})
            if made is not None:
                shape, dtype, device = made
                return super().__torch_dispatch__(_EMPTY, (), (shape,), {"dtype": dtype, "device": device})
        return super().__torch_dispatch__(func, types, args, kwargs)


def _cpu_grouped_mm_output(args: tuple, kwargs: dict) -> tuple[list[int], torch.dtype, torch.device] | None:
    """The CPU kernel's output (shape, dtype, device) after its checks; None where the fake kernel
    is right (off CPU, or both operands bfloat16)."""
    bound = dict(zip(("mat_a", "mat_b", "offs", "bias", "out_dtype"), args)) | kwargs
    mat_a, mat_b, offs = bound["mat_a"], bound["mat_b"], bound.get("offs")
    if mat_a.device.type != "cpu" or (mat_a.dtype == torch.bfloat16 and mat_b.dtype == torch.bfloat16):
        return None
    torch._check(mat_a.dtype == mat_b.dtype, lambda: f"_grouped_mm: dtypes {mat_a.dtype} and {mat_b.dtype} differ")
    torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3), lambda: "_grouped_mm: operands must be 2-D or 3-D")
    if mat_a.dim() == 3 or mat_b.dim() == 3:
        torch._check(mat_a.size(-1) == mat_b.size(-2), lambda: "_grouped_mm: contraction dims differ")
    _check_grouped_mm_strides("mat_a", mat_a)
    _check_grouped_mm_strides("mat_b", mat_b)
    return _grouped_mm_shape(mat_a, mat_b, offs), bound.get("out_dtype") or mat_a.dtype, mat_a.device


def _grouped_mm_shape(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None) -> list[int]:
    """The output shape of `aten._grouped_mm` (torch 2.13 `_create_grouped_mm_output_tensor`'s rules)."""
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        torch._check(offs is not None, lambda: "_grouped_mm of two 2-D matrices needs offs")
        return [cast(torch.Tensor, offs).size(0), mat_a.size(0), mat_b.size(1)]
    if mat_a.dim() == 2:
        return [mat_a.size(0), mat_b.size(-1)]
    if mat_b.dim() == 2:
        return [mat_a.size(1), mat_b.size(1)]
    torch._check(mat_a.size(0) == mat_b.size(0), lambda: "batched dimension has to match")
    return [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]


def _check_grouped_mm_strides(name: str, mat: torch.Tensor) -> None:
    """The CPU kernel's rule: the non-unit stride of the last two dims is a multiple of 16 bytes."""
    strides, last = mat.stride(), mat.dim() - 1
    leading = strides[last - 1] if strides[last] == 1 else strides[last]
    torch._check(
        (leading * mat.element_size()) % 16 == 0,
        lambda: f"_grouped_mm: {name}'s strides {strides} are not multiples of 16 bytes",
    )
