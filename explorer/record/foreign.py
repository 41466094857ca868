"""Reading a deferred tensor of another recording.

Two models deferred apart are two recordings. People still mix them: `student.load_state_dict(
teacher.state_dict())`, `torch.func.stack_module_state(models)` for an ensemble, an MoE's experts
copied from a dense model's MLP (upcycling). Each such op *reads* the other recording's tensor.

Note: [Reading another recording]
An op recorded into A (a running constructor, a `deferred()` block, or an op on A's fakes after
deferred_init) that is given fakes of another finished recording B is recorded where eager's memory
semantics survive:
- when its only fakes are B's and it draws no random numbers (`teacher.w.reshape(...)`, `.detach()`,
  `* 2`), it is B's op: B's recorder records it and its outputs are B's fakes, so a view of B's
  tensor stays a view of it (and a module of A may hold it, as it may hold any of B's tensors);
- otherwise each of B's fakes that it only reads (not written, not viewed by the output) becomes two
  records: in B, `x.clone()`, which pins the value `x` has now (ops B records on `x` later do not
  reach the clone), and in A, `explorer.read_deferred(pinned)`, whose output, a fake of A with the
  clone's layout, takes `x`'s place in the op. A keeps the pinned fake as an external input
  (graph.externals), so A holds B's recording alive, and a random op reading it draws in A's order.
Replay of A materializes each pinned fake first, by a replay of B with A's device map and rng
(`replay.Replay._read_other_recordings`), so the op sees the value eager's op saw.
Refused, with the message that names both fixes (`mixed_recordings`): an op of the second kind that
writes into B's tensor or returns a view of it (a random fill of B's tensor inside A's constructor
among them: its draw would have to come in A's eager order), an op on the fakes of two other
recordings alone, and a tensor of a recording that has not finished (its constructor is still
running, or failed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from .._torch_compat.dispatch import disable_current_modes, disable_torch_dispatch
from .._torch_compat.fake import FakeTensor
from ..errors import DeferredInitError
from .fake import HANDLE_ATTR
from .scope import outside_recording

if TYPE_CHECKING:
    from ..graph import InitGraph
    from .lean_fake import FakeFactory
    from .source import SourceLocation

_LIBRARY = torch.library.Library("explorer", "FRAGMENT")
_LIBRARY.define("read_deferred(Tensor pinned) -> Tensor")
_LIBRARY.impl("read_deferred", lambda pinned: pinned.clone(), "CompositeExplicitAutograd")
_LIBRARY.impl("read_deferred", lambda pinned: torch.empty_like(pinned), "Meta")
READ_DEFERRED = torch.ops.explorer.read_deferred.default


def mixed_recordings(source: SourceLocation | None, why: str = "") -> DeferredInitError:
    """The refusal of an op given fakes of two recordings that it cannot read across."""
    return DeferredInitError(
        f"a fake tensor from another deferred_init graph was used at {source}{why}; "
        "tensors of two deferred recordings cannot be mixed in one op. Materialize one of "
        "them first (explorer.materialize_module), or build the new modules inside "
        "`with explorer.deferred(model):` so that they share the model's recording"
    )


def _fake_arguments(args: tuple, kwargs: dict) -> Iterator[FakeTensor]:
    """The fakes among an op's arguments and the items of its list arguments."""
    for value in (*args, *kwargs.values()):
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, FakeTensor):
                yield item


def other_recording(value: Any, graph: InitGraph) -> bool:
    """Whether `value` is a deferred fake recorded into another graph than `graph`."""
    if not isinstance(value, FakeTensor):
        return False
    handle = value.__dict__.get(HANDLE_ATTR)
    return handle is not None and handle.graph is not graph


def reads_other_recordings(graph: InitGraph, args: tuple, kwargs: dict) -> bool:
    """Whether any argument (or item of a list argument) is a fake of another recording."""
    return any(other_recording(fake, graph) for fake in _fake_arguments(args, kwargs))


def runs_in_other_recording(graph: InitGraph, func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether `func`, given fakes of another recording, belongs to that recording: no fake of
    `graph` among its arguments, and no random numbers drawn (see the note)."""
    if torch.Tag.nondeterministic_seeded in func.tags:
        return False
    return all(other_recording(fake, graph) for fake in _fake_arguments(args, kwargs))


def run_in_other_recording(func: Any, args: tuple, kwargs: dict, source: SourceLocation | None) -> Any:
    """`func` recorded by the one other finished recording whose fakes it is given (see the note);
    its outputs are that recording's fakes."""
    graphs = {
        id(handle.graph): handle.graph
        for fake in _fake_arguments(args, kwargs)
        if (handle := fake.__dict__.get(HANDLE_ATTR)) is not None
    }
    recorder = next(iter(graphs.values())).recorder if len(graphs) == 1 else None
    if recorder is None:
        why = " (its recording has not finished)" if len(graphs) == 1 else " with fakes of two other recordings"
        raise mixed_recordings(source, why)
    with disable_current_modes():
        return recorder.run(func, args, kwargs)


def with_reads_adopted(
    graph: InitGraph,
    make_fake: FakeFactory,
    record_read: Callable[[FakeTensor, FakeTensor], None],
    func: Any,
    args: tuple,
    kwargs: dict,
    source: SourceLocation | None,
) -> tuple[tuple, dict]:
    """`args` and `kwargs` of `func` with each fake of another recording replaced by a fake of
    `graph` that reads its value now (see note [Reading another recording]); `record_read(pinned,
    stand_in)` records the read into `graph`. Raises `mixed_recordings` for an argument the op
    writes or views, or of an unfinished recording."""
    schema = func._schema
    aliased = {argument.name for argument in schema.arguments if argument.alias_info is not None}
    names = [argument.name for argument in schema.arguments]

    def adopt(value: Any, name: str) -> Any:
        if isinstance(value, (list, tuple)):
            return type(value)(adopt(item, name) for item in value)
        if not other_recording(value, graph):
            return value
        if name in aliased:
            raise mixed_recordings(source, f" as {func}'s {name!r}, which it writes or views")
        return _read(value, make_fake, record_read, source)

    adopted_args = tuple(adopt(value, names[i] if i < len(names) else "") for i, value in enumerate(args))
    return adopted_args, {name: adopt(value, name) for name, value in kwargs.items()}


def _read(
    tensor: FakeTensor,
    make_fake: FakeFactory,
    record_read: Callable[[FakeTensor, FakeTensor], None],
    source: SourceLocation | None,
) -> FakeTensor:
    """The stand-in for `tensor`'s value now: pinned by a clone in its own recording, read into this one."""
    recorder = tensor.__dict__[HANDLE_ATTR].graph.recorder
    if recorder is None:
        raise mixed_recordings(source, " (its recording has not finished)")
    requires_grad = tensor.requires_grad and torch.is_grad_enabled()  # as the op's result would in eager
    with outside_recording():
        pinned = recorder.run(torch.ops.aten.clone.default, (tensor,), {})
        with disable_torch_dispatch():
            meta = torch.empty_strided(pinned.shape, pinned.stride(), dtype=pinned.dtype, device="meta")
            stand_in = make_fake(meta, pinned.device, requires_grad)
    record_read(pinned, stand_in)
    return stand_in
