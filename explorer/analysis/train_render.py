"""How a `TrainStep` reads: the terminal summary, the fits verdict, and HTML with a stacked bar.

The bar is plain SVG built here (no JavaScript), one segment per category in a fixed order and
colour, so the notebook repr and the explorer's Training step panel draw the same picture.
"""

from __future__ import annotations

import html
from typing import Protocol

import pandas as pd

from ..naming import format_bytes
from .train_budget import parse_budget


class TrainStep(Protocol):
    """What this module reads of a `train_step.TrainStep` (a Protocol: the result's module imports
    this one, not the other way round)."""

    @property
    def root_class(self) -> str: ...
    @property
    def world_size(self) -> int: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def activation_checkpointing(self) -> bool: ...
    @property
    def keep_outputs(self) -> bool: ...
    @property
    def accumulation_steps(self) -> int: ...
    @property
    def peak_bytes(self) -> int: ...
    @property
    def peak(self) -> dict[str, int]: ...
    @property
    def phase(self) -> str: ...
    @property
    def modules(self) -> pd.DataFrame: ...
    @property
    def end_of_forward_bytes(self) -> int: ...
    @property
    def end_of_forward(self) -> dict[str, int]: ...
    @property
    def end_of_forward_activations(self) -> pd.DataFrame: ...


# Category → colour, in drawing order (weights first, then what the step adds).
CATEGORY_COLOURS = {
    "parameters": "#4e79a7",
    "sharded_parameters": "#4e79a7",
    "unsharded_parameters": "#a0cbe8",
    "buffers": "#86bcb6",
    "gradients": "#f28e2b",
    "sharded_gradients": "#f28e2b",
    "unsharded_gradients": "#ffbe7d",
    "optimizer_state": "#e15759",
    "activations": "#59a14f",
    "temporaries": "#edc948",
    "all_gather": "#b07aa1",
    "reduce_scatter": "#ff9da7",
    "inputs": "#9c755f",
}
BAR_WIDTH = 560
BAR_HEIGHT = 28


def category_label(category: str) -> str:
    """ "optimizer_state" → "optimizer state"."""
    return category.replace("_", " ")


def _where(step: TrainStep) -> str:
    return f"per rank of {step.world_size}" if step.world_size > 1 else "on one device"


def _category_lines(by_category: dict[str, int]) -> list[str]:
    return [f"  {category_label(category)}: {format_bytes(value)}" for category, value in by_category.items() if value]


def end_of_forward_text(step: TrainStep) -> str:
    """ "end of forward (backward starts): 2.1 GiB, activations 1.4 GiB"."""
    return (
        f"end of forward (backward starts): {format_bytes(step.end_of_forward_bytes)}, "
        f"activations {format_bytes(step.end_of_forward.get('activations', 0))}"
    )


def summary_text(step: TrainStep) -> str:
    """A few lines: the peak, where it is reached, and each non-empty category; then the bytes at the
    end of forward and each of their non-empty categories."""
    options = [step.optimizer]
    if step.activation_checkpointing:
        options.append("activation checkpointing")
    if step.accumulation_steps > 1:
        options.append(f"{step.accumulation_steps} micro-batches")
    if not step.keep_outputs:
        options.append("outputs dropped after backward")
    headline = (
        f"{step.root_class} training step ({', '.join(options)}): "
        f"peak {format_bytes(step.peak_bytes)} ({step.peak_bytes:,} bytes) {_where(step)}, in the {step.phase}"
    )
    lines = [headline, *_category_lines(step.peak), end_of_forward_text(step), *_category_lines(step.end_of_forward)]
    return "\n".join(lines)


def verdict_text(step: TrainStep, budget: float | str) -> str:
    """ "fits on 8 × 80GB (peak 14.1 GiB per device)" or "does not fit on ..."."""
    written = budget if isinstance(budget, str) else format_bytes(parse_budget(budget))
    fits = step.peak_bytes <= parse_budget(budget)
    return (
        f"{'fits' if fits else 'does not fit'} on {step.world_size} × {written} "
        f"(peak {format_bytes(step.peak_bytes)} per device)"
    )


def stacked_bar_svg(peak: dict[str, int], width: int = BAR_WIDTH) -> str:
    """An SVG bar of `peak`'s categories side by side, widths proportional to bytes, with a legend."""
    total = sum(peak.values()) or 1
    x = 0.0
    rects, legend = [], []
    for category, value in peak.items():
        if not value:
            continue
        share = value / total * width
        colour = CATEGORY_COLOURS.get(category, "#bab0ac")
        label = html.escape(f"{category_label(category)}: {format_bytes(value)}")
        rects.append(
            f'<rect class="train-bar-segment" data-category="{category}" x="{x:.1f}" y="0" '
            f'width="{share:.1f}" height="{BAR_HEIGHT}" fill="{colour}"><title>{label}</title></rect>'
        )
        legend.append(
            f'<span style="white-space:nowrap;margin-right:12px"><span style="display:inline-block;width:10px;'
            f'height:10px;background:{colour};margin-right:4px"></span>{label}</span>'
        )
        x += share
    svg = (
        f'<svg class="train-bar" width="{width}" height="{BAR_HEIGHT}" viewBox="0 0 {width} {BAR_HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg">{"".join(rects)}</svg>'
    )
    legend_box = f'<div class="train-legend" style="font-size:12px">{"".join(legend)}</div>'
    return f'<div class="train-bar-box">{svg}{legend_box}</div>'


def modules_html(step: TrainStep, limit: int = 40) -> str:
    """The per-module table (first `limit` rows), bytes written in binary units."""
    shown = step.modules.head(limit).copy()
    for column in ("forward_peak_bytes", "backward_peak_bytes", "activation_bytes"):
        shown[column] = shown[column].map(format_bytes)
    return shown.to_html(index=False, classes="train-modules", border=0)


def forward_activations_html(step: TrainStep, limit: int = 40) -> str:
    """The activations alive at the end of forward by module (first `limit` rows), in binary units."""
    shown = step.end_of_forward_activations.head(limit).copy()
    shown["activation_bytes"] = shown["activation_bytes"].map(format_bytes)
    return shown.to_html(index=False, classes="train-forward-activations", border=0)


def train_step_html(step: TrainStep) -> str:
    """The notebook repr: headline, stacked bar, per-module table; then the end of forward: its
    headline, stacked bar and activations by module."""
    head = html.escape(summary_text(step).splitlines()[0])
    forward = html.escape(end_of_forward_text(step))
    return (
        f"<div class='train-step'><p><b>{head}</b></p>{stacked_bar_svg(step.peak)}{modules_html(step)}"
        f"<p><b>{forward}</b></p>{stacked_bar_svg(step.end_of_forward)}{forward_activations_html(step)}</div>"
    )
