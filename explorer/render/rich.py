"""HTML for notebooks: what `Inspection`, `MemoryPlan`, `DryRun`, `CheckpointCheck`, a deferred module
and a fake tensor show when a cell's value is one of them.

Plain HTML strings, no Jupyter import: the classes' `_repr_html_` call these, and the notebook
extension (`widgets.load_ipython_extension`) registers the module and tensor ones with IPython's
HTML formatter, since `nn.Module` and `torch.Tensor` are not ours to give methods. Every piece of
text goes through `html.escape`; tables come from pandas (`DataFrame.to_html`, which escapes).
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd
import torch
from torch import nn

from .._torch_compat.fake import FakeTensor
from ..naming import format_bytes

# The objects drawn here (Inspection, MemoryPlan, DryRun, CheckpointCheck) import this module when
# displayed; this module reads their attributes only, so it imports none of them (no cycle).

FIRST_ROWS = 10
TREE_DEPTH = 2
_STYLE = (
    "<style>.de-rich{font-family:var(--jp-ui-font-family,sans-serif);font-size:12px}"
    ".de-rich table{border-collapse:collapse;font-size:11px}"
    ".de-rich td,.de-rich th{padding:1px 6px;text-align:left}"
    ".de-rich-bar{display:inline-block;height:9px;background:#4c6ef5;vertical-align:middle}"
    ".de-rich-track{display:inline-block;width:160px;height:9px;background:#e9ecef;vertical-align:middle}"
    ".de-rich ul{margin:0;padding-left:16px}</style>"
)


def _frame(frame: pd.DataFrame, columns: list[str], css_class: str) -> str:
    shown = frame[[c for c in columns if c in frame.columns]].head(FIRST_ROWS)
    more = f"<div>… {len(frame) - FIRST_ROWS:,} more rows</div>" if len(frame) > FIRST_ROWS else ""
    return shown.to_html(index=False, classes=css_class, border=0, escape=True) + more


def inspection_html(inspection: Any) -> str:
    """The summary lines, then the first rows of the tensors, modules and ops tables."""
    summary = "<br>".join(html.escape(line) for line in inspection.summary().splitlines())
    parts = [
        f'<div class="de-rich de-rich-inspection"><div class="de-rich-summary">{summary}</div>',
        f"<h4>tensors ({len(inspection.tensors):,})</h4>",
        _frame(
            inspection.tensors,
            ["name", "shape", "stride", "storage_offset", "dtype", "device", "state", "bytes"],
            "de-rich-tensors",
        ),
        f"<h4>modules ({len(inspection.modules):,})</h4>",
        _frame(inspection.modules, ["name", "class", "total_params", "bytes", "materialized"], "de-rich-modules"),
        f"<h4>ops ({len(inspection.ops):,})</h4>",
        _frame(inspection.ops, ["index", "op", "kind", "output_shapes"], "de-rich-ops"),
        "</div>",
    ]
    return _STYLE + "".join(parts)


def memory_plan_html(plan: Any) -> str:
    """One row per device: planned of budget bytes, with a bar of the share used."""
    rows = []
    for row in plan.table.itertuples():
        share = row.planned_bytes / row.budget_bytes if row.budget_bytes else 0.0
        width = max(0.0, min(1.0, share)) * 160
        rows.append(
            f'<tr class="de-rich-device" data-device="{html.escape(str(row.device))}">'
            f"<td>{html.escape(str(row.device))}</td>"
            f"<td>{format_bytes(int(row.planned_bytes))} of {format_bytes(int(row.budget_bytes))}</td>"
            f'<td><span class="de-rich-track"><span class="de-rich-bar" style="width:{width:.1f}px"></span></span>'
            f" {100 * share:.1f}%</td><td>{int(row.entries):,} entries</td></tr>"
        )
    per_rank = f", bytes per rank of {plan.world_size}" if plan.world_size != 1 else ""
    return (
        _STYLE + f'<div class="de-rich de-rich-plan"><b>MemoryPlan</b> ({len(plan.device_map):,} entries{per_rank})'
        f"<table><tr><th>device</th><th>planned</th><th>used</th><th>entries</th></tr>{''.join(rows)}</table></div>"
    )


def dry_run_html(run: Any) -> str:
    """Totals, then per-module output shapes, activation bytes and FLOPs (first rows)."""
    frame = run.modules.assign(activation=run.modules["activation_bytes"].map(lambda b: format_bytes(int(b))))
    return (
        _STYLE + f'<div class="de-rich de-rich-dry-run"><b>{html.escape(run.root_class)} dry run</b>: '
        f"{run.flops:,} FLOPs, peak activations {format_bytes(run.peak_activation_bytes)}"
        + _frame(
            frame, ["name", "class", "output_shapes", "output_dtypes", "activation", "flops"], "de-rich-dry-run-modules"
        )
        + "</div>"
    )


def checkpoint_check_html(check: Any) -> str:
    """The verdict and summary, then one row per problem; dtype differences are marked as converted
    on load, and tied keys filled by their partners are listed (not problems)."""
    verdict = "ok" if check.ok else "not ok"  # the summary's first words
    frame = check.to_frame()
    table = (
        _frame(frame, list(frame.columns), "de-rich-checkpoint-problems")
        if len(frame)
        else "<div>no missing or unexpected keys, no mismatches</div>"
    )
    notes = []
    if (frame["problem"] == "dtype").any():
        notes.append(
            "dtype differences are converted on load (load_state_dict copies, from_pretrained casts); "
            "they do not make the check fail"
        )
    if check.filled_by_tie:
        notes.append("filled by a tied partner: " + ", ".join(check.filled_by_tie))
    note_html = "".join(f'<div class="de-rich-note">{html.escape(note)}</div>' for note in notes)
    rest = check.summary().partition(": ")[2]
    return (
        _STYLE + f'<div class="de-rich de-rich-checkpoint-check" data-ok="{str(check.ok).lower()}">'
        f'<div class="de-rich-summary"><b>{verdict}</b>: {html.escape(rest)}</div>{table}{note_html}</div>'
    )


def _storage_size(tensor: torch.Tensor) -> tuple[int, int]:
    """(a key of the memory `tensor` is on, that memory's bytes); a tensor with no storage (sparse,
    mkldnn) is its own memory."""
    if tensor.layout is not torch.strided:
        return id(tensor), tensor.numel() * tensor.element_size()
    storage = torch.Tensor.untyped_storage(tensor)
    return storage._cdata, storage.nbytes()


def _module_line(name: str, module: nn.Module) -> str:
    tensors = [*module.parameters(), *module.buffers()]
    sizes = dict(_storage_size(t) for t in tensors)  # each storage once, as the tables count it
    fake = sum(1 for t in tensors if isinstance(t, FakeTensor))
    state = (
        "fake" if fake == len(tensors) and tensors else ("materialized" if not fake else f"{fake}/{len(tensors)} fake")
    )
    if not tensors:
        state = "empty"
    label = html.escape(name or type(module).__name__)
    return (
        f'<span class="de-rich-module" data-path="{html.escape(name)}"><b>{label}</b> '
        f"{html.escape(type(module).__name__)} · {format_bytes(sum(sizes.values()))} · {state}</span>"
    )


def module_html(module: nn.Module, summary: str, depth: int = TREE_DEPTH) -> str:
    """`summary` (e.g. the first line of `inspect(module).summary()`), then the module tree to
    `depth` levels, each with its class, bytes and state (no buttons: a static picture)."""

    def tree(prefix: str, current: nn.Module, level: int) -> str:
        children = list(current.named_children())
        if not children:
            return ""
        if level >= depth:
            return f"<ul><li>… {len(children)} submodules</li></ul>"
        items = []
        for name, child in children:
            path = f"{prefix}.{name}" if prefix else name
            items.append(f"<li>{_module_line(path, child)}{tree(path, child, level + 1)}</li>")
        return "<ul>" + "".join(items) + "</ul>"

    return (
        _STYLE + f'<div class="de-rich de-rich-module-tree"><div class="de-rich-summary">{html.escape(summary)}'
        f"</div>{_module_line('', module)}{tree('', module, 0)}</div>"
    )


def tensor_html(tensor: torch.Tensor) -> str:
    """Shape, stride, offset, dtype, device and whether it is fake or real, as one small table."""
    from ..record.fake import describe

    fake = isinstance(tensor, FakeTensor)
    state = "fake (no storage)" if fake else "real (materialized or eager)"
    rows = [
        ("shape", tuple(tensor.shape)),
        ("stride", tuple(tensor.stride())),
        ("offset", tensor.storage_offset()),
        ("dtype", str(tensor.dtype).replace("torch.", "")),
        ("device", str(tensor.device)),
        ("state", state),
        ("bytes", format_bytes(tensor.numel() * tensor.element_size())),
    ]
    if fake:
        rows.append(("name", describe(tensor)))
    body = "".join(
        f'<tr data-field="{key}"><th>{key}</th><td>{html.escape(str(value))}</td></tr>' for key, value in rows
    )
    kind = "Parameter" if isinstance(tensor, nn.Parameter) else "Tensor"
    return _STYLE + f'<div class="de-rich de-rich-tensor"><b>{kind}</b><table>{body}</table></div>'
