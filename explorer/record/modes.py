"""The mode that watches a constructor run.

`RecordingDispatchMode` sits on top of a FakeTensorMode: every aten call runs on fake tensors and
is then handed to the `GraphBuilder`. `.item()`-like reads (`aten._local_scalar_dense`) are
answered with real values by materializing the small tensor on the spot.

Two things never reach the dispatcher: `.data = x` swaps a tensor's storage in C++ (the builder
notices the swap the next time the tensor is used) and `.numpy()` (`DeferredTensor.numpy`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .._torch_compat.dispatch import TorchDispatchMode, metadata_access, tree_flatten
from .._torch_compat.fake import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    fake_device_of,
    in_kernel_invocation,
)
from ..errors import DeferredInitError, MaterializationError
from ..graph import InitGraph, OutLayout, TensorId, is_inplace_random
from .batch_norm import BATCH_NORMS, as_kernels_run_it, with_kernel_layout
from .builder import (
    PLAIN_ARGUMENTS,
    SELF_ONLY,
    GraphBuilder,
    OpFacts,
    all_plain,
    op_facts,
    out_layouts,
    written_arguments,
)
from .computed import compute_for_real, kernel_out_strides
from .fake import DeferredTensor, handle_of
from .foreign import reads_other_recordings, run_in_other_recording, runs_in_other_recording, with_reads_adopted
from .inplace_refusals import broadcast_refusal, cast_refusal, inplace_pointwise
from .lean_fake import (
    FACTORIES,
    FakeFactory,
    detached_fake,
    factory_fake,
    factory_meta_call,
    lean_dispatch,
    meta_kwargs,
    planned_fake,
)
from .plans import FactoryPlans, plan_of, plans_enabled, signature
from .scope import ValueReader, outside_recording
from .source import building_modules, user_location

_aten = torch.ops.aten
_INPLACE_VIEW = torch.Tag.inplace_view


# Lets the recorder read stride/storage of tensors whose class refuses it (lazy parameters). The
# guard's class itself, called directly: a wrapper function would cost a call per recorded op.
_metadata_access: Callable[[], contextlib.AbstractContextManager[None]] = metadata_access


def _written_tids(graph: InitGraph, func: Any, args: tuple, kwargs: dict) -> list[TensorId]:
    """The tensors of `graph` that `func` is about to write (its `Tensor(a!)` arguments)."""
    tids = []
    for position, name in written_arguments(func):
        value = args[position] if position is not None and position < len(args) else kwargs.get(name)
        for item in value if isinstance(value, (list, tuple)) else (value,):
            handle = handle_of(item) if isinstance(item, torch.Tensor) else None
            if handle is not None and handle.graph is graph:
                tids.append(handle.tensor_id)
    return tids


def _refuse_unstrided(builder: GraphBuilder, func: Any, out: Any, source: Any) -> None:
    """A sparse or otherwise unstrided result has no storage to record (a CSR matrix, `to_sparse()`);
    refused naming the op and line, with what to do instead."""
    tensor = out if isinstance(out, torch.Tensor) else None
    layouts = (
        [tensor.layout]
        if tensor is not None
        else [t.layout for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    )
    unstrided = next((layout for layout in layouts if layout is not torch.strided), None)
    if unstrided is not None:
        error = NotImplementedError(
            f"it makes a {str(unstrided).removeprefix('torch.')} tensor, and deferred_init records strided (dense) "
            "tensors only: keep the dense tensor in the constructor and convert it after materializing "
            "(materialize_module, then .to_sparse())"
        )
        raise builder.failure(func, error, source)


class RecordingDispatchMode(TorchDispatchMode):
    """Records every aten op that reaches it, after FakeTensorMode (below it) has run the op."""

    def __init__(self, builder: GraphBuilder, read_value: ValueReader, fake_mode: FakeTensorMode) -> None:
        super().__init__()
        self.builder = builder
        self.read_value = read_value
        self.fake_mode = fake_mode
        self.make_fake = FakeFactory(fake_mode)
        # None: every factory takes the general direct record (tests compare the two)
        self.plans = FactoryPlans() if plans_enabled() else None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: keep `__torch_dispatch__` unwrapped. TorchDispatchMode otherwise wraps every
        subclass's handler in `torch._disable_dynamo` (a few microseconds per op), and deferred_init
        never runs under dynamo. This is the hook PyTorch documents for it (`_python_dispatch.py`);
        re-check it on upgrades: a PyTorch without it simply keeps the wrapper."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        entry = _KINDS.get(id(func)) or _entry(func)
        kind = entry.kind
        if kind is _PASS_THROUGH:
            if func is _PRIM_DEVICE and type(args[0]) is DeferredTensor and args[0].fake_mode is self.fake_mode:
                # `t.device` (each `.to(device)` asks it once): FakeTensorMode's answer outside a
                # kernel, without its dispatch
                if not in_kernel_invocation(self.fake_mode):
                    return fake_device_of(args[0])
            return func(*args, **kwargs)
        if kind is _RESOLVE and not _RESOLVE_BIT[func](args[0]):
            return args[0]  # eager returns its argument itself when there is nothing to resolve
        batch_norm = kind is _BATCH_NORM
        if batch_norm:  # note [Batch norm as its kernels run it]
            func, args, kwargs = as_kernels_run_it(func, args, kwargs)
            kind = _read_kind(func, batch_norm=False)
        source = user_location(2)
        graph = self.builder.graph
        if (kind is _WRITING or kind is _INPLACE_RANDOM) and graph.finished and graph.replay_state is not None:
            # note [Writes after a tensor was made] in replay/replay.py
            graph.replay_state.before_recorded_write(_written_tids(graph, func, args, kwargs), f"{func} at {source}")
        if entry.direct:
            out = self._record_directly(entry, func, args, kwargs, source)
            if out is not NotImplemented:
                return out
        if reads_other_recordings(self.builder.graph, args, kwargs):
            if runs_in_other_recording(self.builder.graph, func, args, kwargs):
                return run_in_other_recording(func, args, kwargs, source)
            args, kwargs = self._adopting_reads(func, args, kwargs, source)
        if kind is _VALUE_READ:
            return self._record_value_read(func, args, kwargs, source)
        if kind is _INPLACE_VIEW_OP and isinstance(args[0], FakeTensor):
            return self._record_inplace_view(func, args, kwargs, source)
        if kind is _INPLACE_RANDOM and isinstance(args[0], FakeTensor):
            # Fills values only: nothing to run. Fake mode would decompose it into prims that need
            # the real device's generator (absent for a fake "cuda" tensor) for nothing.
            with _metadata_access():
                filled = self.builder.before_write(func, args, kwargs, source)
                self.builder.record(func, args, kwargs, args[0], source, filled)
            return args[0]
        written = None
        if kind is _WRITING or kind is _INPLACE_RANDOM or kind is _INPLACE_VIEW_OP:  # the last: a real self
            written = self._before_write(kind, func, args, kwargs, source)
        outs_before = _probed_outs(entry.facts, kwargs)
        try:
            out = lean_dispatch(self.fake_mode, self.make_fake, func, args, kwargs)
            if out is NotImplemented:
                # Fake mode would take another recording's fake for a real tensor and convert it.
                self.builder.refuse_other_recordings(args, kwargs, source)
                out = func(*args, **kwargs)
            if outs_before:
                self._outs_as_the_kernel_lays_them(func, args, kwargs, outs_before)
            if batch_norm:
                out = with_kernel_layout(out, args, self.make_fake)
        except DeferredInitError:
            raise
        except (DynamicOutputShapeException, DataDependentOutputException):
            # the output's shape (or value) depends on values: compute the inputs for real (record/computed.py)
            return self._from_values(func, args, kwargs, source, written)
        except NotImplementedError as error:
            # Note: [Fake kernels stricter than the CPU's]
            # A meta kernel may refuse what the CPU kernel takes (a dtype). For an op that writes
            # nothing, on CPU fakes, the CPU kernel on the true values decides, as in eager: its output,
            # or eager's own error unchanged, so that the caller's `except` sees what eager raises
            # (torch 2.15's ParametrizationList catches NotImplementedError from `right_inverse`:
            # weight_norm of an int64 tensor falls back to the identity there).
            if written or not _on_cpu_only(args, kwargs):
                raise self.builder.failure(func, error, source) from error
            try:
                return self._from_values(func, args, kwargs, source, written)
            except (DeferredInitError, MaterializationError):  # the values could not be had
                raise self.builder.failure(func, error, source) from error
        except Exception as error:
            raise self.builder.failure(func, error, source) from error
        _refuse_unstrided(self.builder, func, out, source)
        with _metadata_access():
            self.builder.record(func, args, kwargs, out, source, written)
        return out

    def _record_inplace_view(self, func: Any, args: tuple, kwargs: dict, source: Any) -> Any:
        """`t_()`, `unsqueeze_()`...: run on the fake, recorded as its new layout."""
        with _metadata_access():
            before = self.builder.id_of(args[0], source)  # the layout before, in case it was never seen
        if func is _RESIZE_AS and len(args) > 1 and not isinstance(args[1], FakeTensor):
            # a real template gives only its shape, which fake mode will not take from a real tensor
            func, args = _RESIZE, (args[0], list(args[1].shape))
        try:
            out = func(*args, **kwargs)
        except Exception as error:
            raise self.builder.failure(func, error, source) from error
        with _metadata_access():
            after = self.builder.record_inplace_view(args[0], func, source)
        graph = self.builder.graph
        if graph.finished and graph.replay_state is not None:
            # note [Writes after a tensor was made] in replay/replay.py
            rest = args[1:]
            graph.replay_state.after_recorded_layout_change(before, after, lambda real: func(real, *rest, **kwargs))
        return out

    def _record_value_read(self, func: Any, args: tuple, kwargs: dict, source: Any) -> Any:
        """`.item()` and its kin: answered with the true value, and recorded."""
        # A fake's true value comes from replay; a real tensor from outside has its own.
        real = self.read_value(args[0]) if isinstance(args[0], FakeTensor) else args[0]
        with outside_recording():
            value = func(real)
        with _metadata_access():
            self.builder.record(func, args, kwargs, value, source)
        return value

    def _adopting_reads(self, func: Any, args: tuple, kwargs: dict, source: Any) -> tuple[tuple, dict]:
        """`func`'s arguments with other recordings' fakes read into this one (record/foreign.py)."""

        def record_read(pinned: FakeTensor, stand_in: FakeTensor) -> None:
            self.builder.record_other_recording_read(pinned, stand_in, source)

        return with_reads_adopted(self.builder.graph, self.make_fake, record_read, func, args, kwargs, source)

    def _from_values(self, func: Any, args: tuple, kwargs: dict, source: Any, written: Any) -> Any:
        """`func` run on the true values of its inputs (record/computed.py), recorded as such."""
        out = compute_for_real(
            self.builder.graph,
            self.read_value,
            self.make_fake,
            func,
            args,
            kwargs,
            lambda: f"{building_modules(4)} at {source or '<unknown source>'}",
        )
        with _metadata_access():
            self.builder.record(func, args, kwargs, out, source, written)
        self.builder.graph.ops[-1].from_values = True
        return out

    def _before_write(self, kind: Any, func: Any, args: tuple, kwargs: dict, source: Any) -> Any:
        """`builder.before_write` of an op that writes, after refusing what eager refuses up front."""
        with _metadata_access():
            if kind is _WRITING and inplace_pointwise(func):
                refusal = broadcast_refusal(args) or cast_refusal(func, args, kwargs)
                if refusal is not None:  # eager refuses these up front (record/inplace_refusals.py)
                    raise self.builder.failure(func, refusal, source)
            return self.builder.before_write(func, args, kwargs, source)

    def _outs_as_the_kernel_lays_them(
        self, func: Any, args: tuple, kwargs: dict, before: tuple[OutLayout, ...]
    ) -> None:
        """`out=` fakes the op resized or restrided take the strides the CPU kernel gives them
        (note [Out layouts as recorded] in replay/replay.py), where those can be had."""
        changed = [layout for layout in before if _layout(kwargs[layout[0]]) != layout[1:]]
        if not changed:
            return
        with _metadata_access():
            strides = kernel_out_strides(self.builder.graph, self.read_value, func, args, kwargs, changed)
        for (name, _, _), stride in zip(changed, strides or ()):
            fake = kwargs[name]
            if tuple(fake.stride()) != stride and fake.storage_offset() == 0:
                fake.as_strided_(fake.shape, stride, 0)

    def _record_directly(self, entry: _Kind, func: Any, args: tuple, kwargs: dict, source: Any) -> Any:
        """The op run and recorded by a direct record (note [Direct records]), or NotImplemented
        when it is not of such a shape: then nothing was recorded, and the general path runs it.

        Its tensors are `DeferredTensor`s exactly, which answer metadata reads without the
        `_metadata_access` guard that lazy parameters need."""
        kind = entry.kind
        if kind is _CREATE:
            return self._record_factory(entry, func, args, kwargs, source)
        if not args:
            return NotImplemented
        tensor = args[0]
        if type(tensor) is not DeferredTensor or tensor.fake_mode is not self.fake_mode:
            return NotImplemented
        if kind is _DETACH_OP:
            if len(args) != 1 or kwargs:
                return NotImplemented
            out = detached_fake(self.make_fake, tensor)
            if out is not NotImplemented:
                self.builder.record_detach(func, tensor, out, source)
            return out
        if len(args) > 1:  # `all_plain(args[1:])`, inlined: most are one or two scalars
            plain = PLAIN_ARGUMENTS
            for index in range(1, len(args)):
                if type(args[index]) not in plain and not all_plain((args[index],)):
                    return NotImplemented
        if kwargs and not all_plain(kwargs.values()):
            return NotImplemented
        if kind is _WRITING and (
            not tensor.dtype.is_floating_point or any(type(value) is complex for value in (*args, *kwargs.values()))
        ):
            return NotImplemented  # the result may not cast to self's dtype: the general path checks it
        builder = self.builder
        target = builder.direct_write_target(tensor, source)
        if target is None:
            return NotImplemented
        if kind is not _INPLACE_RANDOM:  # an in-place random op only fills values: nothing to run
            try:
                out = lean_dispatch(self.fake_mode, self.make_fake, func, args, kwargs)
            except Exception:
                return NotImplemented
            if out is not tensor:
                return NotImplemented
        builder.record_self_write(func, entry.facts, target, args, kwargs, source)
        return tensor

    def _record_factory(self, entry: _Kind, func: Any, args: tuple, kwargs: dict, source: Any) -> Any:
        """A factory's direct record, from its signature's plan when there is one (note [Op plans]
        in record/plans.py); NotImplemented when it is not of the direct record's shape."""
        plans = self.plans
        key = signature(func, entry.facts.takes_dtype, args, kwargs) if plans is not None else None
        plan = plans.get(key) if plans is not None and key is not None else None
        if plan is not None:
            out = planned_fake(self.make_fake, plan.call, args, kwargs, plan.meta_kwargs)
            self.builder.record_planned_factory(func, plan, args, out, source)
            return out
        try:
            out = factory_fake(self.make_fake, func, args, kwargs)
        except Exception:
            return NotImplemented  # the general path raises it again, as a failure naming the op
        if out is NotImplemented or not self.builder.record_factory(func, entry.facts, args, kwargs, out, source):
            return NotImplemented
        if plans is not None and key is not None and (call := factory_meta_call(func)) is not None:
            graph = self.builder.graph
            plans.learn(key, plan_of(call, meta_kwargs(kwargs), graph, graph.ops[-1]))
        return out


_PRIM_DEVICE = torch.ops.prim.device.default
_RESIZE_AS, _RESIZE = torch.ops.aten.resize_as_.default, torch.ops.aten.resize_.default


def _layout(tensor: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(tensor.shape), tuple(tensor.stride())


def _probed_outs(facts: Any, kwargs: dict) -> tuple[OutLayout, ...]:
    """An op's `out=` layouts before it runs: those note [Out layouts as recorded] may probe. None
    for a random op, whose probe would draw."""
    if not facts.may_resize or not kwargs or facts.random:
        return ()
    return out_layouts(facts, kwargs)


_PASS_THROUGH, _VALUE_READ, _INPLACE_VIEW_OP, _INPLACE_RANDOM, _WRITING, _RESOLVE, _CREATE, _DETACH_OP, _OTHER = (
    "pass-through",
    "value-read",
    "inplace-view",
    "inplace-random",
    "writing",
    "resolve",
    "create",
    "detach",
    "other",
)
_BATCH_NORM = "batch-norm"  # note [Batch norm as its kernels run it]


class _Kind(NamedTuple):
    """How the recorder treats an op overload, decided once per overload."""

    func: Any  # kept alive: kinds are found by id(func)
    kind: str
    facts: OpFacts
    direct: bool  # may be recorded by a direct record (note [Direct records])


# `tolist()` of a real tensor under inference mode starts with these; made fake, they would hand
# the caller's tensor back as a fake whose (absent) storage tolist then reads.
_RESOLVE_BIT = {
    _aten.resolve_conj.default: torch.Tensor.is_conj,
    _aten.resolve_neg.default: torch.Tensor.is_neg,
}


# `.item()`, `float()`, `bool()`... reach the mode as `_local_scalar_dense`; under inference mode
# (no autograd keys to decompose them) as the composite `item` / `is_nonzero` themselves.
_VALUE_READS = frozenset({_aten._local_scalar_dense.default, _aten.item.default, _aten.is_nonzero.default})


# By id(): OpOverload hashes in Python (see builder._FACTS_BY_ID); the overload is kept in the entry.
_KINDS: dict[int, _Kind] = {}


def _entry(func: Any) -> _Kind:
    """How the recorder treats `func` (read once per op overload)."""
    entry = _KINDS.get(id(func))
    if entry is None:
        kind = _read_kind(func)
        facts = op_facts(func)
        self_writer = kind in (_INPLACE_RANDOM, _WRITING) and facts.written == SELF_ONLY and not facts.may_resize
        entry = _KINDS[id(func)] = _Kind(func, kind, facts, kind in (_CREATE, _DETACH_OP) or self_writer)
    return entry


def _read_kind(func: Any, batch_norm: bool = True) -> str:
    if func.namespace == "prim":
        return _PASS_THROUGH
    if func in _VALUE_READS:
        return _VALUE_READ
    if func in _RESOLVE_BIT:
        return _RESOLVE
    if batch_norm and func in BATCH_NORMS:
        return _BATCH_NORM
    if _INPLACE_VIEW in func.tags and func is not _aten.resize_.default:
        return _INPLACE_VIEW_OP
    if is_inplace_random(func):
        return _INPLACE_RANDOM
    if written_arguments(func):
        return _WRITING
    if func in FACTORIES:
        return _CREATE
    if func is _aten.detach.default:
        return _DETACH_OP
    return _OTHER


def _on_cpu_only(args: tuple, kwargs: dict) -> bool:
    """True when every tensor among the arguments is a fake standing for a CPU tensor."""
    tensors = [value for value in tree_flatten((args, kwargs))[0] if isinstance(value, torch.Tensor)]
    return bool(tensors) and all(isinstance(t, FakeTensor) and fake_device_of(t).type == "cpu" for t in tensors)
