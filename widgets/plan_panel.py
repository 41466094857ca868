"""The Memory tab's "Parallel layouts" panel: which FSDP × TP × PP × checkpointing layout fits on N GPUs?

The user types the GPUs, the memory of each, one micro-batch's input shapes (as the training step
panel reads them) and, optionally, the search space (FSDP, TP and PP degrees, checkpointing modes);
"Plan layouts" calls `explorer.analysis.parallel_plan.plan_parallel` in the kernel (fake training
steps: the module is not changed; it takes seconds to a minute, run in the click like the training
step, with the button disabled and a busy line meanwhile). The table is `ParallelPlan.table()`, the
layouts that fit first; an invalid layout keeps its row, with its `problems`. Clicking a row shows
a stacked bar per kind of rank (`RankPeak.peak`, drawn by `train_render.stacked_bar_svg`) on a
scale shared by every layout, with the budget as a line, and under it the peak by part of the model
(`RankPeak.by_module`, the largest part first), and the layout exported as torchtitan TOML
and as Python (`layout_export`), in text areas the user can select and copy but not edit.

The planner loads torch.distributed's tools, so it is imported when a plan first runs (see
tests/widgets/test_imports.py).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

import ipywidgets as w
from torch import nn

from explorer.analysis.layout_export import to_python, to_torchtitan
from explorer.analysis.parallel_layout import ActivationCheckpointing, Layout
from explorer.analysis.train_render import BAR_HEIGHT, category_label, stacked_bar_svg

from .formatting import bytes_text, count_text, seconds_text
from .table import DataTable
from .train_panel import OPTIMIZERS, InputReader, OptimizerName, takes_labels

if TYPE_CHECKING:
    from explorer.analysis.parallel_plan import LayoutResult, ParallelPlan, RankPeak

BAR_WIDTH = 560
BUDGET_COLOUR = "#222"
# A layout's verdict: it fits the budget, it runs but needs more, or the model does not allow it.
Verdict = Literal["fits", "over budget", "cannot run"]
# Row colours (the row's left edge) by verdict (a `verdict` column added to the plan's table, not shown).
VERDICT_COLOURS: dict[str, str] = {"fits": "#3fa34d", "over budget": "#e15759", "cannot run": "#9aa5b1"}
FORMATS = {
    "peak_bytes": bytes_text,
    "headroom_bytes": bytes_text,
    "communication_bytes": bytes_text,
    "exposed_communication_s": seconds_text,
    "recompute_flops": count_text,
    "step_proxy_s": seconds_text,
}
LABELS = {
    "peak_bytes": "peak",
    "headroom_bytes": "headroom",
    "slowest_rank": "slowest rank",
    "communication_bytes": "communication",
    "exposed_communication_s": "exposed comm.",
    "recompute_flops": "recompute FLOPs",
    "step_proxy_s": "step proxy",
    "global_batch": "global batch",
}


def shown_columns(columns: Sequence[str]) -> list[str]:
    """The plan's table columns with `problems` moved next to `fits`: the numbers run wider than the
    Memory tab, and an invalid layout's reason must show without scrolling (style.css wraps it)."""
    rest = [column for column in columns if column not in ("layout", "fits", "problems")]
    return ["layout", "fits", "problems", *rest]


# -- reading the fields ----------------------------------------------------------------------------
def parse_gpus(text: str) -> int:
    """ "8" → 8. ValueError names the text when it is not a whole number (plan_parallel rejects < 1)."""
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a number of GPUs (write e.g. 8)") from None


def parse_degrees(text: str, what: str) -> tuple[int, ...] | None:
    """ "1, 2, 4" → (1, 2, 4); "" → None (plan_parallel's default). ValueError names `what` and the part."""
    parts = [part for part in re.split(r"[,;\s]+", text.strip()) if part]
    if not parts:
        return None
    try:
        return tuple(int(part) for part in parts)
    except ValueError:
        raise ValueError(f"cannot read {text!r} as {what} degrees (write e.g. 1, 2, 4)") from None


def parse_modes(text: str) -> tuple[ActivationCheckpointing, ...] | None:
    """ "none, block" → ("none", "block"); "" → None. ValueError names an unknown mode and the known ones."""
    known = get_args(ActivationCheckpointing)
    modes = [part for part in re.split(r"[,;\s]+", text.strip()) if part]
    for mode in modes:
        if mode not in known:
            raise ValueError(f"{mode!r} is not a checkpointing mode (write some of {', '.join(known)})")
    return tuple(modes) if modes else None  # type: ignore[arg-type]  # checked against `known` above


# -- what the export needs to know of the model ------------------------------------------------------
def blocks_expression(module: nn.Module) -> str | None:
    """The repeated blocks as `to_python` names them ("model.model.layers"); None when the model has
    none in a container below the root."""
    from explorer.analysis.fake_fsdp import repeated_blocks

    blocks = repeated_blocks(module)
    container = blocks[0][0].rpartition(".")[0] if blocks else ""
    return f"model.{container}" if container else None


def model_tp_plan(module: nn.Module) -> dict[str, str] | None:
    """A transformers model's tensor-parallel plan with paths from the root: its config's
    `base_model_tp_plan` under the base model's attribute (`model.` for a `LlamaForCausalLM`)."""
    plan = getattr(getattr(module, "config", None), "base_model_tp_plan", None)
    if not plan:
        return None
    prefix = getattr(module, "base_model_prefix", "")
    under = prefix if prefix and isinstance(getattr(module, prefix, None), nn.Module) else ""
    return {f"{under}.{key}" if under else key: style for key, style in plan.items()}


def export_texts(layout: Layout, module: nn.Module) -> tuple[str, str]:
    """(torchtitan TOML, Python source) of `layout`; an export the layout does not allow reads as a
    comment saying why."""
    try:
        titan = to_torchtitan(layout)
    except ValueError as error:
        titan = f"# cannot export to torchtitan: {error}"
    blocks = blocks_expression(module)
    if blocks is None:
        return titan, f"# cannot export to Python: {type(module).__name__} has no repeated blocks in a container"
    try:
        source = to_python(layout, blocks=blocks, tp_plan=model_tp_plan(module))
    except ValueError as error:
        source = f"# cannot export to Python: {error}"
    return titan, source


# -- drawing a layout ------------------------------------------------------------------------------
def bar_scale(plan: ParallelPlan) -> int:
    """Bytes the full bar width stands for: the budget or the largest peak of the plan, whichever is more
    (one scale for every layout, so their bars compare)."""
    return max([plan.gpu_memory, *(result.peak_bytes for result in plan.results)]) or 1


def rank_html(rank: RankPeak, budget: int, scale: int) -> str:
    """One kind of rank: a line saying its peak and headroom, its stacked bar (by category) drawn to
    `scale`, and the budget as a vertical line across it."""
    verdict = "fits" if rank.peak_bytes <= budget else "does not fit"
    headline = (
        f"{rank.rank}: peak {bytes_text(rank.peak_bytes)} in {rank.at or 'the ' + rank.phase}; {verdict} "
        f"in {bytes_text(budget)} (headroom {bytes_text(budget - rank.peak_bytes)})"
    )
    width = max(1, round(BAR_WIDTH * rank.peak_bytes / scale))
    budget_x = round(BAR_WIDTH * budget / scale)
    line = (
        f'<div class="de-parallel-budget-line" data-budget="{budget}" title="budget {bytes_text(budget)}" '
        f'style="position:absolute;left:{budget_x}px;top:-3px;height:{BAR_HEIGHT + 6}px;'
        f'border-left:2px dashed {BUDGET_COLOUR}"></div>'
    )
    return (
        f'<div class="de-parallel-rank" data-rank="{html.escape(rank.rank)}">'
        f"<div>{html.escape(headline)}</div>"
        f'<div style="position:relative;width:{BAR_WIDTH}px">{stacked_bar_svg(rank.peak, width=width)}{line}</div>'
        f"{modules_html(rank)}</div>"
    )


def modules_html(rank: RankPeak) -> str:
    """The rank's peak by part of the model (`RankPeak.by_module`), the largest part first: its bytes
    and its categories, largest first."""
    rows = []
    for part, by_category in sorted(rank.by_module.items(), key=lambda item: -sum(item[1].values())):
        categories = ", ".join(
            f"{category_label(category)} {bytes_text(value)}"
            for category, value in sorted(by_category.items(), key=lambda item: -item[1])
        )
        rows.append(
            f'<tr data-part="{html.escape(part)}"><td style="white-space:nowrap">{html.escape(part)}</td>'
            f'<td style="text-align:right;white-space:nowrap">{bytes_text(sum(by_category.values()))}</td>'
            f"<td>{html.escape(categories)}</td></tr>"
        )
    if not rows:
        return ""
    head = "".join(
        f'<th style="text-align:left;white-space:nowrap;padding-right:12px">{name}</th>'
        for name in ("module", "at the peak", "by category")
    )
    return f'<table class="de-parallel-modules" style="font-size:12px"><tr>{head}</tr>{"".join(rows)}</table>'


def layout_text(result: LayoutResult, plan: ParallelPlan) -> str:
    """The selected layout's line: its name and verdict, or why it cannot run."""
    name = result.layout.label()
    if not result.valid:
        return f"{name}: cannot run: {'; '.join(result.problems)}"
    verdict = "fits" if plan.fits(result) else "does not fit"
    return f"{name}: {verdict} on {plan.gpus} × {bytes_text(plan.gpu_memory)}"


def verdict_of(plan: ParallelPlan, result: LayoutResult) -> Verdict:
    """Whether `result`'s layout fits `plan`'s budget, needs more, or cannot run."""
    return "cannot run" if not result.valid else "fits" if plan.fits(result) else "over budget"


def plan_summary(plan: ParallelPlan, verdicts: Sequence[Verdict]) -> str:
    """The status line after a plan: how many layouts fit, are over budget, cannot run; or that the
    degrees typed make no layout of exactly `plan.gpus` GPUs."""
    if not verdicts:
        return f"no layout: no product of the FSDP, TP and PP degrees typed divides {plan.gpus} GPUs"
    count = {verdict: list(verdicts).count(verdict) for verdict in get_args(Verdict)}
    return (
        f"{count['fits']} of {len(verdicts)} layouts fit on {plan.gpus} × {bytes_text(plan.gpu_memory)}; "
        f"{count['over budget']} over budget, {count['cannot run']} cannot run (see problems)"
    )


def _compact(width: int) -> dict[str, Any]:
    """A field `width` pixels wide whose label takes only its text's width (two rows of fields fit the tab)."""
    return {"layout": w.Layout(width=f"{width}px"), "style": {"description_width": "initial"}}


def _text_field(value: str, description: str, width: int, css_class: str, placeholder: str = "") -> w.Text:
    field = w.Text(value=value, placeholder=placeholder, description=description, **_compact(width))
    field.add_class(css_class)
    return field


def _export_area(css_class: str) -> w.Textarea:
    area = w.Textarea(value="", rows=14, layout=w.Layout(width="48%"))
    area.add_class(css_class)
    return area


class PlanPanel(w.VBox):
    """GPUs, memory per GPU, inputs and search space in; the plan's table out; a clicked row's bars
    per rank against the budget and its torchtitan / Python export."""

    def __init__(self, module: nn.Module, read_inputs: InputReader) -> None:
        self.module, self.read_inputs = module, read_inputs
        self.last_plan: ParallelPlan | None = None
        self._exports: dict[str, str] = {}  # what each export area must show (edits are undone)
        self._build_fields()
        self._build_outputs()
        super().__init__(
            [
                w.HTML("<b>Parallel layouts</b>"),
                w.HBox([self.gpus, self.gpu_memory, self.shapes, self.input_dtype]),
                w.HBox([self.optimizer, self.fsdp, self.tp, self.pp, self.checkpointing]),
                w.HBox([self.precision, self.run_button, self.status]),
                self.table,
                self.proxy_note,
                self.layout_line,
                self.bars,
                w.HBox([self.torchtitan, self.python]),
            ]
        )
        self.add_class("de-parallel-panel")

    def _build_fields(self) -> None:
        self.gpus = _text_field("8", "GPUs", 100, "de-parallel-gpus")
        self.gpu_memory = _text_field("80GB", "per GPU", 150, "de-parallel-memory")
        self.shapes = _text_field("", "inputs", 220, "de-parallel-shapes", placeholder="micro-batch, e.g. 1x512")
        self.input_dtype = w.Dropdown(
            options=["int64", "float32", "bfloat16", "float16"], value="int64", description="dtype", **_compact(140)
        )
        self.optimizer = w.Dropdown(
            options=list(get_args(OptimizerName)), value="AdamW", description="optimizer", **_compact(220)
        )
        self.fsdp = _text_field("", "FSDP", 170, "de-parallel-fsdp", placeholder="powers of 2 ≤ GPUs")
        self.tp = _text_field("1, 2, 4, 8", "TP", 120, "de-parallel-tp")
        self.pp = _text_field("1, 2, 4", "PP", 110, "de-parallel-pp")
        self.checkpointing = _text_field("none, block", "AC", 170, "de-parallel-ac")
        self.precision = w.Dropdown(  # Layout.mixed_precision: bf16 is FSDP2's policy, as torchtitan's default
            options=[("model dtype", "none"), ("bf16 (FSDP2)", "bfloat16")],
            value="none",
            description="precision",
            **_compact(210),
        )
        self.precision.add_class("de-parallel-precision")

    def _build_outputs(self) -> None:
        self.run_button = w.Button(description="Plan layouts")
        self.run_button.add_class("de-parallel-button")
        self.status = w.Label("")
        self.status.add_class("de-parallel-status")
        self.table = DataTable(limit=200)
        self.table.add_class("de-parallel-table")
        self.proxy_note = w.Label("")
        self.layout_line = w.Label("")
        self.layout_line.add_class("de-parallel-layout")
        self.bars = w.HTML("")
        self.bars.add_class("de-parallel-bars")
        self.torchtitan = _export_area("de-parallel-torchtitan")
        self.python = _export_area("de-parallel-python")
        for area in (self.torchtitan, self.python):
            area.observe(self._undo_edit, names="value")
        self.run_button.on_click(lambda _: self.run())
        self.table.observe(lambda change: self.show_layout(change["new"]), names="selected")

    def run(self) -> None:
        """`plan_parallel` with the panel's fields, the button disabled meanwhile; a failure is shown
        in the status line and leaves the last plan on screen."""
        self.run_button.disabled = True
        self.status.value = "planning: fake training steps for the layouts (seconds to a minute)…"
        try:
            plan = self._plan()
        except Exception as error:  # shown to the user; the widget stays usable
            self.status.value = f"planning failed: {type(error).__name__}: {error}"
            return
        finally:
            self.run_button.disabled = False
        self.last_plan = plan
        self._show_plan(plan)

    def _plan(self) -> ParallelPlan:
        from explorer.analysis.parallel_plan import plan_parallel

        inputs = self.read_inputs(self.shapes.value, self.input_dtype.value)
        if not inputs:
            raise ValueError("no input shapes given (write one micro-batch, e.g. 1x512)")
        labels: dict[str, Any] = {"labels": inputs[0]} if takes_labels(self.module) else {}
        space: dict[str, Any] = {
            "tp": parse_degrees(self.tp.value, "TP"),
            "pp": parse_degrees(self.pp.value, "PP"),
            "activation_checkpointing": parse_modes(self.checkpointing.value),
        }
        return plan_parallel(
            self.module,
            *inputs,
            gpus=parse_gpus(self.gpus.value),
            gpu_memory=self.gpu_memory.value,
            optimizer=OPTIMIZERS[self.optimizer.value],
            fsdp=parse_degrees(self.fsdp.value, "FSDP"),
            mixed_precision=self.precision.value,
            **{name: value for name, value in space.items() if value is not None},
            **labels,
        )

    def _show_plan(self, plan: ParallelPlan) -> None:
        from explorer.analysis.parallel_plan import TABLE_COLUMNS

        frame = plan.table()
        frame["verdict"] = [verdict_of(plan, result) for result in plan.ordered()]
        self.status.value = plan_summary(plan, frame["verdict"].tolist())
        self.proxy_note.value = plan.proxy_note
        self.table.selected = ""
        self.table.show(
            frame,
            shown_columns(TABLE_COLUMNS),
            key="layout",
            formats=FORMATS,
            colour=VERDICT_COLOURS,
            colour_by="verdict",
            labels=LABELS,
            paths=(),
        )
        self.show_layout("")

    def result_for(self, label: str) -> LayoutResult | None:
        """The last plan's result for the layout named `label` (None for "" or an unknown name)."""
        results = self.last_plan.results if self.last_plan is not None else ()
        return next((result for result in results if result.layout.label() == label), None)

    def show_layout(self, label: str) -> None:
        """The layout named `label` (a table row's key): its line, a bar per kind of rank, its exports;
        nothing for "" (no row selected)."""
        result, plan = self.result_for(label), self.last_plan
        if result is None or plan is None:
            self.layout_line.value, self.bars.value = ("click a layout to see its ranks and export it", "")
            self._set_exports("", "")
            return
        self.layout_line.value = layout_text(result, plan)
        scale = bar_scale(plan)
        key = f'<div class="de-parallel-bar-key">dashed line: the budget, {bytes_text(plan.gpu_memory)} per GPU</div>'
        ranks = "".join(rank_html(rank, plan.gpu_memory, scale) for rank in result.ranks)
        self.bars.value = key + ranks if ranks else ""
        self._set_exports(*export_texts(result.layout, self.module))

    def _set_exports(self, titan: str, source: str) -> None:
        self._exports = {"torchtitan": titan, "python": source}
        self.torchtitan.value, self.python.value = titan, source

    def _undo_edit(self, change: dict) -> None:
        """Keep the export areas read-only: an edit typed in the browser is replaced by the export."""
        which = "torchtitan" if change["owner"] is self.torchtitan else "python"
        expected = self._exports.get(which, "")
        if change["new"] != expected:
            change["owner"].value = expected
