"""The ops table: one row per recorded op, in the order the constructor issued them."""

from __future__ import annotations

from typing import Literal, get_args

import pandas as pd
import torch

from ..graph import OpIndex, OpNode
from ..naming import dtype_name
from .census import Census

# What an op does to the module's tensors (see `op_kind`); a closed set, in the order tables list it.
OpKind = Literal["factory", "random", "in-place", "view", "compute", "data", "external-input"]
OP_KINDS: tuple[OpKind, ...] = get_args(OpKind)
FACTORY, RANDOM, INPLACE, VIEW, COMPUTE, DATA, EXTERNAL_INPUT = OP_KINDS

OP_COLUMNS = [
    "graph",
    "index",
    "op",
    "kind",
    "inputs",
    "outputs",
    "output_shapes",
    "output_dtypes",
    "modules",
    "source",
    "code",
]

_VALUE_READ = torch.ops.aten._local_scalar_dense.default


def op_kind(op: OpNode) -> OpKind:
    """What an op does to the module's tensors; the first rule that matches wins:

    1. "random": draws from a generator (`uniform_`, `normal_`, `randn`...);
    2. "view": only makes aliases of its inputs and writes nothing (`detach`, `view`, `t`, and the
       synthetic alias ops for `.data = x` and in-place views such as `t_`);
    3. "in-place": writes an existing storage (`fill_`, `copy_`, `mul_`, out= ops);
    4. "factory": has no tensor input at all (fake or external) and creates storage (`empty`,
       `ones`, `arange`);
    5. "data": reads a value back into Python (`.item()`, `.tolist()`: `_local_scalar_dense`);
    6. "external-input": reads a real tensor from outside the constructor (`lift_fresh` for
       `torch.tensor(...)`, or any op given a module argument);
    7. "compute": everything else (new values computed from fake inputs).
    """
    if op.random:
        return RANDOM
    if op.aliases_only:
        return VIEW
    if op.writes:
        return INPLACE
    if op.creates and not op.inputs and not op.externals:
        return FACTORY
    if op.func is _VALUE_READ:
        return DATA
    if op.externals:
        return EXTERNAL_INPUT
    return COMPUTE


def op_modules(census: Census) -> dict[tuple[int, OpIndex], list[str]]:
    """(graph, op index) → the modules holding a tensor whose closure contains the op, module order.

    Ops that only fed tensors the module no longer holds are absent. The ops table shows this list;
    diagrams draw each op inside the innermost module common to all of them.
    """
    owners: dict[tuple[int, OpIndex], dict[str, None]] = {}
    for entry in census.tensors:
        if entry.recorded is None:
            continue
        for index in census.closures[entry.recorded]:
            owners.setdefault((entry.recorded[0], index), {})[entry.module] = None
    return {key: list(modules) for key, modules in owners.items()}


def ops_table(census: Census) -> pd.DataFrame:
    """One row per op of every graph the module's tensors came from (graph by graph, each in order).

    - `inputs` / `outputs`: tensor names where the module holds the tensor (its first name),
      `#<tensor_id>` for intermediates, `external #<i>` for real tensors from outside (after the
      fake inputs); a "data" op's output is the value it read, as text;
    - `output_shapes` / `output_dtypes`: of the output tensors;
    - `modules`: the modules holding a tensor whose closure contains the op, in module order (an
      op that only fed tensors the module no longer holds has none);
    - `source`: where the user's code issued it (file:line in function); `code`: that line's text.
      A `set_data` alias (a `.data = x` swap, which never reaches the dispatcher) has the line where
      the recorder noticed it, the tensor's next use, or none when it was noticed as recording ended
      (the tensors table's `source` names the line that made `x`).
    An eager module has no recorded ops: the table is empty.
    """
    names = census.names_by_tensor_id()
    owners = op_modules(census)
    columns: dict[str, list] = {column: [] for column in OP_COLUMNS}
    for position, graph in enumerate(census.graphs):
        tensors = graph.tensors
        for op in graph.ops:
            kind = op_kind(op)
            inputs = [names.get((position, tid), f"#{tid}") for tid in op.inputs]
            inputs.extend(f"external #{index}" for index in op.externals)
            if kind == DATA:
                outputs = [repr(op.outputs)]
            else:
                outputs = [names.get((position, tid), f"#{tid}") for tid in op.output_ids]
            columns["graph"].append(position)
            columns["index"].append(op.index)
            columns["op"].append(op.label)
            columns["kind"].append(kind)
            columns["inputs"].append(inputs)
            columns["outputs"].append(outputs)
            columns["output_shapes"].append([tuple(tensors[tid].shape) for tid in op.output_ids])
            columns["output_dtypes"].append([dtype_name(tensors[tid].dtype) for tid in op.output_ids])
            columns["modules"].append(owners.get((position, op.index), []))
            columns["source"].append(str(op.source) if op.source is not None else None)
            columns["code"].append(op.source.line if op.source is not None else None)
    return pd.DataFrame(columns, columns=OP_COLUMNS)
