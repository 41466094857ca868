"""`forward_graph`: a module's forward pass recorded op by op on fake tensors, each op owned by a module.

Where `dry_run` sums a forward up per module, this keeps every aten call: what it read, what it
made, with which shapes, dtypes, FLOPs and bytes, and which module's forward ran it. The forward
runs exactly as in `dry_run` (a FakeTensorMode of its own, fake copies of the module's tensors
swapped in for the call (`swapped_state.swapped_in`), global forward hooks), so a deferred module stays
deferred, a real tensor is never read, nothing is recorded into the module's own graphs and the
global CPU RNG state is restored.

`explorer.op_graph(forward_graph(...))` draws the result as it draws construction (clusters per
module, "Class ×N" folding); `explorer/render/forward_scene.py` does that conversion.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..graph import InitGraph
from ..inspection.census import Census
from ..inspection.ops import op_kind
from ..naming import dtype_name, is_inside
from .dry_run import DryRunError, not_on_fakes_message, prepare_fake_forward, unfused_transformer_layers
from .forward_record import ForwardRecorder, ModuleStack
from .swapped_state import swapped_in

OP_COLUMNS = [
    "index",
    "op",
    "aten",
    "kind",
    "module",
    "class",
    "input_shapes",
    "input_dtypes",
    "output_shapes",
    "output_dtypes",
    "flops",
    "bytes",
]
MODULE_COLUMNS = ["name", "class", "ops", "flops", "activation_bytes"]


class ForwardGraphError(DryRunError):
    """The forward could not be recorded on fake tensors (names the module whose forward was running)."""


@dataclass(frozen=True, repr=False)
class ForwardGraph:
    """One fake forward pass, op by op.

    `graph`: the ops as an `InitGraph` (never replayed: parameters and inputs have no producer);
    `owners[i]`: the path of the module whose forward ran op i ("" for the root);
    `parameters`: qualified name → tensor id in `graph`, for every parameter/buffer an op read;
    `inputs`: forward argument ("input 0", or the keyword) → tensor id, for tensor arguments;
    `ops`: one row per op (OP_COLUMNS): short name, full aten overload, `op_kind`, owning module
    and its class, input/output shapes and dtypes (tensors in argument order), FLOPs
    (`torch.utils.flop_counter` formulas; 0 where it has none) and bytes (of the storages the op
    created: 0 for views and in-place ops);
    `modules`: one row per module that ran an op, itself or below (MODULE_COLUMNS), totals of its
    subtree; `census`: the module's tensors as they were (states for the drawing).
    """

    root_class: str
    graph: InitGraph
    owners: list[str]
    module_classes: dict[str, str]
    parameters: dict[str, int]
    inputs: dict[str, int]
    ops: pd.DataFrame
    modules: pd.DataFrame
    census: Census
    output: Any = None
    flops_by_op: dict[str, int] = field(default_factory=dict)

    @property
    def flops(self) -> int:
        return int(self.ops["flops"].sum())

    @functools.cached_property
    def _totals(self) -> dict[str, tuple[int, int, int]]:
        columns = (self.modules[c].tolist() for c in ("name", "ops", "flops", "activation_bytes"))
        return {name: (ops, flops, created) for name, ops, flops, created in zip(*columns)}

    def module_totals(self, path: str) -> tuple[int, int, int]:
        """(ops, FLOPs, activation bytes) of module `path`'s subtree; zeros when it ran no op."""
        return self._totals.get(path, (0, 0, 0))

    def summary(self) -> str:
        """One line: ops, FLOPs, activation bytes."""
        return (
            f"{self.root_class} forward: {len(self.graph.ops)} ops, {self.flops:,} FLOPs, "
            f"{int(self.ops['bytes'].sum()):,} activation bytes"
        )

    def __repr__(self) -> str:
        return self.summary()


# -- tables ----------------------------------------------------------------------------------------


def _op_table(recorder: ForwardRecorder, classes: dict[str, str]) -> pd.DataFrame:
    graph = recorder.graph
    rows: dict[str, list] = {column: [] for column in OP_COLUMNS}
    for op, owner, flops, created in zip(graph.ops, recorder.owners, recorder.flops, recorder.created_bytes):
        inputs = [graph.tensors[tid] for tid in op.inputs]
        outputs = [graph.tensors[tid] for tid in op.output_ids]
        rows["index"].append(op.index)
        rows["op"].append(op.func.__name__.partition(".")[0])
        rows["aten"].append(str(op.func))
        rows["kind"].append(op_kind(op))
        rows["module"].append(owner)
        rows["class"].append(classes.get(owner, "?"))
        rows["input_shapes"].append([info.shape for info in inputs])
        rows["input_dtypes"].append([dtype_name(info.dtype) for info in inputs])
        rows["output_shapes"].append([info.shape for info in outputs])
        rows["output_dtypes"].append([dtype_name(info.dtype) for info in outputs])
        rows["flops"].append(flops)
        rows["bytes"].append(created)
    return pd.DataFrame(rows, columns=OP_COLUMNS)


def _module_table(ops: pd.DataFrame, classes: dict[str, str]) -> pd.DataFrame:
    """Subtree totals: every op counts for its owner and each ancestor."""
    totals: dict[str, list[int]] = {}
    for owner, flops, created in zip(ops["module"], ops["flops"], ops["bytes"]):
        parts = owner.split(".") if owner else []
        for depth in range(len(parts) + 1):
            entry = totals.setdefault(".".join(parts[:depth]), [0, 0, 0])
            entry[0] += 1
            entry[1] += int(flops)
            entry[2] += int(created)
    names = [path for path in classes if path in totals]  # named_modules() order
    return pd.DataFrame(
        {
            "name": names,
            "class": [classes[p] for p in names],
            "ops": [totals[p][0] for p in names],
            "flops": [totals[p][1] for p in names],
            "activation_bytes": [totals[p][2] for p in names],
        },
        columns=MODULE_COLUMNS,
    )


# -- the public function ---------------------------------------------------------------------------


def forward_graph(module: nn.Module, *inputs: Any, **kwargs: Any) -> ForwardGraph:
    """Record `module`'s forward on fake tensors, op by op, each op owned by the module that ran it.

    Inputs as `dry_run` takes them: tensors (real ones are read for metadata only), positional tuples
    of ints (an input of that shape on the module's device, int64 token ids when the first consumer is an
    embedding, else float32), or one dict of keyword arguments; `kwargs` are passed on. `module`
    may be deferred, partly materialized or eager and is not changed; nothing is materialized or
    recorded into its graphs, and the global CPU RNG state is left as it was. Runs without autograd.

    An op belongs to the innermost module whose forward was running (entered through `module(...)`,
    which global forward hooks see; a submodule's `.forward(...)` called directly counts for its
    caller). `prim` metadata queries (`tensor.device`) are not ops here.

    Raises ForwardGraphError (a DryRunError) naming the module whose forward was running when the
    forward cannot run on fake tensors; TypeError when `module` is not an nn.Module.
    """
    fake = prepare_fake_forward(module, inputs, kwargs, "forward_graph", ForwardGraphError)
    census, mode, state, args, kwargs = fake.census, fake.mode, fake.state, fake.args, fake.kwargs

    modules = ModuleStack(module)
    recorder = ForwardRecorder(modules)
    named_inputs = {f"input {i}": recorder.tensor_id(v) for i, v in enumerate(args) if isinstance(v, torch.Tensor)}
    named_inputs.update({k: recorder.tensor_id(v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
    rng_state = torch.get_rng_state()
    try:
        with torch.no_grad(), unfused_transformer_layers(), mode, recorder, modules:
            try:
                with swapped_in(module, state):  # note [Each slot swapped once]
                    output = module(*args, **kwargs)
            except Exception as error:
                raise _failure(error, modules) from error
        read = {name: recorder.known_id(fake) for name, fake in state.items()}
        parameters = {name: tid for name, tid in read.items() if tid is not None}
    finally:
        torch.set_rng_state(rng_state)
        recorder.release()
    recorder.graph.finished = True
    ops = _op_table(recorder, modules.classes)
    flops_by_op: dict[str, int] = {}
    for name, flops in zip(ops["aten"], ops["flops"]):
        if flops:
            flops_by_op[name] = flops_by_op.get(name, 0) + int(flops)
    return ForwardGraph(
        root_class=type(module).__name__,
        graph=recorder.graph,
        owners=recorder.owners,
        module_classes=modules.classes,
        parameters=parameters,
        inputs=named_inputs,
        ops=ops,
        modules=_module_table(ops, modules.classes),
        census=census,
        output=output,
        flops_by_op=flops_by_op,
    )


def _failure(error: Exception, modules: ModuleStack) -> ForwardGraphError:
    path = modules.current
    return ForwardGraphError(not_on_fakes_message(f"{path or '<root>'} ({modules.classes.get(path, '?')})", error))


def ops_inside(forward: ForwardGraph, path: str) -> list[int]:
    """Indices of the ops run by module `path` or its submodules, in order."""
    return [index for index, owner in enumerate(forward.owners) if is_inside(owner, path)]
