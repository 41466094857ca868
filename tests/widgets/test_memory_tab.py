"""Memory tab: bytes of the selection (each storage once), module rows, dry run and device plan."""

import pytest
import torch
from torch import nn

import explorer
import widgets
from widgets.formatting import bytes_text
from widgets.memory_tab import parse_shapes


def test_totals_count_a_tied_storage_once(ui):
    assert ui.memory_tab.totals.value == \
        "whole module: 1.0 KiB — by device: cpu 1.0 KiB — by state: fake 1.0 KiB"
    ui.select("embed")
    ui.tree.set_checked("head", True)  # head.weight is embed.weight: 160 B, not 320 B
    assert ui.memory_tab.totals.value == "selection: 160 B — by device: cpu 160 B — by state: fake 160 B"


def test_totals_split_by_state_after_materializing_part(ui):
    ui.select("blocks.0.mlp")
    ui.materialize_selected(wait=True)
    ui.select("blocks.0")
    assert ui.memory_tab.totals.value == \
        "selection: 416 B — by device: cpu 416 B — by state: fake 112 B, materialized 304 B"


def test_rows_are_each_selected_subtree_top_and_its_children(ui):
    ui.select("blocks.1")
    ui.tree.set_checked("head", True)
    table = ui.memory_tab.table
    assert table.columns == ["name", "class", "total_params", "bytes", "bytes_by_device", "materialized", "state"]
    assert table.rows == [
        ["blocks.1", "Block", "104", "416 B", "cpu 416 B", "0.0%", "fake"],
        ["blocks.1.attn", "Linear", "20", "80 B", "cpu 80 B", "0.0%", "fake"],
        ["blocks.1.mlp", "Sequential", "76", "304 B", "cpu 304 B", "0.0%", "fake"],
        ["blocks.1.norm", "LayerNorm", "8", "32 B", "cpu 32 B", "0.0%", "fake"],
        ["head", "Linear", "40", "160 B", "cpu 160 B", "0.0%", "fake"],
    ]


def test_nothing_selected_lists_the_root_and_its_children(ui):
    assert ui.memory_tab.table.row_keys == ["", "embed", "blocks", "head"]


def test_dry_run_shows_the_fake_forward_of_the_typed_shapes():
    torch.manual_seed(0)
    ui = widgets.explore(lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    ui.memory_tab.input_dtype.value = "float32"
    ui.memory_tab.shapes.value = "3x4"
    ui.memory_tab.dry_run_button.click()
    # 2·3·4·8 + 2·3·8·2 multiply-adds
    assert ui.memory_tab.dry_run_status.value.startswith("dry run: 288 FLOPs, peak activations ")
    assert explorer.is_deferred(ui.module)  # nothing was materialized


def test_device_plan_uses_the_typed_budgets():
    torch.manual_seed(0)
    ui = widgets.explore(lambda: nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)))  # 160 B, 72 B
    ui.memory_tab.budgets.value = "meta=200B, cpu=1GB"
    ui.memory_tab.plan_button.click()
    plan = ui.memory_tab.last_plan
    assert plan.device_for("0.weight") == "meta" and plan.device_for("1.weight") == "cpu"
    assert ui.memory_tab.plan_status.value == f"device plan: {len(plan.device_map)} entries"


def test_unreadable_budget_is_reported(ui):
    ui.memory_tab.budgets.value = "cuda:0"
    ui.memory_tab.plan_button.click()
    assert ui.memory_tab.plan_status.value == \
        "device plan failed: ValueError: cannot read 'cuda:0' as a budget (write cuda:0=20GB)"


def test_bad_input_shape_is_reported(ui, monkeypatch):
    ui.memory_tab.shapes.value = "2xq"
    ui.memory_tab.dry_run_button.click()
    assert ui.memory_tab.dry_run_status.value == \
        "dry run failed: ValueError: cannot read '2xq' as a shape (write 1x16 or (1, 16))"


@pytest.mark.parametrize("text, shapes", [("1x16", [(1, 16)]), ("1x16, 2x3x4", [(1, 16), (2, 3, 4)]),
                                          ("(1, 16), (2, 3, 4)", [(1, 16), (2, 3, 4)]), ("", [])])
def test_parse_shapes(text, shapes):
    assert parse_shapes(text) == shapes


def test_clicking_a_module_row_drills_down_into_it(ui):
    ui.select("blocks")
    ui.memory_tab.table.selected = "blocks.1"  # what clicking the row sends
    assert ui.tree.active == "blocks.1"
    assert ui.memory_tab.table.row_keys == ["blocks.1", "blocks.1.attn", "blocks.1.mlp", "blocks.1.norm"]
    assert ui.memory_tab.table.selected == ""


# -- Training step panel ---------------------------------------------------------------------------
def _train_ui(world_size: int = 1):
    torch.manual_seed(0)
    ui = widgets.explore(lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    panel = ui.memory_tab.train_panel
    panel.shapes.value = "3x4"
    panel.input_dtype.value = "float32"
    panel.world_size.value = world_size
    return ui, panel


def test_training_step_panel_shows_the_verdict_bar_and_module_table():
    ui, panel = _train_ui()
    panel.budget.value = "1GB"
    panel.run_button.click()
    step = panel.last_step
    expected = explorer.train_step(ui.module, torch.empty(3, 4))
    assert step.peak == expected.peak and step.peak_bytes == expected.peak_bytes
    assert panel.verdict.value == f"fits on 1 × 1GB (peak {bytes_text(step.peak_bytes)} per device); peak in the optimizer"
    segments = panel.bar.value.count('class="train-bar-segment"')
    assert segments == sum(1 for value in step.peak.values() if value)
    assert 'data-category="optimizer_state"' in panel.bar.value
    assert panel.table.row_keys == ["", "0", "1", "2"]
    assert panel.table.columns == ["name", "class", "calls", "forward_peak_bytes", "backward_peak_bytes",
                                   "activation_bytes"]
    assert explorer.is_deferred(ui.module)  # nothing was materialized


def test_training_step_panel_shows_the_end_of_forward_beside_the_peak_with_activations_by_module():
    _, panel = _train_ui()
    panel.run_button.click()
    step = panel.last_step
    assert panel.peak_text.value == f"peak of the step (in the optimizer): {bytes_text(step.peak_bytes)}"
    # parameters 232 B, inputs 48 B, activations 124 B: the ReLU's output, the loss and the model's
    # output, which the training loop holds (`out = model(x)`) through backward and the optimizer step
    assert panel.forward_text.value == "end of forward (backward starts): 404 B, activations 124 B"
    assert 'data-category="activations"' in panel.forward_bar.value
    # the peak, in the optimizer, keeps only what the loop still holds: the output (24 B) and the loss
    assert step.peak["activations"] == 28 and 'data-category="activations"' in panel.bar.value
    assert panel.forward_bar.value.count('class="train-bar-segment"') == 3
    assert "activations: 124 B" in panel.forward_bar.value  # the legend
    assert panel.forward_table.row_keys == ["1", "2", "(outside modules)"]  # 2: the output the loop holds
    assert panel.forward_table.columns == ["name", "class", "activation_bytes"]


def test_training_step_panel_measures_the_loop_it_is_given():
    ui, panel = _train_ui()
    panel.keep_outputs.value = False
    panel.accumulation.value = 3
    panel.run_button.click()
    step = panel.last_step
    expected = explorer.train_step(ui.module, torch.empty(3, 4), keep_outputs=False, accumulation_steps=3)
    assert (step.keep_outputs, step.accumulation_steps) == (False, 3)
    assert step.peak == expected.peak and step.peak_bytes == expected.peak_bytes
    assert step.peak["activations"] == 0  # nothing of the loop's is held through the optimizer step
    panel.keep_outputs.value = True
    panel.run_button.click()
    assert panel.last_step.peak["activations"] == 28  # the output (24 B) and the loss, held


def test_training_step_panel_says_when_it_does_not_fit_on_n_devices():
    ui, panel = _train_ui(world_size=2)
    panel.optimizer.value = "SGD"
    panel.budget.value = "100B"
    panel.run_button.click()
    step = panel.last_step
    assert step.world_size == 2 and step.optimizer == "SGD"
    assert panel.verdict.value == (
        f"does not fit on 2 × 100B (peak {bytes_text(step.peak_bytes)} per device); peak in the {step.phase}"
    )
    assert 'data-category="sharded_parameters"' in panel.bar.value


def test_training_step_panel_reports_a_bad_budget_and_missing_inputs():
    _, panel = _train_ui()
    panel.budget.value = "lots"
    panel.run_button.click()
    assert panel.verdict.value == ("training step failed: ValueError: cannot read the budget 'lots': write bytes or a "
                                   "number and a unit, e.g. '80GB', '80GiB', '512MiB'")
    panel.shapes.value = ""
    panel.run_button.click()
    assert panel.verdict.value == "training step failed: ValueError: no input shapes given (write e.g. 1x512)"


def test_training_step_panel_gives_hugging_face_models_their_labels():
    from widgets.train_panel import takes_labels
    from tests.support.hf_configs import HF_BY_NAME

    arch = HF_BY_NAME["llama"]
    torch.manual_seed(0)
    ui = widgets.explore(arch.cls, arch.config())
    panel = ui.memory_tab.train_panel
    assert takes_labels(ui.module) and not takes_labels(nn.Linear(2, 2))
    panel.shapes.value = "2x8"
    panel.run_button.click()
    ids = torch.zeros(2, 8, dtype=torch.long)
    assert panel.last_step.peak == explorer.train_step(ui.module, ids, labels=ids).peak
