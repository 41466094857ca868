"""Memory tab's Parallel layouts panel: the plan's table, a layout's bars against the budget, its exports.

One small deferred Llama (hidden 64, 4 heads, 2 key-value heads, 6 layers, vocabulary 256) planned
once per module on 4 GPUs of 2 MiB, inputs 2x16, over FSDP 1 and 4, TP 1, 2 and 4, PP 1, no
checkpointing: 4 layouts, some fit, some are over budget, and TP 4 cannot run (2 key-value heads).
What the layouts measure is the planner's (`direct` calls `plan_parallel` with the same arguments);
what the tests pin is the panel: its order, formatting, colours, wording and drawing.
"""

from __future__ import annotations

import html
import re

import pytest
import torch
import transformers

import explorer
import widgets
from explorer.analysis.layout_export import to_python, to_torchtitan
from explorer.analysis.parallel_plan import TABLE_COLUMNS, plan_parallel
from widgets.formatting import bytes_text, count_text, frame_rows, seconds_text
from widgets.plan_panel import (
    blocks_expression,
    model_tp_plan,
    parse_degrees,
    parse_gpus,
    parse_modes,
)

SEARCH = {"fsdp": (1, 4), "tp": (1, 2, 4), "pp": (1,), "activation_checkpointing": ("none",)}
BUDGET = 2 * 2**20


def _llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256,
    )  # fmt: skip
    return explorer.deferred_init(transformers.LlamaForCausalLM, config)


@pytest.fixture(scope="module")
def planned() -> widgets.ExplorerWidget:
    """The explorer of the small Llama with its panel filled in and "Plan layouts" clicked."""
    torch.manual_seed(0)
    ui = widgets.ExplorerWidget(_llama())
    panel = ui.memory_tab.plan_panel
    panel.gpus.value, panel.gpu_memory.value, panel.shapes.value = "4", "2MiB", "2x16"
    panel.fsdp.value, panel.tp.value, panel.pp.value, panel.checkpointing.value = "1, 4", "1, 2 4", "1", "none"
    panel.run_button.click()
    return ui


@pytest.fixture(scope="module")
def direct(planned: widgets.ExplorerWidget):
    """`plan_parallel` called directly, as the panel should have called it."""
    ids = torch.zeros(2, 16, dtype=torch.long)
    return plan_parallel(planned.module, ids, gpus=4, gpu_memory=BUDGET, labels=ids, **SEARCH)


def _verdict(plan, result) -> str:
    return "cannot run" if not result.valid else "fits" if plan.fits(result) else "over budget"


def _first(plan, verdict: str):
    """The first layout of `plan`'s order with `verdict`; the search is chosen so each verdict occurs."""
    return next(result for result in plan.ordered() if _verdict(plan, result) == verdict)


def test_the_table_is_the_plans_rows_fitting_layouts_first_with_bytes_formatted(planned, direct):
    table = planned.memory_tab.plan_panel.table
    formats = {"peak_bytes": bytes_text, "headroom_bytes": bytes_text, "communication_bytes": bytes_text,
               "exposed_communication_s": seconds_text, "step_proxy_s": seconds_text, "recompute_flops": count_text}
    expected = direct.table()
    # the plan's columns, `problems` next to `fits` so an invalid layout's reason shows without scrolling
    assert table.columns == ["layout", "fits", "problems", "peak_bytes", "headroom_bytes", "slowest_rank",
                             "communication_bytes", "exposed_communication_s", "recompute_flops", "step_proxy_s",
                             "global_batch"]
    assert sorted(table.columns) == sorted(TABLE_COLUMNS)
    assert table.row_keys == expected["layout"].tolist()
    assert table.rows == frame_rows(expected, table.columns, formats)
    assert table.row_keys == [result.layout.label() for result in direct.ordered()]
    verdicts = [_verdict(direct, result) for result in direct.ordered()]
    assert {"fits", "over budget", "cannot run"} <= set(verdicts)  # the search shows every kind of row
    order = ["fits", "over budget", "cannot run"]
    assert verdicts == sorted(verdicts, key=order.index)  # fitting layouts first, the invalid ones last
    assert [row[1] for row in table.rows] == ["yes" if verdict == "fits" else "no" for verdict in verdicts]
    over = verdicts.index("over budget")
    assert table.rows[over][4] == f"-{bytes_text(direct.ordered()[over].peak_bytes - BUDGET)}"  # the shortfall
    assert explorer.is_deferred(planned.module)  # nothing was materialized


def test_the_status_counts_layouts_that_fit_do_not_and_cannot_run(planned, direct):
    panel = planned.memory_tab.plan_panel
    verdicts = [_verdict(direct, result) for result in direct.ordered()]
    fits, over, invalid = (verdicts.count(verdict) for verdict in ("fits", "over budget", "cannot run"))
    assert panel.status.value == (
        f"{fits} of {len(verdicts)} layouts fit on 4 × 2.0 MiB; {over} over budget, {invalid} cannot run (see problems)"
    )
    assert panel.run_button.disabled is False
    colours = {"fits": "#3fa34d", "over budget": "#e15759", "cannot run": "#9aa5b1"}
    assert panel.table.row_colours == [colours[verdict] for verdict in verdicts]


def test_an_invalid_layout_shows_its_problems_in_the_table(planned, direct):
    table = planned.memory_tab.plan_panel.table
    problems = dict(zip(table.row_keys, (row[2] for row in table.rows)))
    assert problems[_first(direct, "fits").layout.label()] == ""
    invalid = [result for result in direct.results if not result.valid]
    assert invalid and all(result.problems for result in invalid)
    assert {result.layout.label(): "; ".join(result.problems) for result in invalid}.items() <= problems.items()
    assert problems["FSDP 1 · TP 4 · PP 1 · AC none · mb 2 × 1"] == "2 key-value heads are not divisible by TP 4"


def test_selecting_a_row_shows_a_bar_per_rank_with_the_categories_and_the_budget_line(planned, direct):
    panel = planned.memory_tab.plan_panel
    result = _first(direct, "fits")
    label = result.layout.label()
    panel.table.selected = label  # what clicking the row sends
    (rank,) = result.ranks
    assert panel.layout_line.value == f"{label}: fits on 4 × 2.0 MiB"
    bars = panel.bars.value
    assert bars.count('class="de-parallel-rank"') == 1 and 'data-rank="every rank"' in bars
    assert bars.count('class="train-bar-segment"') == sum(1 for value in rank.peak.values() if value)
    for category, value in rank.peak.items():
        if value:
            assert f'data-category="{category}"' in bars and f"{category.replace('_', ' ')}: {bytes_text(value)}" in bars
    assert f'data-budget="{BUDGET}"' in bars
    assert f"every rank: peak {bytes_text(rank.peak_bytes)} in {rank.at}; fits in 2.0 MiB" in bars
    # the peak by part of the model, the largest part first, each with its bytes
    parts = sorted(rank.by_module, key=lambda part: -sum(rank.by_module[part].values()))
    assert re.findall(r'<tr data-part="([^"]+)">', bars) == [html.escape(part) for part in parts]
    layers = rank.by_module["model.layers"]
    assert f'<td style="text-align:right;white-space:nowrap">{bytes_text(sum(layers.values()))}</td>' in bars


def test_the_budget_line_and_bars_share_one_scale_across_layouts(planned, direct):
    panel = planned.memory_tab.plan_panel
    largest = max((result for result in direct.results if result.valid), key=lambda result: result.peak_bytes)
    assert largest.peak_bytes > BUDGET  # so the largest peak, not the budget, sets the scale
    panel.table.selected = largest.layout.label()  # the largest peak: full width
    assert 'class="train-bar" width="560"' in panel.bars.value
    assert f"left:{round(560 * BUDGET / largest.peak_bytes)}px" in panel.bars.value
    panel.table.selected = _first(direct, "fits").layout.label()  # a smaller one: the same budget line
    assert f"left:{round(560 * BUDGET / largest.peak_bytes)}px" in panel.bars.value
    assert 'class="train-bar" width="560"' not in panel.bars.value


def test_the_export_is_torchtitan_and_python_of_the_selected_layout(planned, direct):
    panel = planned.memory_tab.plan_panel
    layout = direct.ordered()[0].layout
    panel.table.selected = layout.label()
    assert panel.torchtitan.value == to_torchtitan(layout)
    assert panel.python.value == to_python(layout, blocks="model.model.layers", tp_plan=model_tp_plan(planned.module))


def test_the_export_areas_undo_edits(planned, direct):
    panel = planned.memory_tab.plan_panel
    panel.table.selected = direct.ordered()[0].layout.label()
    shown = panel.torchtitan.value
    panel.torchtitan.value = "edited"  # what typing in the browser sends
    assert panel.torchtitan.value == shown


def test_an_invalid_layout_selected_says_why_and_draws_no_bar(planned, direct):
    panel = planned.memory_tab.plan_panel
    invalid = _first(direct, "cannot run")
    panel.table.selected = invalid.layout.label()
    assert panel.layout_line.value == f"{invalid.layout.label()}: cannot run: {'; '.join(invalid.problems)}"
    assert panel.bars.value == ""
    assert "# cannot export to Python" not in panel.python.value  # the model's TP plan is used
    panel.table.selected = ""
    assert panel.layout_line.value == "click a layout to see its ranks and export it" and panel.torchtitan.value == ""


def test_the_models_tp_plan_and_blocks_are_read_from_the_root(planned):
    plan = model_tp_plan(planned.module)
    assert plan is not None and plan["model.layers.*.self_attn.q_proj"] == "colwise"
    assert blocks_expression(planned.module) == "model.model.layers"
    assert model_tp_plan(torch.nn.Linear(2, 2)) is None and blocks_expression(torch.nn.Linear(2, 2)) is None


@pytest.mark.parametrize(
    "field, text, message",
    [
        ("gpus", "0", "planning failed: ValueError: gpus must be a positive int, got 0"),
        ("gpus", "four", "planning failed: ValueError: cannot read 'four' as a number of GPUs (write e.g. 8)"),
        ("gpu_memory", "lots", "planning failed: ValueError: cannot read the budget 'lots': write bytes or a number "
                               "and a unit, e.g. '80GB', '80GiB', '512MiB'"),
        ("tp", "1, two", "planning failed: ValueError: cannot read '1, two' as TP degrees (write e.g. 1, 2, 4)"),
        ("checkpointing", "none, all", "planning failed: ValueError: 'all' is not a checkpointing mode (write some "
                                       "of none, block, selective)"),
        ("shapes", "", "planning failed: ValueError: no input shapes given (write one micro-batch, e.g. 1x512)"),
    ],
)
def test_bad_input_is_reported_in_the_status_line(field, text, message):
    torch.manual_seed(0)
    panel = widgets.ExplorerWidget(_llama()).memory_tab.plan_panel
    panel.shapes.value = "2x16"
    getattr(panel, field).value = text
    panel.run_button.click()
    assert panel.status.value == message
    assert panel.last_plan is None and panel.table.rows == [] and panel.run_button.disabled is False


@pytest.mark.parametrize("text, degrees", [("1, 2, 4", (1, 2, 4)), ("8", (8,)), ("1 2;4", (1, 2, 4)), ("", None)])
def test_parse_degrees(text, degrees):
    assert parse_degrees(text, "TP") == degrees


def test_parse_gpus_and_modes():
    assert parse_gpus(" 16 ") == 16
    assert parse_modes("none block") == ("none", "block") and parse_modes("") is None


def test_the_button_is_disabled_with_a_busy_line_while_planning(monkeypatch):
    import explorer.analysis.parallel_plan as parallel_plan

    seen = []

    def stand_in(*args, **kwargs):
        seen.append((panel.run_button.disabled, panel.status.value, kwargs["gpus"], kwargs["fsdp"], kwargs["tp"]))
        raise RuntimeError("stopped by the test")

    monkeypatch.setattr(parallel_plan, "plan_parallel", stand_in)
    torch.manual_seed(0)
    panel = widgets.ExplorerWidget(_llama()).memory_tab.plan_panel
    panel.gpus.value, panel.shapes.value, panel.tp.value = "16", "1x8", "1 2 4"
    panel.run_button.click()
    assert seen == [(True, "planning: fake training steps for the layouts (seconds to a minute)…", 16, None, (1, 2, 4))]
    assert panel.precision.value == "none"
    assert panel.status.value == "planning failed: RuntimeError: stopped by the test"
    assert panel.run_button.disabled is False


def test_degrees_that_make_no_layout_of_the_gpus_say_so():
    torch.manual_seed(0)
    panel = widgets.ExplorerWidget(_llama()).memory_tab.plan_panel
    panel.gpus.value, panel.shapes.value, panel.fsdp.value, panel.tp.value, panel.pp.value = "4", "2x16", "3", "1", "1"
    panel.run_button.click()
    assert panel.status.value == "no layout: no product of the FSDP, TP and PP degrees typed divides 4 GPUs"
    assert panel.table.rows == [] and panel.last_plan is not None and panel.last_plan.results == ()


def test_bf16_precision_plans_every_layout_with_fsdp2s_policy_and_exports_it():
    torch.manual_seed(0)
    panel = widgets.ExplorerWidget(_llama()).memory_tab.plan_panel
    panel.gpus.value, panel.shapes.value, panel.fsdp.value, panel.tp.value, panel.pp.value = "4", "2x16", "4", "1", "1"
    panel.checkpointing.value, panel.precision.value = "none", "bfloat16"
    panel.run_button.click()
    plan = panel.last_plan
    assert plan is not None and [result.layout.mixed_precision for result in plan.results] == ["bfloat16"]
    assert panel.table.row_keys == ["FSDP 4 · TP 1 · PP 1 · AC none · mb 2 × 1 · bf16"]
    panel.table.selected = panel.table.row_keys[0]
    assert 'mixed_precision_param = "bfloat16"' in panel.torchtitan.value
    assert "mp_policy=policy" in panel.python.value
