"""Whether a pointwise in-place op gives some rows, run alone, what it gives them in the whole tensor.

Rows drawn alone (`rows.py`) may carry ops applied after the fill: timm's `trunc_normal_` is
`uniform_`, `erfinv_`, `mul_`, `add_`, `clamp_`, all in place. A pointwise op computes each element
from that element alone, so applying it to the rows gives the whole tensor's rows, *if* the kernel
computes an element the same way wherever the element falls. ATen's CPU kernels do not promise that:
`cpu_kernel_vec` runs a vectorized loop over most of each thread's chunk and a scalar loop over the
rest, and for a transcendental function the two may round differently (Sleef against libm). Rows
alone move elements between the two loops.

So an op is applied to rows only after a probe shows that, on this torch, device and dtype, with
these arguments, it gives every element of a probe tensor the same bits computed in one long run
(mostly vectorized) as in runs of a few elements (scalar). The probe is cached per (op, arguments,
dtype, device) and costs about a millisecond. An op that fails it sends the tensor back to whole
materialization, which runs exactly as eager did.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..graph import OpNode
from .positional import TailOp

_PROBE_SIZE = 1 << 11  # long enough for every vector width and unroll; the short runs below are scalar
_SHORT_RUN = 5  # below any Vectorized<T>::size(): cpu_kernel_vec's remainder loop


def apply_tail(tail: tuple[TailOp, ...], values: torch.Tensor, first: int) -> torch.Tensor | None:
    """`values` — elements [first, first + len(values)) of a storage, contiguous — after the ops of
    `tail`, in order; None when a pointwise op fails the probe on `values`' dtype and device (the
    elements alone would not be bitwise)."""
    if op_failing_probe(tail, values.dtype, values.device) is not None:
        return None
    with torch.no_grad():
        for step in tail:
            target = values
            if step.window is not None:
                start, stop = max(step.window[0] - first, 0), min(step.window[1] - first, len(values))
                if start >= stop:
                    continue
                target = values[start:stop]
            step.op.func(target, *step.op.args[1:], **step.op.kwargs)
    return values


def op_failing_probe(tail: tuple[TailOp, ...], dtype: torch.dtype, device: torch.device) -> OpNode | None:
    """The first pointwise op of `tail` that fails the probe on `dtype` and `device` (None: all
    pass, so `apply_tail` applies them to some elements alone; constant windows need no probe)."""
    for step in tail:
        op = step.op
        if step.window is not None:
            continue
        key = (op.func, op.args[1:], tuple(sorted(op.kwargs.items())), dtype, device)
        try:
            if not gives_the_same_bits_in_short_runs(*key):
                return op
        except TypeError:  # an unhashable argument (a list): not probed, so not applied alone
            return op
    return None


@functools.cache
def gives_the_same_bits_in_short_runs(
    func: Any, args: tuple, kwargs: tuple, dtype: torch.dtype, device: torch.device
) -> bool:
    """The probe (see above): `func(t, *args, **kwargs)` on one run of `_PROBE_SIZE` elements against
    runs of `_SHORT_RUN`, compared bit for bit. An op that raises on the probe counts as failing."""
    probe = _probe_values(dtype, device)
    whole, parts = probe.clone(), probe.clone()
    try:
        with torch.no_grad():
            func(whole, *args, **dict(kwargs))
            for start in range(0, len(parts), _SHORT_RUN):
                func(parts[start : start + _SHORT_RUN], *args, **dict(kwargs))
    except Exception:  # e.g. an op without a kernel for this dtype: the whole tensor path will say so
        return False
    return torch.equal(whole.view(torch.uint8), parts.view(torch.uint8))


def _probe_values(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Values an init sees: uniforms in (-1, 1) (erfinv's domain), normals, wide magnitudes, signed
    zeros and the ends of the range; made on the CPU from a private generator, then moved."""
    generator = torch.Generator().manual_seed(20261127)
    quarter = _PROBE_SIZE // 4
    uniforms = torch.rand(quarter, generator=generator, dtype=torch.float64) * 2 - 1
    normals = torch.randn(quarter, generator=generator, dtype=torch.float64)
    wide = torch.randn(quarter, generator=generator, dtype=torch.float64) * 10.0 ** torch.randint(
        -30, 30, (quarter,), generator=generator
    )
    edges = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-40, -1e-40], dtype=torch.float64)
    rest = torch.rand(_PROBE_SIZE - 3 * quarter - len(edges), generator=generator, dtype=torch.float64)
    values = torch.cat([uniforms, normals, wide, edges, rest])
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        values = values.clamp(info.min, info.max)
    elif dtype.is_complex:
        values = torch.complex(values, values.flip(0))
    elif dtype == torch.bool:
        values = values > 0
    else:
        info_int = torch.iinfo(dtype)
        values = (values * 1000).round().clamp(info_int.min, info_int.max)
    return values.to(dtype).to(device)
