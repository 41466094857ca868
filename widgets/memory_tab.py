"""Memory tab: bytes of the selection by module, device and state; dry run, device plan, training step,
parallel layouts.

Sizes are read from the inspection tables (each storage counted once). The dry run
(`explorer.dry_run`) runs on inputs of the shapes the user types; the device plan
(`explorer.plan_devices`) on the budgets they type, by default every present device's memory; the
training step (`explorer.train_step`, in `train_panel.py`) on inputs, optimizer, devices and budget;
the parallel layouts (`plan_parallel`, in `plan_panel.py`) on GPUs, memory per GPU and inputs.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

import ipywidgets as w
import pandas as pd
import torch
from torch import nn

import explorer

from .formatting import bytes_text, count_text, percent_text
from .plan_panel import PlanPanel
from .states import STATE_COLOURS, module_states
from .table import DataTable
from .train_panel import TrainPanel

COLUMNS = [
    "name",
    "class",
    "total_params",
    "bytes",
    "bytes_by_device",
    "materialized",
    "state",
]


def selection_bytes(tensors: pd.DataFrame, storages: pd.DataFrame, scope: Collection[str] | None) -> dict:
    """Bytes of the storages the selected modules' tensors live on, each storage once:
    {"total": int, "by_device": {device: int}, "by_state": {state: int}}."""
    names = tensors if scope is None else tensors[tensors["module"].isin(scope)]
    chosen = storages[storages["storage_id"].isin(set(names["storage_id"].tolist()))]
    return {
        "total": int(chosen["bytes"].sum()),
        "by_device": {k: int(v) for k, v in chosen.groupby("device")["bytes"].sum().items()},
        "by_state": {k: int(v) for k, v in chosen.groupby("state")["bytes"].sum().items()},
    }


def memory_rows(modules: pd.DataFrame, roots: Sequence[str] | None) -> pd.DataFrame:
    """Modules table rows of each selected subtree's top and its direct children (None: the root's)."""
    roots = [""] if not roots else list(roots)
    names = modules["name"]
    parents = names.str.rpartition(".")[0].where(names != "", None)
    mask = names.isin(roots) | parents.isin(roots)
    rows = modules[mask]
    states = module_states(rows)
    return rows.assign(state=states)


def default_budgets() -> str:
    """Budgets text for the devices present: each GPU's total memory, then the host's available memory."""
    import psutil

    parts = [
        f"cuda:{i}={torch.cuda.get_device_properties(i).total_memory // 2**30}GiB"
        for i in range(torch.cuda.device_count())
    ]
    parts.append(f"cpu={psutil.virtual_memory().available // 2**30}GiB")
    return ", ".join(parts)


def parse_budgets(text: str) -> dict[str | int | torch.device, int | str]:
    """ "cuda:0=20GB, cpu=64GB" → {"cuda:0": "20GB", "cpu": "64GB"}, in order. ValueError names the bad part."""
    budgets: dict[str | int | torch.device, int | str] = {}
    for part in (p.strip() for p in re.split(r"[,;]", text) if p.strip()):
        device, sep, size = part.partition("=")
        if not sep or not device.strip() or not size.strip():
            raise ValueError(f"cannot read {part!r} as a budget (write cuda:0=20GB)")
        budgets[device.strip()] = size.strip()
    if not budgets:
        raise ValueError("no budgets given (write e.g. cuda:0=20GB, cpu=64GB)")
    return budgets


def read_inputs(text: str, dtype_name: str) -> list[torch.Tensor]:
    """Forward inputs of the typed shapes and dtype: `torch.empty` (values are never read, and pages
    never written are not resident)."""
    dtype = getattr(torch, dtype_name)
    return [torch.empty(shape, dtype=dtype) for shape in parse_shapes(text)]


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """ "1x16, 2x3x4" or "(1, 16), (2, 3, 4)" → [(1, 16), (2, 3, 4)]. ValueError names the bad part."""
    parts = re.findall(r"\(([^)]*)\)", text) if "(" in text else re.split(r"[,;\s]+", text.strip())
    shapes = []
    for part in parts:
        sizes = [size for size in re.split(r"[x,\s]+", part.strip()) if size]
        if not sizes:
            continue
        try:
            shapes.append(tuple(int(size) for size in sizes))
        except ValueError:
            raise ValueError(f"cannot read {part!r} as a shape (write 1x16 or (1, 16))") from None
    return shapes


class MemoryTab(w.VBox):
    """Selection totals, a module size table, and the dry-run / device-plan / training-step / parallel-layout
    panels."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.totals = w.Label("")
        self.totals.add_class("de-memory-totals")
        self.table = DataTable()
        self.table.add_class("de-memory-table")
        self.shapes = w.Text(placeholder="input shapes, e.g. 1x128", description="inputs")
        self.input_dtype = w.Dropdown(
            options=["int64", "float32", "bfloat16", "float16"],
            value="int64",
            description="dtype",
            layout=w.Layout(width="180px"),
        )
        self.dry_run_button = w.Button(description="Dry run")
        self.dry_run_button.add_class("de-dry-run-button")
        self.dry_run_output = w.Output()
        self.dry_run_output.add_class("de-dry-run-output")
        self.dry_run_status = w.Label("")
        self.dry_run_status.add_class("de-dry-run-status")
        self.budgets = w.Text(
            value=default_budgets(),
            description="budgets",
            layout=w.Layout(width="420px"),
        )
        self.budgets.add_class("de-plan-budgets")
        self.plan_button = w.Button(description="Plan devices")
        self.plan_button.add_class("de-plan-button")
        self.plan_output = w.Output()
        self.plan_status = w.Label("")
        self.plan_status.add_class("de-plan-status")
        self.train_panel = TrainPanel(module, read_inputs)
        self.plan_panel = PlanPanel(module, read_inputs)
        self.dry_run_button.on_click(lambda _: self.dry_run())
        self.plan_button.on_click(lambda _: self.plan())
        super().__init__(
            [
                self.totals,
                self.table,
                w.HBox([self.shapes, self.input_dtype, self.dry_run_button]),
                self.dry_run_status,
                self.dry_run_output,
                w.HBox([self.budgets, self.plan_button, self.plan_status]),
                self.plan_output,
                self.train_panel,
                self.plan_panel,
            ]
        )
        self.add_class("de-memory-tab")

    def update(
        self,
        tensors: pd.DataFrame,
        modules: pd.DataFrame,
        storages: pd.DataFrame,
        scope: Collection[str] | None,
        roots: Sequence[str] | None,
    ) -> None:
        """Totals for `scope` (None: everything) and rows for the subtrees topped by `roots`."""
        amounts = selection_bytes(tensors, storages, scope)
        devices = ", ".join(f"{d} {bytes_text(n)}" for d, n in amounts["by_device"].items()) or "none"
        states = ", ".join(f"{s} {bytes_text(n)}" for s, n in amounts["by_state"].items()) or "none"
        what = "selection" if scope is not None else "whole module"
        self.totals.value = f"{what}: {bytes_text(amounts['total'])} — by device: {devices} — by state: {states}"
        self.table.show(
            memory_rows(modules, roots),
            COLUMNS,
            key="name",
            formats={
                "total_params": count_text,
                "bytes": bytes_text,
                "materialized": percent_text,
            },
            colour=STATE_COLOURS,
            colour_by="state",
        )

    def dry_run(self) -> None:
        """Fake forward pass with inputs of the typed shapes (`explorer.dry_run`), if available."""
        try:
            dtype = getattr(torch, self.input_dtype.value)
            inputs = [torch.zeros(shape, dtype=dtype) for shape in parse_shapes(self.shapes.value)]
            result = explorer.dry_run(self.module, *inputs)
        except Exception as error:  # shown to the user; the widget stays usable
            self.dry_run_status.value = f"dry run failed: {type(error).__name__}: {error}"
            return
        self.dry_run_status.value = (
            f"dry run: {result.flops:,} FLOPs, peak activations {bytes_text(result.peak_activation_bytes)}"
        )
        self.dry_run_output.clear_output()
        self.dry_run_output.append_display_data(result.modules)

    def plan(self) -> None:
        """Device plan for the module within the typed budgets (`explorer.plan_devices`)."""
        try:
            result = explorer.plan_devices(self.module, parse_budgets(self.budgets.value))
        except Exception as error:  # shown to the user; the widget stays usable
            self.plan_status.value = f"device plan failed: {type(error).__name__}: {error}"
            return
        self.last_plan = result
        self.plan_status.value = f"device plan: {len(result.device_map)} entries"
        self.plan_output.clear_output()
        self.plan_output.append_display_data(result.table)
        self.plan_output.append_display_data(pd.Series(result.device_map, name="device").to_frame())
