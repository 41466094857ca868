"""`to_fx`: the recorded initialization program as a `torch.fx.GraphModule`.

One node per recorded op in the closure of the module's deferred tensors (the ops
`materialize_module` would replay), in chronological order, with the aten op the replay runs as its
target (the recorded op, except `lift_fresh` of a constant, which becomes `lifted_copy`); real
tensors the constructor read are constants (`get_attr` of `_external_<i>`); the output is a dict
from every deferred parameter/buffer name to its node (tied names share one). Every node carries
the FX conventions `meta["val"]` (a fake tensor with the recorded shape, stride, dtype and device,
aliasing as the recorded tensors do) and `meta["stack_trace"]` (the constructor line that issued
the op).

Random numbers: each random op node is preceded by an `rng_seek(_rng, key, position)` node and
followed by an `rng_tell(_rng, key, position, result)` node, both marked side-effectful. They drive
the replay's own `RngSession` and `RngStreams` (the program keeps streams of its own): the
generator is put in the state eager construction had just before that op (skipped random ops are
re-run on scratch tensors, states are cached), and the caller's generator state is put back after
each op. So calling the program gives bitwise what `materialize_module(module)` gives with
rng="eager", and leaves the global RNG as it was. A random op given a generator of the
constructor's own takes `generator_in_state(device, _generator_<i>)`: a new generator in the state
it had when the op was recorded (note [A constructor's own generators]).
"""

from __future__ import annotations

import keyword
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import fx, nn

from .._torch_compat.dispatch import OpOverload, tree_flatten, tree_map
from .._torch_compat.fake import FakeTensorMode
from ..errors import MaterializationError
from ..graph import ExternalRef, GeneratorState, InitGraph, OpIndex, OpNode, TensorId, TensorRef
from ..record.fake import handle_of, is_fake
from ..record.scope import outside_recording
from ..replay.materialize import TensorSlot, check_materializable, deferred_slots
from ..replay.preflight import check_replayable
from ..replay.replay import Replay, default_dtype_set, eager_state_after, replayed_func
from ..replay.rng import RngSession, RngStreams, own_generator
from ..replay.routing import describe_absence, is_available, route_devices
from .fake_copies import FakeCopies

if TYPE_CHECKING:
    from ..record.fake import DeferredHandle


class InitRng:
    """The RNG state of an exported program: the replay's scratch runner and streams of its own.

    `seek` opens a `RngSession` and moves the op's generator to the state before random op
    `position` of stream `key`; `tell` records the state after it and closes the session, putting
    the caller's generator state back. The cached states are the program's own (not the module's
    materialization cache): when the program runs on fake or meta tensors (FX tooling such as
    FakeTensorProp), the op draws nothing, and that state is not recorded.
    """

    def __init__(self, graph: InitGraph) -> None:
        self.replay = Replay(graph, route_devices(None, "eager"), remember=False)
        self.streams = RngStreams(graph, eager_state_after)  # a restart may continue another recording
        self._open: list[RngSession] = []

    def seek(self, key: str, position: int) -> None:
        # the program calls the recorded ops as they are: they draw from the default generator
        session = RngSession(self.streams, "eager", self.replay.run_scratch, own_generators=False)
        session.__enter__()
        self._open.append(session)
        try:
            with outside_recording():  # scratch draws for skipped ops are real, whatever mode is on
                session.before_random_op(key, position, key)
        except BaseException:
            self.close()
            raise

    def tell(self, key: str, position: int, drawn: Any) -> None:
        tensors = [t for t in tree_flatten(drawn)[0] if isinstance(t, torch.Tensor)]
        if self._open and not any(is_fake(t) or t.device.type == "meta" for t in tensors):
            self._open[-1].after_random_op(key, position)
        self.close()

    def close(self) -> None:
        """Close any open session (after an op failed between `seek` and `tell`)."""
        while self._open:
            self._open.pop().__exit__(None, None, None)


def rng_seek(rng: InitRng, key: str, position: int) -> None:
    """Put stream `key`'s generator where eager construction had it before random op `position`."""
    rng.seek(key, position)


def rng_tell(rng: InitRng, key: str, position: int, drawn: Any) -> None:
    """Remember the generator state after random op `position` (whose result is `drawn`) and
    restore the caller's state."""
    rng.tell(key, position, drawn)


fx.node.has_side_effect(rng_seek)
fx.node.has_side_effect(rng_tell)


class InitProgram(fx.GraphModule):
    """A GraphModule of a recorded initialization; calling it returns {name: tensor}.

    Runs without autograd and closes the RNG session even when an op fails.
    """

    _preflight: Callable[[], None] | None = None  # to_fx's checks, made again at each call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        preflight = self._preflight
        if preflight is not None:
            preflight()  # MaterializationError before anything runs, as materialize_module's
        try:
            # float32 is the default dtype of ops recorded without one (`OpNode.default_dtype`), as
            # replay runs them, whatever the caller's default
            with torch.no_grad(), default_dtype_set(torch.float32):
                return super().__call__(*args, **kwargs)
        finally:
            rng = getattr(self, "_rng", None)  # absent when the program draws no random numbers
            if rng is not None:
                rng.close()


def _stack_trace(op: OpNode) -> str | None:
    source = op.source
    if source is None:
        return None
    return f'  File "{source.filename}", line {source.lineno}, in {source.function}\n    {source.line}\n'


def call_overload(qualified: str, /, *args: Any, **kwargs: Any) -> Any:
    """Op overload `qualified` ("aten.random_.from") called: for overloads named by a Python keyword,
    which the generated code cannot spell as an attribute."""
    namespace, packet, overload = qualified.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)(*args, **kwargs)


def under_default_dtype(dtype: torch.dtype, qualified: str, /, *args: Any, **kwargs: Any) -> Any:
    """Op overload `qualified` called under the default dtype it was recorded under (an integer
    input promoted to it: note [Default dtype at record time])."""
    with default_dtype_set(dtype):
        return call_overload(qualified, *args, **kwargs)


def under_inference_mode(dtype: torch.dtype | None, qualified: str, /, *args: Any, **kwargs: Any) -> Any:
    """Op overload `qualified` called under `torch.inference_mode()`, as it was recorded (it makes
    inference tensors, as eager's did), and under default dtype `dtype` when one was recorded."""
    with torch.inference_mode():
        if dtype is None:
            return call_overload(qualified, *args, **kwargs)
        return under_default_dtype(dtype, qualified, *args, **kwargs)


def generator_in_state(device: str, state: torch.Tensor) -> torch.Generator | None:
    """A new generator on `device` in `state`: a constructor's own generator as a random op found it."""
    return own_generator(GeneratorState(device, state, "own generator"), torch.device(device))


class _Builder:
    """Emits the FX graph for one recorded graph and a set of target tensors."""

    def __init__(self, graph: InitGraph) -> None:
        self.graph = graph
        self.fx_graph = fx.Graph()
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.copies = FakeCopies(self.mode)
        self.env: dict[TensorId, fx.Node] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self._externals: dict[int, fx.Node] = {}
        self.rng_node: fx.Node | None = None
        self._generators: list[str] = []

    def _fake(self, tid: TensorId) -> torch.Tensor:
        info = self.graph.tensors[tid]
        self.copies.storage(info.storage, self.graph.storages[info.storage].nbytes)
        return self.copies.tensor(info.storage, info.shape, info.stride, info.storage_offset, info.dtype, info.device)

    def _external(self, index: int) -> fx.Node:
        node = self._externals.get(index)
        if node is None:
            name = f"_external_{index}"
            tensor = self.graph.externals[index].value()
            if handle_of(tensor) is not None:  # note [Reading another recording] in record/foreign.py
                raise MaterializationError(
                    "to_fx exports one recorded initialization, but this one reads a tensor of another "
                    "deferred recording (load_state_dict or a copy between two deferred models); "
                    "materialize_module gives the same values"
                )
            self.constants[name] = tensor
            node = self._externals[index] = self.fx_graph.get_attr(name)
            node.meta["val"] = self.mode.from_tensor(tensor)
        return node

    def _argument(self, value: Any) -> Any:
        if isinstance(value, TensorRef):
            return self.env[value.id]
        if isinstance(value, ExternalRef):
            return self._external(value.index)
        if isinstance(value, GeneratorState):
            name = f"_generator_{len(self._generators)}"
            self._generators.append(name)
            self.constants[name] = value.state
            return self.fx_graph.call_function(generator_in_state, (value.device, self.fx_graph.get_attr(name)))
        return value

    def _bind(self, node: fx.Node, outputs: Any) -> Any:
        """Map the op's output refs to nodes (getitem nodes for tuple outputs); returns the fake value."""
        if isinstance(outputs, TensorRef):
            self.env[outputs.id] = node
            return self._fake(outputs.id)
        if isinstance(outputs, (list, tuple)):
            values = []
            for position, item in enumerate(outputs):
                if isinstance(item, (TensorRef, list, tuple)):
                    child = self.fx_graph.call_function(operator.getitem, (node, position))
                    child.meta["val"] = self._bind(child, item)
                    values.append(child.meta["val"])
                else:
                    values.append(item)
            return type(outputs)(values)
        return outputs

    def emit(self, op: OpNode) -> None:
        args, kwargs = tree_map(self._argument, (op.args, op.kwargs))
        if op.stream is not None:
            if self.rng_node is None:
                with self.fx_graph.inserting_before(next(iter(self.fx_graph.nodes), None)):
                    self.rng_node = self.fx_graph.get_attr("_rng")
            self.fx_graph.call_function(rng_seek, (self.rng_node, *op.stream))
        target = replayed_func(op.func)
        overload = isinstance(target, OpOverload)
        if op.inference and overload:
            node = self.fx_graph.call_function(under_inference_mode, (op.default_dtype, str(target), *args), kwargs)
        elif op.default_dtype is not None and overload:
            node = self.fx_graph.call_function(under_default_dtype, (op.default_dtype, str(target), *args), kwargs)
        elif keyword.iskeyword(getattr(target, "_overloadname", "")):  # `random_.from`: FX's code would not parse
            node = self.fx_graph.call_function(call_overload, (str(target), *args), kwargs)
        else:
            node = self.fx_graph.call_function(target, tuple(args), kwargs)
        node.meta["val"] = self._bind(node, op.outputs)
        node.meta["recorded_op"] = op.index
        trace = _stack_trace(op)
        if trace is not None:
            node.meta["stack_trace"] = trace
        if op.stream is not None:
            self.fx_graph.call_function(rng_tell, (self.rng_node, *op.stream, node))


def _names_through_shared_modules(
    module: nn.Module, slots: list[tuple[TensorSlot, torch.Tensor]], tids: list[TensorId], named: dict[str, Any]
) -> list[tuple[str, TensorId]]:
    """The names `slots` lack because a submodule sits at several paths (transformers 4's T5 puts its
    `shared` embedding at `encoder.embed_tokens` too): `deferred_slots` visits each module once, and
    `state_dict()` names every path."""
    tid_of = {id(fake): tid for (_, fake), tid in zip(slots, tids)}
    everything = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return [(name, tid_of[id(tensor)]) for name, tensor in everything if id(tensor) in tid_of and name not in named]


def _refuse_absent_devices(graph: InitGraph, tids: list[TensorId], names: list[str], ops: list[OpIndex]) -> None:
    """The program runs on the recorded devices, which `materialize_module(device=...)` could move
    and `to_fx` cannot: say so, instead of replay's advice to pass a device or an rng mode. The
    devices of the tensors its ops make count too (a CPU parameter computed from a CUDA draw)."""
    for tid, name in zip(tids, names):
        recorded = graph.tensors[tid].device
        if not is_available(recorded):
            raise MaterializationError(
                f"to_fx exports the initialization on the devices it was recorded on: {name!r} was recorded on "
                f"{recorded}, but {describe_absence(recorded)}. Export on a machine that has it, or record the "
                "model on the CPU"
            )
    checked: set[torch.device] = set()
    for index in ops:
        for tid in graph.ops[index].output_ids:
            recorded = graph.tensors[tid].device
            if recorded in checked:
                continue
            checked.add(recorded)
            if not is_available(recorded):
                op = graph.ops[index]
                raise MaterializationError(
                    f"to_fx exports the initialization on the devices it was recorded on: {op.label} (recorded at "
                    f"{op.source or '<unknown source>'}) made a tensor on {recorded}, which the exported tensors "
                    f"are computed from, but {describe_absence(recorded)}. Export on a machine that has it, or "
                    "record the model on the CPU"
                )


def to_fx(module: nn.Module) -> InitProgram:
    """The recorded initialization of `module`'s deferred tensors as an FX GraphModule.

    Calling the result with no arguments returns {name: tensor} for every deferred parameter and
    buffer (in `materialize_module` order, non-persistent buffers included; tied names map to one
    tensor), equal bit for bit to what `materialize_module(module)` would produce (rng="eager",
    recorded devices), computed from scratch. `module` is not changed. Nodes carry `meta["val"]`
    (fake tensors) and `meta["stack_trace"]`; see the module docstring for the RNG nodes.

    Raises MaterializationError for what would make materialization fail (a lazy parameter, a tensor
    changed in place after deferred_init, a changed external tensor, a missing generator), and when
    the module's tensors come from more than one deferred_init.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"explorer.to_fx expects an nn.Module, got {type(module).__name__}")
    slots = deferred_slots(module)
    handles = [cast("DeferredHandle", handle_of(fake)) for _, fake in slots]  # deferred_slots keeps handled fakes only
    graphs = {id(handle.graph): handle.graph for handle in handles}
    if len(graphs) > 1:
        raise MaterializationError(
            f"to_fx exports one recorded initialization, but the tensors of this {type(module).__name__} "
            f"come from {len(graphs)} deferred_init calls; export its submodules one at a time"
        )
    names = [slot[3] for slot, _ in slots]
    for slot, fake in slots:
        check_materializable(fake, slot[3])
    if not slots:
        empty = fx.Graph()
        empty.output({})
        return InitProgram(nn.Module(), empty, class_name=f"{type(module).__name__}Init")
    graph = next(iter(graphs.values()))
    tids = [handle.tensor_id for handle in handles]
    ops = graph.closure_of(tids)
    _refuse_absent_devices(graph, tids, names, ops)
    rng = InitRng(graph)

    def preflight() -> None:
        check_replayable(graph, rng.replay.routing, ops, tids, dict(zip(tids, names)))

    preflight()

    builder = _Builder(graph)
    for index in ops:
        builder.emit(graph.ops[index])
    outputs = {name: builder.env[tid] for name, tid in zip(names, tids)}
    outputs |= {name: builder.env[tid] for name, tid in _names_through_shared_modules(module, slots, tids, outputs)}
    builder.fx_graph.output(outputs)

    root = nn.Module()
    for name, tensor in builder.constants.items():
        root.register_buffer(name, tensor, persistent=False)
    root._rng = rng  # type: ignore[assignment]  # Module.__setattr__'s hint names tensors and modules only
    program = InitProgram(root, builder.fx_graph, class_name=f"{type(module).__name__}Init")
    # checked again at each call: a checkpoint rewritten or a constant changed in place since export
    # would give other values than eager's without a word (materialize_module refuses them too)
    program._preflight = preflight
    return program
