"""Ops whose output shape depends on values (`nonzero`, `unique`, `masked_select`, boolean-mask
indexing, `repeat_interleave` with tensor repeats, `bincount`...), met inside a constructor.

Fake tensors have no values, so fake mode cannot say how big such an output is. When the op's
inputs are cheap to compute, the recorder computes them for real (as `.item()` does: replaying
their closure, with eager RNG parity), runs the op on them, and records it with the real output's
shape; replay then runs it like any other op and gets the same shape. Above the limit the error
names the tensor that would have to be computed and its size.

The limit is on the bytes of every storage the inputs' closures create (what replaying them would
allocate): 64 MiB by default, `EXPLORER_VALUE_READ_LIMIT` (bytes, or "256MB", "1GiB") to change it.
Constructors that call these ops on index tensors or masks stay far below it; a parameter's random
contents (e.g. `torch.unique(self.weight)`) usually exceed it, and the error says how to opt in.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import torch

from .._torch_compat.dispatch import disable_torch_dispatch, tree_flatten, tree_map
from .._torch_compat.fake import FakeTensor
from ..errors import DeferredInitError
from ..graph import InitGraph, OutLayout
from ..naming import format_bytes
from .fake import describe, handle_of
from .lean_fake import FakeFactory
from .scope import ValueReader, outside_recording

DEFAULT_LIMIT_BYTES = 64 * 2**20
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def value_read_limit() -> int:
    """Bytes an op's inputs may cost to compute (EXPLORER_VALUE_READ_LIMIT, else 64 MiB)."""
    text = os.environ.get("EXPLORER_VALUE_READ_LIMIT", "").strip().lower().replace(" ", "")
    if not text:
        return DEFAULT_LIMIT_BYTES
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", text)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"EXPLORER_VALUE_READ_LIMIT={text!r}: use bytes or a size like '256MB', '1GiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def closure_bytes(graph: InitGraph, fake: FakeTensor) -> int:
    """Bytes of the storages replaying `fake`'s closure would create."""
    handle = handle_of(fake)
    if handle is None:
        return 0
    total = 0
    for index in graph.closure_of([handle.tensor_id]):
        for storage in graph.ops[index].creates:
            total += graph.storages[storage].nbytes
    return total


def compute_for_real(
    graph: InitGraph,
    read_value: ValueReader,
    make_fake: FakeFactory,
    func: Any,
    args: tuple,
    kwargs: dict,
    where: Callable[[], str],
) -> Any:
    """Run `func` on the true values of its fake inputs; tensor outputs come back as fakes of the
    real shapes (on the inputs' fake device), other outputs as they are."""
    fakes = [value for value in tree_flatten((args, kwargs))[0] if isinstance(value, FakeTensor)]
    limit = value_read_limit()
    costs = {id(fake): closure_bytes(graph, fake) for fake in fakes}
    if sum(costs.values()) > limit:
        largest = max(fakes, key=lambda fake: costs[id(fake)])
        raise DeferredInitError(
            f"{func} needs the values of its inputs (its output shape depends on them) while building "
            f"{where()}; computing {describe(largest)} would replay {format_bytes(costs[id(largest)])} "
            f"of recorded ops, over the {format_bytes(limit)} limit. Set EXPLORER_VALUE_READ_LIMIT "
            "(e.g. '4GB') to allow it, or compute this in the constructor without the module's tensors",
            graph,
            op=str(func),
            reason=f"its output shape depends on input values, and computing {describe(largest)} would replay "
            f"{format_bytes(costs[id(largest)])}, over the {format_bytes(limit)} limit (EXPLORER_VALUE_READ_LIMIT)",
        )
    reals = {id(fake): read_value(fake) for fake in fakes}
    real_args, real_kwargs = tree_map(lambda v: reals.get(id(v), v) if isinstance(v, FakeTensor) else v, (args, kwargs))
    with outside_recording():
        out = func(*real_args, **real_kwargs)
    device = fakes[0].device if fakes else torch.device("cpu")

    def as_fake(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        with disable_torch_dispatch():
            meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        return make_fake(meta, device)

    return tree_map(as_fake, out)


def kernel_out_strides(
    graph: InitGraph,
    read_value: ValueReader,
    func: Any,
    args: tuple,
    kwargs: dict,
    outs: list[OutLayout],
) -> list[tuple[int, ...]] | None:
    """The strides the CPU kernel gives `func`'s `out=` arguments `outs` ((keyword name, shape and
    stride before the op) each): the op run on the true values of its other inputs, each out a new
    tensor laid out as it was before (note [Out layouts as recorded] in replay/replay.py). None
    where that cannot be had cheaply: a fake off the CPU, inputs over the value-read limit, or an
    op that raises (replay then raises as eager did). Not for random ops: it would draw."""
    before = {name: (shape, stride) for name, shape, stride in outs}
    given = {name: kwargs[name] for name in before}
    inputs = [v for v in tree_flatten((args, {k: v for k, v in kwargs.items() if k not in given}))[0]]
    fakes = [value for value in inputs if isinstance(value, FakeTensor)]
    if any(fake.device.type != "cpu" for fake in (*fakes, *given.values()) if isinstance(fake, FakeTensor)):
        return None
    if sum(closure_bytes(graph, fake) for fake in fakes) > value_read_limit():
        return None
    reals = {id(fake): read_value(fake) for fake in fakes}
    real_args = tree_map(lambda v: reals.get(id(v), v) if isinstance(v, FakeTensor) else v, args)
    with outside_recording():  # the outs made here are real, not fakes of the recording
        real_kwargs = {k: reals.get(id(v), v) if isinstance(v, FakeTensor) else v for k, v in kwargs.items()}
        real_kwargs |= {k: torch.empty_strided(*before[k], dtype=v.dtype) for k, v in given.items()}
        try:
            func(*real_args, **real_kwargs)
        except Exception:  # eager raises here too: replay will, naming the op
            return None
    return [tuple(real_kwargs[name].stride()) for name in before]
