"""What values an initializer gives: a name in words and the analytic mean and standard deviation.

`Distribution` is the init audit's reading of one write (or one created tensor): `normal(mean=0,
std=0.02)`, `uniform(-0.25, 0.25)`, `constant(1.0)`, `orthogonal(gain=1)`, `computed (arange, pow)`,
`copied from checkpoint model.safetensors:embed.weight`. `mean` and `std` are the expectation and
the population standard deviation of one element's value (NaN where no formula applies: values
computed from other values, checkpoint bytes); `random` says whether the values are draws (then a
measurement agrees only up to sampling error) or fixed numbers. Several writes making parts of one
tensor combine with `mixture`: the exact moments of the mixture, element counts as weights.

`key` compares two initializations (construction against a re-init): the family and its parameters
rounded to 6 significant digits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

Family = Literal[
    "normal",
    "uniform",
    "trunc_normal",
    "constant",
    "zeros",
    "eye",
    "orthogonal",
    "random",
    "copied",
    "computed",
    "uninitialized",
    "mixed",
    "unrecorded",
]
RANDOM_FAMILIES = frozenset({"normal", "uniform", "trunc_normal", "orthogonal", "random"})


def number(value: float) -> str:
    """A parameter as people write it: `0.02`, `-0.125`, `1.0`, `0.0883883` (6 significant digits)."""
    if not math.isfinite(value):
        return repr(float(value))  # `inf`, `-inf`, `nan`: a causal mask's fill, a sentinel
    if value == int(value) and abs(value) < 1e15:
        return f"{float(value):.1f}" if abs(value) < 1e4 else f"{value:g}"
    return f"{value:.6g}"


@dataclass(frozen=True)
class Distribution:
    """One initialization: what it is in words, and the moments of one element's value."""

    family: Family
    text: str
    mean: float = math.nan
    std: float = math.nan
    random: bool = False
    params: tuple = field(default=())

    @property
    def key(self) -> tuple:
        """What two initializations must share to count as the same (families and rounded parameters)."""
        return (self.family, tuple(float(f"{p:.6g}") if isinstance(p, float) else p for p in self.params))

    def scaled(self, factor: float, op: str) -> Distribution:
        """The values multiplied by `factor` (`mul_`, `div_` by a number): parameters follow."""
        if self.family == "orthogonal":
            gain = self.params[0] * factor
            return replace(
                self,
                text=f"orthogonal(gain={number(gain)})",
                mean=self.mean * factor,
                std=self.std * abs(factor),
                params=(gain,),
            )
        if self.family in ("zeros", "constant"):
            return constant(self.mean * factor)
        return replace(
            self,
            text=f"{self.text} {op} {number(factor)}",
            mean=self.mean * factor,
            std=self.std * abs(factor),
            params=(*self.params, op, factor),
            family=self.family,
        )

    def shifted(self, offset: float, op: str) -> Distribution:
        """The values plus `offset` (`add_`, `sub_` of a number)."""
        if self.family in ("zeros", "constant"):
            return constant(self.mean + offset)
        return replace(
            self,
            text=f"{self.text} {op} {number(abs(offset))}",
            mean=self.mean + offset,
            params=(*self.params, op, offset),
        )


def normal(mean: float, std: float) -> Distribution:
    return Distribution("normal", f"normal(mean={number(mean)}, std={number(std)})", mean, std, True, (mean, std))


def uniform(low: float, high: float) -> Distribution:
    return Distribution(
        "uniform",
        f"uniform({number(low)}, {number(high)})",
        (low + high) / 2,
        (high - low) / math.sqrt(12),
        True,
        (low, high),
    )


def trunc_normal(mean: float, std: float, low: float, high: float) -> Distribution:
    """The normal(mean, std) restricted to [low, high] (what `nn.init.trunc_normal_` draws)."""
    alpha, beta = (low - mean) / std, (high - mean) / std

    def pdf(x: float) -> float:
        return math.exp(-x * x / 2) / math.sqrt(2 * math.pi)

    def cdf(x: float) -> float:
        return 0.5 * (1 + math.erf(x / math.sqrt(2)))

    mass = cdf(beta) - cdf(alpha)
    shift = (pdf(alpha) - pdf(beta)) / mass
    variance = 1 + (alpha * pdf(alpha) - beta * pdf(beta)) / mass - shift * shift
    text = f"trunc_normal(mean={number(mean)}, std={number(std)}, a={number(low)}, b={number(high)})"
    return Distribution(
        "trunc_normal", text, mean + std * shift, std * math.sqrt(variance), True, (mean, std, low, high)
    )


def constant(value: float) -> Distribution:
    if value == 0:
        return Distribution("zeros", "zeros", 0.0, 0.0, False, (0.0,))
    return Distribution("constant", f"constant({number(value)})", float(value), 0.0, False, (float(value),))


def eye(rows: int, columns: int) -> Distribution:
    """`torch.eye(rows, columns)`: min(rows, columns) ones, zeros elsewhere."""
    share = min(rows, columns) / (rows * columns) if rows * columns else 0.0
    return Distribution("eye", "eye", share, math.sqrt(share * (1 - share)), False, (rows, columns))


def orthogonal(shape: Sequence[int]) -> Distribution:
    """`nn.init.orthogonal_` before its gain: the rows (or columns) of the flattened matrix are
    orthonormal, so the squares of its elements sum to min(rows, columns); the mean is 0 only in
    expectation (the signs are random)."""
    rows = shape[0] if shape else 1
    columns = math.prod(shape) // rows if rows else 0
    std = math.sqrt(min(rows, columns) / (rows * columns)) if rows * columns else math.nan
    return Distribution("orthogonal", "orthogonal(gain=1.0)", 0.0, std, True, (1.0,))


def random_draws(text: str, mean: float = math.nan, std: float = math.nan) -> Distribution:
    """Other random fills (`bernoulli_`, `exponential_`, `random_`, ...)."""
    return Distribution("random", text, mean, std, True, (text,))


def copied(what: str, mean: float = math.nan, std: float = math.nan) -> Distribution:
    """Values copied from elsewhere (a checkpoint, a tensor from outside the recording): fixed values,
    whose moments are known only when the recording holds them (`mean`, `std`)."""
    return Distribution("copied", f"copied from {what}", mean, std, False, (what,))


def computed(ops: Sequence[str]) -> Distribution:
    """Values computed from other values by recorded ops (named, at most four, first seen first)."""
    names = list(dict.fromkeys(ops))
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return Distribution("computed", f"computed ({shown})", params=("computed",))


UNINITIALIZED = Distribution("uninitialized", "uninitialized", params=("uninitialized",))
# A real tensor no recording explains (built eagerly, or its recording is gone).
UNRECORDED = Distribution("unrecorded", "not recorded", params=("unrecorded",))


def mixture(parts: Sequence[tuple[int, Distribution]]) -> Distribution:
    """The values of a tensor whose elements come from several writes: `parts` are (element count,
    distribution), the largest first in the text. The moments are exact (law of total variance)."""
    merged: dict[tuple, list] = {}
    for count, dist in parts:
        if count > 0:
            merged.setdefault(dist.key, [0, dist])[0] += count
    parts = sorted(((count, dist) for count, dist in merged.values()), key=lambda part: -part[0])
    if not parts:
        return UNINITIALIZED
    if len(parts) == 1:
        return parts[0][1]
    total = sum(count for count, _ in parts)
    mean = sum(count * dist.mean for count, dist in parts) / total
    second = sum(count * (dist.std**2 + dist.mean**2) for count, dist in parts) / total
    std = math.sqrt(max(second - mean * mean, 0.0))
    text = parts[0][1].text + "".join(f"; {count} elements: {dist.text}" for count, dist in parts[1:])
    return Distribution(
        "mixed",
        text,
        mean,
        std,
        any(dist.random for _, dist in parts),
        tuple((count, dist.key) for count, dist in parts),
    )
