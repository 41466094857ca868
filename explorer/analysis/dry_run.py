"""`dry_run`: a module's forward pass on fake tensors, for shapes, FLOPs and activation memory.

The forward runs under a FakeTensorMode of its own, on fake copies of the module's parameters and
buffers swapped in for the call (`swapped_state.swapped_in`), so nothing about the module changes: a
deferred module stays deferred (its fakes belong to the recording, and an in-place op in forward
would otherwise bump their versions), a real tensor is never read or written, and no op is
recorded. The copies keep the module's aliasing (one fake storage per census storage, so tied
weights and views stay one piece of memory).

What is measured, per module call (global forward hooks, so the module gets no hooks of its own):
output shapes and dtypes, FLOPs (`torch.utils.flop_counter.FlopCounterMode` with `FLOP_MAPPING`, so
attention, grouped-query included, and `aten._grouped_mm` are counted alike on every release; the
difference of its running total across the call, so submodules are included), and activation memory. Activation
memory counts the storages ops create while the forward runs (not parameters, buffers or inputs),
from creation until the last tensor on them is garbage collected: an estimate of what an eager
forward without autograd would hold (allocator rounding and kernel workspaces are not counted).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import pandas as pd
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .._torch_compat.dispatch import TorchDispatchMode, metadata_access, tree_flatten
from .._torch_compat.fake import DataDependentOutputException, DynamicOutputShapeException, FakeTensor, FakeTensorMode
from ..inspection.census import Census, take_census
from ..naming import dtype_name
from ..record.scope import recording_graph
from ..record.source import innermost_user_frame, traceback_frames
from .cpu_fake_mode import CpuFakeTensorMode
from .fake_copies import FakeCopies, layout_extent
from .forward_record import FLOP_MAPPING
from .swapped_state import swapped_in

MODULE_COLUMNS = [
    "name",
    "class",
    "calls",
    "output_shapes",
    "output_dtypes",
    "activation_bytes",
    "peak_activation_bytes",
    "flops",
]


class DryRunError(RuntimeError):
    """The forward pass could not run on fake tensors (names the innermost module that was running)."""


@dataclass(frozen=True, repr=False)
class DryRun:
    """What one fake forward pass did.

    `modules`: one row per module (`named_modules()` order, a shared module once, at its first path):
    - `calls`: how many times its forward ran (0: never called; shapes are then empty lists);
    - `output_shapes` / `output_dtypes`: of the tensors its first call returned, in pytree order;
    - `activation_bytes`: bytes of the tensors it returned, summed over its calls;
    - `peak_activation_bytes`: the most activation memory alive (whole program) while it ran;
    - `flops`: FLOPs of its calls, submodules included (`FlopCounterMode` counting).
    `flops`: total FLOPs; `peak_activation_bytes`: the most activation memory alive at once;
    `output`: what forward returned, with fake tensors; `flops_by_op`: total FLOPs per aten op.
    """

    root_class: str
    modules: pd.DataFrame
    flops: int
    peak_activation_bytes: int
    output: Any
    flops_by_op: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """Three lines for the terminal: total FLOPs, peak activation memory, output shapes."""
        root = self.modules.iloc[0]
        shapes = ", ".join(str(list(shape)) for shape in root["output_shapes"]) or "no tensors"
        return (
            f"{self.root_class} dry run: {self.flops:,} FLOPs\n"
            f"peak activation memory: {self.peak_activation_bytes:,} bytes\n"
            f"outputs: {shapes}"
        )

    def _repr_html_(self) -> str:
        """Rich display in notebooks (the text repr stays for terminals)."""
        from ..render.rich import dry_run_html  # render reads this package: imported when displayed

        return dry_run_html(self)

    def __repr__(self) -> str:
        return self.summary()


# -- fake copies -----------------------------------------------------------------------------------


def _extent_bytes(tensor: torch.Tensor) -> int:
    offset = cast(int, tensor.storage_offset())  # no ShapeEnv here: offsets are ints; torch's hint allows a SymInt
    return layout_extent(tensor.shape, tensor.stride(), offset, tensor.element_size())


def fake_state(census: Census, mode: FakeTensorMode) -> dict[str, FakeTensor]:
    """A fake of `mode` for every parameter and buffer name, one fake storage per census storage.

    Works the same for recorded fakes, materialized and eager tensors: only metadata is read.
    """
    by_storage: dict[int, list] = {}
    with metadata_access():
        for entry in census.tensors:
            if isinstance(entry.tensor, nn.parameter.UninitializedTensorMixin):  # type: ignore[attr-defined]  # parameter.pyi omits it
                raise DryRunError(
                    f"{entry.name!r} is an uninitialized lazy parameter: its shape is only known after a "
                    "first forward with real inputs"
                )
            by_storage.setdefault(entry.storage, []).append(entry)
        state: dict[str, FakeTensor] = {}
        factory = FakeCopies(mode)
        for sid, entries in by_storage.items():
            factory.storage(sid, max([census.storages[sid].nbytes] + [_extent_bytes(e.tensor) for e in entries]))
            copies: dict[int, FakeTensor] = {}  # one fake per tensor object: tied names stay one object
            for entry in entries:
                fake = copies.get(id(entry.tensor))
                if fake is None:
                    fake = copies[id(entry.tensor)] = factory.like(sid, entry.tensor)
                state[entry.name] = fake
    return state


def _fake_input(mode: FakeTensorMode, value: Any) -> Any:
    """Tensors (nested in lists, tuples, dicts) become fakes of `mode`; real ones are read for metadata only."""
    if isinstance(value, FakeTensor):
        factory = FakeCopies(mode)
        factory.storage(0, _extent_bytes(value))
        return factory.like(0, value)
    if isinstance(value, torch.Tensor):
        return mode.from_tensor(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_fake_input(mode, v) for v in value)
    if isinstance(value, Mapping):
        return type(value)({k: _fake_input(mode, v) for k, v in value.items()})  # type: ignore[call-arg]  # dict-like class; the ABC's hint has no __init__ args
    return value


def _is_shape(value: Any) -> bool:
    return isinstance(value, (tuple, list, torch.Size)) and all(type(v) is int for v in value)


def shape_input_dtype(module: nn.Module) -> torch.dtype:
    """The dtype of an input given only by its shape: token ids (int64) when the module's first
    consumer is an embedding (a Hugging Face model whose main input is `input_ids`, or a module whose
    first leaf with parameters is an `nn.Embedding`/`nn.EmbeddingBag`), float32 otherwise."""
    main_input = getattr(module, "main_input_name", None)
    if isinstance(main_input, str):
        return torch.int64 if main_input == "input_ids" else torch.float32
    for sub in module.modules():
        if next(iter(sub.children()), None) is None and next(sub.parameters(recurse=False), None) is not None:
            return torch.int64 if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) else torch.float32
    return torch.float32


def _fake_inputs(
    mode: FakeTensorMode, args: tuple, kwargs: dict, device: torch.device, shape_dtype: torch.dtype
) -> tuple[tuple, dict]:
    """Forward's arguments as fakes of `mode`: a positional tuple of ints is an input of that shape
    and `shape_dtype`."""
    fake_args = []
    for value in args:
        if _is_shape(value):
            with mode:
                fake_args.append(torch.empty(tuple(value), dtype=shape_dtype, device=device))
        else:
            fake_args.append(_fake_input(mode, value))
    return tuple(fake_args), {key: _fake_input(mode, value) for key, value in kwargs.items()}


# -- tracking --------------------------------------------------------------------------------------


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors in a forward's output (pytree order; caches and other objects are skipped)."""
    leaves, _ = tree_flatten(value)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


@dataclass(slots=True)
class _ModuleStats:
    calls: int = 0
    shapes: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)
    activation_bytes: int = 0
    peak: int = 0
    flops: int = 0


class _ActivationTracker(TorchDispatchMode):
    """Counts the bytes of storages ops create, alive until their last tensor is collected.

    A storage is known by its StorageImpl (`_cdata`); every tensor an op returns on it holds a
    reference, released by a weakref finalizer, so views and in-place results are counted once.
    """

    def __init__(self, excluded: set[int]) -> None:
        super().__init__()
        self.excluded = excluded  # storages of parameters, buffers and inputs
        self.refs: dict[int, int] = {}  # live storage → number of tracked tensors on it
        self.sizes: dict[int, int] = {}
        self.tracked: set[int] = set()  # id() of tensors holding a reference
        self.live = 0
        self.peak = 0
        self.frames: list[list[int]] = []  # per running module call: [peak while it ran]

    def _release(self, key: int, tensor_id: int) -> None:
        self.tracked.discard(tensor_id)
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.live -= self.sizes.pop(key)

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.excluded or id(tensor) in self.tracked:
            return
        if key not in self.refs:
            self.refs[key] = 0
            self.sizes[key] = storage.nbytes()
            self.live += self.sizes[key]
            if self.live > self.peak:
                self.peak = self.live
            for frame in self.frames:
                if self.live > frame[0]:
                    frame[0] = self.live
        self.refs[key] += 1
        self.tracked.add(id(tensor))
        weakref.finalize(tensor, self._release, key, id(tensor))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tensor_leaves(out):
            self._track(leaf)
        return out


class _ModuleHooks:
    """Global forward hooks that attribute outputs, FLOPs and memory to module paths."""

    def __init__(self, root: nn.Module, counter: FlopCounterMode, tracker: _ActivationTracker) -> None:
        self.index: dict[int, int] = {}
        self.modules: list[tuple[str, nn.Module]] = list(root.named_modules())
        for position, (_, module) in enumerate(self.modules):
            self.index[id(module)] = position
        self.stats = [_ModuleStats() for _ in self.modules]
        self.counter = counter
        self.tracker = tracker
        self.stack: list[tuple[int, int, list[int]]] = []  # (module position, flops at entry, peak frame)
        self._handles: list = []

    def _flops_now(self) -> int:
        return sum(self.counter.flop_counts["Global"].values())

    def _pre(self, module: nn.Module, args: Any) -> None:
        position = self.index.get(id(module))
        if position is None:
            return
        frame = [self.tracker.live]
        self.tracker.frames.append(frame)
        self.stack.append((position, self._flops_now(), frame))

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        position = self.index.get(id(module))
        if position is None or not self.stack or self.stack[-1][0] != position:
            return
        _, flops_at_entry, frame = self.stack.pop()
        frames = self.tracker.frames
        del frames[max(i for i, f in enumerate(frames) if f is frame)]  # by identity: equal peaks are common
        stats = self.stats[position]
        leaves = tensor_leaves(output)
        if stats.calls == 0:
            stats.shapes = [tuple(leaf.shape) for leaf in leaves]
            stats.dtypes = [dtype_name(leaf.dtype) for leaf in leaves]
        stats.calls += 1
        distinct = {id(leaf): leaf for leaf in leaves}.values()  # a tensor returned twice counts once
        stats.activation_bytes += sum(leaf.numel() * leaf.element_size() for leaf in distinct)
        stats.peak = max(stats.peak, frame[0])
        stats.flops += self._flops_now() - flops_at_entry

    def running(self) -> str | None:
        """Path of the innermost module whose forward is running (for error messages)."""
        if not self.stack:
            return None
        path, module = self.modules[self.stack[-1][0]]
        return f"{path or '<root>'} ({type(module).__name__})"

    def __enter__(self) -> _ModuleHooks:
        self._handles = [
            nn.modules.module.register_module_forward_pre_hook(self._pre),
            nn.modules.module.register_module_forward_hook(self._post),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()

    def table(self) -> pd.DataFrame:
        columns: dict[str, list] = {column: [] for column in MODULE_COLUMNS}
        for (path, module), stats in zip(self.modules, self.stats):
            columns["name"].append(path)
            columns["class"].append(type(module).__name__)
            columns["calls"].append(stats.calls)
            columns["output_shapes"].append(stats.shapes)
            columns["output_dtypes"].append(stats.dtypes)
            columns["activation_bytes"].append(stats.activation_bytes)
            columns["peak_activation_bytes"].append(stats.peak)
            columns["flops"].append(stats.flops)
        return pd.DataFrame(columns, columns=MODULE_COLUMNS)


# -- the public function ---------------------------------------------------------------------------


def _split_inputs(inputs: tuple, kwargs: dict) -> tuple[tuple, dict]:
    if len(inputs) == 1 and isinstance(inputs[0], Mapping) and all(isinstance(k, str) for k in inputs[0]):
        return (), {**inputs[0], **kwargs}
    return inputs, kwargs


@dataclass(frozen=True)
class FakeForward:
    """What a forward on fakes needs: the module's census, the FakeTensorMode, a fake per parameter
    and buffer name (`fake_state`), the device of those fakes, and forward's arguments as fakes."""

    census: Census
    mode: FakeTensorMode
    state: dict[str, FakeTensor]
    device: torch.device
    args: tuple
    kwargs: dict


@contextlib.contextmanager
def unfused_transformer_layers() -> Iterator[None]:
    """`nn.MultiheadAttention` and `nn.TransformerEncoderLayer` take a fused inference kernel in
    eval mode under no_grad (`torch.backends.mha` fast path), which PyTorch's FLOP counter has no
    formula for: a 4-layer encoder counted 0 FLOPs. Within the block they run the composite ops
    the fused kernel stands for (the same math), so FLOPs and activations are counted."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def prepare_fake_forward(
    module: nn.Module, inputs: tuple, kwargs: dict, caller: str, error: type[DryRunError] = DryRunError
) -> FakeForward:
    """The shared setup of `dry_run` and `forward_graph` (`caller`, named in their errors): checks
    `module`, then makes its fake state and reads `inputs`/`kwargs` as `fake_forward_arguments` does.

    Raises TypeError when `module` is not an nn.Module, `error` when called inside `deferred_init`,
    DryRunError for an uninitialized lazy parameter (`fake_state`).
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"explorer.{caller} expects an nn.Module, got {type(module).__name__}")
    if recording_graph() is not None:
        raise error(f"{caller} cannot run inside deferred_init: call it on the module deferred_init returned")
    census = take_census(module)
    mode = CpuFakeTensorMode(allow_non_fake_inputs=True)
    state = fake_state(census, mode)
    device = next(iter(state.values())).device if state else torch.device("cpu")
    args, kwargs = fake_forward_arguments(module, mode, device, inputs, kwargs)
    return FakeForward(census, mode, state, device, args, kwargs)


def not_on_fakes_message(where: str, error: BaseException) -> str:
    """The message of a forward that failed on fakes while `where` (a module path and class) ran,
    ending with the innermost line of user code in `error`'s traceback (torch and explorer skipped):
    the line that read a value (`if x.sum() > 0`, a LayerDrop `if torch.rand([]) < p`)."""
    why = ""
    if isinstance(error, (DataDependentOutputException, DynamicOutputShapeException)):
        why = " (it depends on tensor values, which fake tensors do not have)"
    location = innermost_user_frame(traceback_frames(error.__traceback__))
    at = f" (at {location}: {location.line})" if location is not None else ""
    return f"the forward of {where} cannot run on fake tensors{why}: {type(error).__name__}: {error}{at}"


def dry_run(module: nn.Module, *inputs: Any, **kwargs: Any) -> DryRun:
    """Run `module`'s forward on fake tensors: output shapes, FLOPs and activation memory, no storage.

    `module` may be deferred, partly materialized or eager; it is not changed (its tensors are
    swapped for fake copies only during the call), nothing is recorded and the global CPU RNG state
    is left as it was. `inputs` are forward's positional arguments: tensors (real ones are only read
    for metadata), tuples of ints (an input of that shape on the module's device: token ids, int64,
    when the first consumer is an embedding, else float32; see `shape_input_dtype`), or a single
    dict of keyword arguments; `kwargs` are passed on too. Runs without autograd.

    Raises DryRunError naming the innermost running module when the forward cannot run on fake
    tensors (e.g. it reads a tensor's values), TypeError when `module` is not an nn.Module.
    """
    fake = prepare_fake_forward(module, inputs, kwargs, "dry_run")
    mode, state, args, kwargs = fake.mode, fake.state, fake.args, fake.kwargs
    excluded = {t.untyped_storage()._cdata for t in state.values()}
    excluded |= {t.untyped_storage()._cdata for t in tensor_leaves((args, kwargs))}

    counter = FlopCounterMode(display=False, custom_mapping=FLOP_MAPPING)
    tracker = _ActivationTracker(excluded)
    hooks = _ModuleHooks(module, counter, tracker)
    rng_state = torch.get_rng_state()
    try:
        with torch.no_grad(), unfused_transformer_layers(), mode, counter, tracker, hooks:
            try:
                with swapped_in(module, state):  # note [Each slot swapped once]
                    output = module(*args, **kwargs)
            except Exception as error:
                where = hooks.running() or f"<root> ({type(module).__name__})"
                raise DryRunError(not_on_fakes_message(where, error)) from error
    finally:
        torch.set_rng_state(rng_state)
    flops_by_op = {str(op): count for op, count in counter.flop_counts["Global"].items()}
    return DryRun(
        root_class=type(module).__name__,
        modules=hooks.table(),
        flops=sum(flops_by_op.values()),
        peak_activation_bytes=tracker.peak,
        output=output,
        flops_by_op=flops_by_op,
    )


def fake_forward_arguments(
    module: nn.Module, mode: FakeTensorMode, device: torch.device, inputs: tuple, kwargs: dict
) -> tuple[tuple, dict]:
    """Forward's arguments as fakes of `mode`, read exactly as `dry_run` reads `inputs` and `kwargs`
    (shapes, tensors, a single dict of keyword arguments); the named entry point `train_step` uses."""
    args, kwargs = _split_inputs(inputs, kwargs)
    return _fake_inputs(mode, args, kwargs, device, shape_input_dtype(module))
