"""The Memory tab's "Training step" panel: will this model train on N devices of a given budget?

The user types input shapes, picks an optimizer, a world size, activation checkpointing, the loop
(outputs kept through the optimizer step, micro-batches) and a budget per device; "Run training
step" calls `explorer.train_step` in the kernel (fake tensors: the module is not changed) and shows
the verdict ("fits / does not fit on N × budget"), a stacked bar of the peak by category (SVG built
by `explorer.analysis.train_render`) and the per-module table; beside the peak, the end of forward
(what is alive when backward starts, activations at their most) with its
own bar, and a table of those activations by the module whose forward created them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal, get_args

import ipywidgets as w
import torch
from torch import nn

import explorer
from explorer.analysis.train_modules import FORWARD_ACTIVATION_COLUMNS, MODULE_COLUMNS
from explorer.analysis.train_render import end_of_forward_text, stacked_bar_svg

from .formatting import bytes_text
from .table import DataTable

OptimizerName = Literal["AdamW", "Adam", "SGD with momentum", "SGD", "Adagrad"]
OPTIMIZERS: dict[str, Callable] = {
    "AdamW": torch.optim.AdamW,
    "Adam": torch.optim.Adam,
    "SGD with momentum": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "SGD": lambda params: torch.optim.SGD(params, lr=0.01),
    "Adagrad": torch.optim.Adagrad,
}
# Reads the inputs text and dtype name into forward's positional inputs (the Memory tab's parser).
InputReader = Callable[[str, str], list[torch.Tensor]]


def takes_labels(module: nn.Module) -> bool:
    """Whether forward accepts `labels=` (Hugging Face models then compute their own loss)."""
    try:
        return "labels" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


BAR_WIDTH = 420  # two bars side by side: the step's peak and the end of forward


class TrainPanel(w.VBox):
    """Inputs, optimizer, world size, checkpointing and budget; a run shows verdict, bar and table
    for the step's peak, and beside them the end of forward with its activations by module."""

    def __init__(self, module: nn.Module, read_inputs: InputReader) -> None:
        self.module, self.read_inputs = module, read_inputs
        self.last_step: explorer.TrainStep | None = None
        self.shapes = w.Text(placeholder="input shapes, e.g. 1x512", description="inputs")
        self.shapes.add_class("de-train-shapes")
        self.input_dtype = w.Dropdown(
            options=["int64", "float32", "bfloat16", "float16"],
            value="int64",
            description="dtype",
            layout=w.Layout(width="180px"),
        )
        self.optimizer = w.Dropdown(
            options=list(get_args(OptimizerName)),
            value="AdamW",
            description="optimizer",
        )
        self.world_size = w.BoundedIntText(
            value=1,
            min=1,
            max=100_000,
            description="devices",
            layout=w.Layout(width="160px"),
        )
        self.world_size.add_class("de-train-world-size")
        self.checkpointing = w.Checkbox(value=False, description="activation checkpointing", indent=False)
        # The loop measured (train_step's keep_outputs, accumulation_steps): `out` and the loss held
        # through the optimizer step, as `out = model(x); out.loss.backward(); opt.step()` holds them.
        self.keep_outputs = w.Checkbox(value=True, description="outputs alive through the step", indent=False)
        self.keep_outputs.add_class("de-train-keep-outputs")
        self.accumulation = w.BoundedIntText(
            value=1,
            min=1,
            max=1024,
            description="micro-batches",
            style={"description_width": "initial"},
            layout=w.Layout(width="170px"),
        )
        self.accumulation.add_class("de-train-accumulation")
        self.budget = w.Text(value="80GB", description="budget", layout=w.Layout(width="200px"))
        self.budget.add_class("de-train-budget")
        self.run_button = w.Button(description="Run training step")
        self.run_button.add_class("de-train-button")
        self.verdict = w.Label("")
        self.verdict.add_class("de-train-verdict")
        self.bar = w.HTML("")
        self.bar.add_class("de-train-bar")
        self.table = DataTable(limit=200)
        self.table.add_class("de-train-table")
        self.peak_text = w.Label("")
        self.peak_text.add_class("de-train-peak-text")
        self.forward_text = w.Label("")
        self.forward_text.add_class("de-train-forward-text")
        self.forward_bar = w.HTML("")
        self.forward_bar.add_class("de-train-forward-bar")
        self.forward_heading = w.HTML("")
        self.forward_table = DataTable(limit=200)
        self.forward_table.add_class("de-train-forward-table")
        self.run_button.on_click(lambda _: self.run())
        super().__init__(
            [
                w.HTML("<b>Training step</b>"),
                w.HBox([self.shapes, self.input_dtype, self.optimizer]),
                w.HBox([self.world_size, self.checkpointing, self.keep_outputs, self.accumulation]),
                w.HBox([self.budget, self.run_button]),
                self.verdict,
                w.HBox(
                    [
                        w.VBox([self.peak_text, self.bar], layout=w.Layout(width=f"{BAR_WIDTH + 40}px")),
                        w.VBox([self.forward_text, self.forward_bar], layout=w.Layout(width=f"{BAR_WIDTH + 40}px")),
                    ]
                ),
                self.table,
                self.forward_heading,
                self.forward_table,
            ]
        )
        self.add_class("de-train-panel")

    def run(self) -> None:
        """`explorer.train_step` with the panel's choices; a failure is shown in the verdict line."""
        try:
            inputs = self.read_inputs(self.shapes.value, self.input_dtype.value)
            if not inputs:
                raise ValueError("no input shapes given (write e.g. 1x512)")
            labels: dict[str, Any] = {"labels": inputs[0]} if takes_labels(self.module) else {}
            step = explorer.train_step(
                self.module,
                *inputs,
                optimizer=OPTIMIZERS[self.optimizer.value],
                world_size=self.world_size.value,
                activation_checkpointing=self.checkpointing.value,
                keep_outputs=self.keep_outputs.value,
                accumulation_steps=self.accumulation.value,
                **labels,
            )
            verdict = step.verdict(self.budget.value)
        except Exception as error:  # shown to the user; the widget stays usable
            self.verdict.value = f"training step failed: {type(error).__name__}: {error}"
            return
        self.last_step = step
        self.verdict.value = f"{verdict}; peak in the {step.phase}"
        self.bar.value = stacked_bar_svg(step.peak, width=BAR_WIDTH)
        self.peak_text.value = f"peak of the step (in the {step.phase}): {bytes_text(step.peak_bytes)}"
        self.forward_text.value = end_of_forward_text(step)
        self.forward_bar.value = stacked_bar_svg(step.end_of_forward, width=BAR_WIDTH)
        self.forward_heading.value = "<b>Activations alive at the end of forward, by the module that created them</b>"
        self.table.show(
            step.modules,
            MODULE_COLUMNS,
            key="name",
            formats={
                "forward_peak_bytes": bytes_text,
                "backward_peak_bytes": bytes_text,
                "activation_bytes": bytes_text,
            },
        )
        self.forward_table.show(
            step.end_of_forward_activations,
            FORWARD_ACTIVATION_COLUMNS,
            key="name",
            formats={"activation_bytes": bytes_text},
        )
