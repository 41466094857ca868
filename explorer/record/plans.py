"""Per-op plans: what recording a factory op works out from metadata alone, done once per signature.

Note: [Op plans]
Identical decoder layers issue identical factory calls (`empty([4096, 11008], dtype=float32,
device=cpu)`) layer after layer. Everything about such a call except identity is decided by its
signature: the overload, its plain arguments with their Python types (`full(s, 1)` makes int64,
`full(s, 1.0)` float32), the default dtype when the op takes one and was given none, and inference
mode. A plan keeps, per signature, what the first call worked out: the meta kernel to call and its
keyword arguments, and the result's device, shape, stride, dtype, requires_grad and storage size,
with the keyword arguments as the graph stores them. A later call with the same signature makes its
fake by the plan's meta call and is recorded from the plan (`GraphBuilder.record_planned_factory`)
without reading the fake's metadata back. What depends on identity is still done per op: the fake
itself, its storage's id, the tensor id, the version, the source line, the op index.

Limitations, by design: only factories recorded by a direct record (note [Direct records] in
builder.py) get plans. A random op's stream position, a write's target and a view's base are
identity, not metadata; what is metadata there (a fill's check, note [Fills checked once per
layout]; a write's storage coverage, `GraphBuilder._covering`) is already memoised. Small CPU
`arange`s take their layout from the CPU kernel and get no plan. Plans live as long as one
recording (`RecordingDispatchMode`), so a recording costs what it would cost alone.
tests/explorer/record/test_plans.py records models with plans and without, and compares the graphs
field by field.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

from ..graph import InitGraph, OpNode

# Scalars and enums a factory takes, hashed with their type (1, 1.0 and True hash alike).
_SCALARS = frozenset({int, float, bool, str, type(None), torch.device, torch.dtype, torch.layout, torch.memory_format})
_REMEMBERED = 4096  # a bound, for programs that make tensors of endless signatures
_enabled = True


# A factory result's shape, stride, storage offset, dtype and requires_grad, as `TensorInfo` has them.
Layout = tuple[tuple[int, ...], tuple[int, ...], int, torch.dtype, bool]


class FactoryPlan(NamedTuple):
    """What a factory call of one signature makes, and how the graph stores it."""

    call: Callable[..., torch.Tensor]  # the meta-device kernel `lean_fake` calls for this op
    meta_kwargs: dict[str, Any]  # the op's keyword arguments with the meta device
    device: torch.device  # the device the fake reports
    layout: Layout
    nbytes: int  # its storage's size
    kwargs: dict[str, Any]  # as the graph stores them (copied per op: OpNode.kwargs is a dict)


class FactoryPlans:
    """The plans of one recording, by signature (`signature`), with how often they were reused."""

    def __init__(self) -> None:
        self._plans: dict[tuple, FactoryPlan] = {}
        self.hits = 0  # factory ops recorded from a plan
        self.learned = 0  # plans made

    def get(self, key: tuple) -> FactoryPlan | None:
        plan = self._plans.get(key)
        if plan is not None:
            self.hits += 1
        return plan

    def learn(self, key: tuple, plan: FactoryPlan) -> None:
        if len(self._plans) >= _REMEMBERED:
            self._plans.clear()
        self._plans[key] = plan
        self.learned += 1


def signature(func: Any, takes_dtype: bool, args: tuple, kwargs: dict) -> tuple | None:
    """The key of a factory call's plan (note [Op plans]), or None when it cannot have one (a
    tensor, a float size or any other argument that is not a plain scalar or a list of ints).
    `takes_dtype`: the op has a keyword-only dtype (`OpFacts.takes_dtype`). Positional arguments
    that `layout_free_arguments` names for the op are left out."""
    key: list[Any] = [id(func), torch.is_inference_mode_enabled()]
    if takes_dtype and kwargs.get("dtype") is None:
        key.append(torch.get_default_dtype())
    scalars = _SCALARS
    free = _LAYOUT_FREE.get(id(func), ())
    for position, value in enumerate(args):
        if position in free:
            continue
        kind = type(value)
        if kind in scalars:
            key.append(kind)
            key.append(value)
        elif kind is list or kind is tuple:
            for item in value:
                if type(item) is not int:
                    return None
            key.append(kind)
            key.append(tuple(value))
        else:
            return None
    for name, value in kwargs.items():
        kind = type(value)
        if kind not in scalars:
            return None
        key.append(name)
        key.append(kind)
        key.append(value)
    return tuple(key)


# By id(func): the positions of a factory's arguments that do not decide its result's layout.
_LAYOUT_FREE: dict[int, frozenset[int]] = {}
_KEPT_ALIVE: list[Any] = []  # the ops of _LAYOUT_FREE, so that their ids stay theirs


def layout_free_arguments(func: Any, positions: tuple[int, ...]) -> None:
    """Let plans ignore `func`'s positional arguments at `positions`: they name what the result
    holds, not its layout (`explorer::read_safetensors`' file and key: every read of a [7168, 2048]
    bf16 tensor shares one plan, where each would otherwise learn a plan of its own)."""
    _KEPT_ALIVE.append(func)
    _LAYOUT_FREE[id(func)] = frozenset(positions)


def plan_of(
    call: Callable[..., torch.Tensor], meta_kwargs: dict[str, Any], graph: InitGraph, op: OpNode
) -> FactoryPlan:
    """The plan of factory `op`, just recorded into `graph` by a direct record, whose fake was made
    by `call(*op.args, **meta_kwargs)`."""
    tensor = graph.tensors[op.output_ids[0]]
    layout = (tensor.shape, tensor.stride, tensor.storage_offset, tensor.dtype, tensor.requires_grad)
    nbytes = graph.storages[op.creates[0]].nbytes
    return FactoryPlan(call, meta_kwargs, tensor.device, layout, nbytes, dict(op.kwargs))


def plans_enabled() -> bool:
    """Whether new recordings make and reuse plans (on unless `plans_disabled` is active)."""
    return _enabled


@contextlib.contextmanager
def plans_disabled() -> Iterator[None]:
    """Recordings started in the block take the general path for every op (tests compare both)."""
    global _enabled
    previous, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = previous
