"""A histogram of a tensor's values with the density its initializer should give, as an SVG string.

Drawn in the kernel (no plotting library, no front-end code): bars for the measured counts per bin,
and over them the expected count per bin from the init audit's distribution (`family`, `params`,
`mean`, `std` of an `explorer.init_report` row): the normal, uniform and truncated normal
densities exactly, a single spike for a constant. Other families (computed values, mixtures) get
bars only. The SVG's parts carry classes (`de-init-bar`, `de-init-density`, `de-init-spike`) that
the browser tests read.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

import torch

WIDTH, HEIGHT, MARGIN = 420, 170, 24
BINS = 40


def expected_density(family: str, params: Sequence, mean: float, std: float) -> Callable[[float], float] | None:
    """The density of one element's value, or None where the audit gives no formula for it."""
    if family == "normal" and std > 0:
        return lambda x: math.exp(-0.5 * ((x - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))
    if family == "uniform" and std > 0:
        low, high = mean - math.sqrt(3) * std, mean + math.sqrt(3) * std
        return lambda x: 1 / (high - low) if low <= x <= high else 0.0
    if family == "trunc_normal" and len(params) == 4:
        centre, scale, low, high = (float(p) for p in params)

        def cdf(z: float) -> float:
            return 0.5 * (1 + math.erf(z / math.sqrt(2)))

        mass = cdf((high - centre) / scale) - cdf((low - centre) / scale)
        return lambda x: (
            math.exp(-0.5 * ((x - centre) / scale) ** 2) / (scale * math.sqrt(2 * math.pi) * mass)
            if low <= x <= high
            else 0.0
        )
    return None


def histogram_svg(
    values: torch.Tensor, family: str, params: Sequence, mean: float, std: float, title: str = "", bins: int = BINS
) -> str:
    """The SVG of `values`' histogram (`bins` bins over their range) with the expected density."""
    data = values.detach().to("cpu", torch.float64).reshape(-1)
    data = data[torch.isfinite(data)]
    if data.numel() == 0:
        return _frame(title, "<text x='12' y='40'>no finite values</text>")
    low, high = float(data.min()), float(data.max())
    if low == high:  # one value: a single bar around it
        low, high = low - 0.5, high + 0.5
    counts = torch.histc(data, bins=bins, min=low, max=high).tolist()
    width = (high - low) / bins
    density = expected_density(family, params, mean, std)
    expected: list[float] = []
    if density is not None:
        expected = [data.numel() * width * density(low + width * (i + 0.5)) for i in range(bins)]
    top = max(max(counts), max(expected, default=0.0), 1.0)
    plot_w, plot_h = WIDTH - 2 * MARGIN, HEIGHT - 2 * MARGIN

    def x(value: float) -> float:
        return MARGIN + (value - low) / (high - low) * plot_w

    def y(count: float) -> float:
        return MARGIN + plot_h * (1 - count / top)

    parts = [
        f"<rect class='de-init-bar' x='{x(low + i * width):.1f}' y='{y(c):.1f}' width='{plot_w / bins:.1f}' "
        f"height='{MARGIN + plot_h - y(c):.1f}' fill='#9ecae1'/>"
        for i, c in enumerate(counts)
    ]
    if expected:
        points = " ".join(f"{x(low + width * (i + 0.5)):.1f},{y(e):.1f}" for i, e in enumerate(expected))
        parts.append(
            f"<polyline class='de-init-density' points='{points}' fill='none' stroke='#d62728' stroke-width='2'/>"
        )
    elif family in ("constant", "zeros") and low <= mean <= high:
        parts.append(
            f"<line class='de-init-spike' x1='{x(mean):.1f}' x2='{x(mean):.1f}' y1='{MARGIN}' "
            f"y2='{MARGIN + plot_h}' stroke='#d62728' stroke-width='2'/>"
        )
    parts.append(f"<text x='{MARGIN}' y='{HEIGHT - 6}' font-size='10'>{low:.4g}</text>")
    parts.append(f"<text x='{WIDTH - MARGIN}' y='{HEIGHT - 6}' font-size='10' text-anchor='end'>{high:.4g}</text>")
    return _frame(title, "".join(parts))


def _frame(title: str, body: str) -> str:
    return (
        f"<svg class='de-init-histogram' xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
        f"viewBox='0 0 {WIDTH} {HEIGHT}'><text x='{MARGIN}' y='14' font-size='11'>{html.escape(title)}</text>"
        f"{body}</svg>"
    )
