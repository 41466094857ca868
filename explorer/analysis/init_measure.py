"""What a tensor with memory holds, and whether that agrees with what its initializer should give.

Measured on float64 copies, one tensor at a time (`float32` sums over 10^8 elements drift). The
standard deviation is the population one (divided by n), like the analytic `std` it is compared to.

Agreement "beyond sampling error": for n independent draws with standard deviation s, the sample
mean strays from the expectation by s/sqrt(n) and the sample standard deviation from s by about
s*sqrt((k-1)/(4n)) (k the kurtosis; 6 covers normal, uniform, truncated and sparse mixtures). A
measurement disagrees when it is more than `SIGMAS` such errors away, plus the rounding of the
tensor's dtype (bfloat16 keeps 8 bits). Fixed values (constants, eye) have no sampling error: only
the rounding.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

SIGMAS = 6.0
_KURTOSIS = 6.0


class Measured(NamedTuple):
    """A tensor's values summarized; NaN/Inf elements are counted and left out of the moments."""

    mean: float
    std: float
    min: float
    max: float
    nan: int
    inf: int


def measure(tensor: torch.Tensor) -> Measured:
    """The moments, range and NaN/Inf counts of a tensor with memory (not a fake, not meta). All
    NaN for one whose values have no float64 reading (packed `float4_e2m1fn_x2`, `bits8`,
    quantized, sparse or other unstrided layouts): nothing to compare with an init's moments."""
    if tensor.layout is not torch.strided or tensor.is_quantized or not _converts_to_float(tensor.dtype):
        return Measured(math.nan, math.nan, math.nan, math.nan, 0, 0)
    with torch.no_grad():
        values = tensor.detach()
        if values.is_complex():
            values = values.abs()
        values = values.to("cpu", torch.float64).reshape(-1)
        nan = int(torch.isnan(values).sum())
        inf = int(torch.isinf(values).sum())
        if nan or inf:
            values = values[torch.isfinite(values)]
        if values.numel() == 0:
            return Measured(math.nan, math.nan, math.nan, math.nan, nan, inf)
        return Measured(
            float(values.mean()),
            float(values.std(unbiased=False)) if values.numel() > 1 else 0.0,
            float(values.min()),
            float(values.max()),
            nan,
            inf,
        )


@functools.cache
def _converts_to_float(dtype: torch.dtype) -> bool:
    """Whether `.to(torch.float64)` has a kernel for `dtype` (not bit containers such as `bits8`,
    nor packed sub-byte floats such as `float4_e2m1fn_x2`, whose element is not one number)."""
    try:
        torch.empty(1, dtype=dtype).to(torch.float64)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def disagrees(measured: Measured, mean: float, std: float, count: int, random: bool, dtype: torch.dtype) -> bool:
    """Whether `measured` is further from the expected `mean`/`std` than sampling error and the
    dtype's rounding allow. False when nothing is expected (NaN)."""
    if math.isnan(mean) or math.isnan(std) or count == 0:
        return False
    if math.isnan(measured.mean) and not measured.nan:
        return False  # no values measured (none there, or none with a float reading)
    if measured.nan or measured.inf:
        return True
    rounding = (torch.finfo(dtype).eps if dtype.is_floating_point else 0.0) * 2
    scale = max(abs(mean), std, 1e-12)
    mean_error = (SIGMAS * std / math.sqrt(count) if random else 0.0) + rounding * scale + 1e-9
    std_error = (SIGMAS * std * math.sqrt((_KURTOSIS - 1) / (4 * count)) if random else 0.0) + rounding * scale + 1e-9
    return abs(measured.mean - mean) > mean_error or abs(measured.std - std) > std_error
