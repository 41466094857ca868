"""Recording a forward pass op by op: each aten call on fake tensors, owned by the module that ran it.

`ForwardRecorder` is a TorchDispatchMode that writes every op into an `InitGraph` (the same plain
data the construction recording fills, so the diagram code draws both), and `ModuleStack` keeps,
with global forward pre/post hooks, which module's forward is running: that module owns the op.

Note: [Forward tensors stay alive while recording]
Tensors are known by `id()` and storages by their StorageImpl address; both are reused by Python
and the allocator once freed. The recorder holds every tensor it saw until it is done, so no id
is reused within one recording (fakes have no storage: this costs metadata only).

Ops recorded here are never replayed: a parameter or input has no producer in the forward graph
(`producer == NO_PRODUCER`), so `InitGraph.closure_of` must not be asked about them.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from .._torch_compat.dispatch import TorchDispatchMode
from .._torch_compat.flops import counter_mapping, flop_formulas
from ..graph import InitGraph, OpNode, StorageInfo, TensorInfo, TensorRef
from ..record.builder import op_facts

NO_PRODUCER = -1  # TensorInfo.producer of a tensor the forward did not make (parameter, input, constant)


class ModuleStack:
    """Which module's forward is running, from global forward hooks (the module gets none of its own).

    A module called under several paths (shared) is known by its first path, as in `named_modules()`.
    """

    def __init__(self, root: nn.Module) -> None:
        self.paths: dict[int, str] = {}
        self.classes: dict[str, str] = {}
        for path, module in root.named_modules():
            self.paths.setdefault(id(module), path)
            self.classes.setdefault(path, type(module).__name__)
        self.stack: list[str] = [""]
        self._handles: list = []

    @property
    def current(self) -> str:
        return self.stack[-1]

    def _pre(self, module: nn.Module, args: Any) -> None:
        path = self.paths.get(id(module))
        if path is not None:
            self.stack.append(path)

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        path = self.paths.get(id(module))
        if path is not None and len(self.stack) > 1 and self.stack[-1] == path:
            self.stack.pop()

    def __enter__(self) -> ModuleStack:
        self._handles = [
            nn.modules.module.register_module_forward_pre_hook(self._pre),
            nn.modules.module.register_module_forward_hook(self._post),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()


_aten = torch.ops.aten


def grouped_mm_flops(a_shape: tuple, b_shape: tuple, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """FLOPs of `aten._grouped_mm` (torch has no formula; fused MoE experts run through it), from the
    operands' shapes in `torch.utils.flop_counter`'s shape convention: 2-D x 3-D (rows, each through
    one expert) 2·M·K·N, 3-D x 3-D (batched) 2·G·M·K·N, 2-D x 2-D (groups split K) 2·M·K·N, 3-D x 2-D
    (groups split the rows of the output) 2·K for each output element."""
    if len(a_shape) == 3 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[-1]
    if len(a_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[-1]
    return 2 * a_shape[-1] * out_shape[0] * out_shape[1]


def draws_random(func: Any, args: tuple, kwargs: dict) -> bool:
    """A seeded op that would draw: attention's dropout does not at `dropout_p == 0`."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == "dropout_p":
            value = args[position] if position < len(args) else kwargs.get("dropout_p", argument.default_value)
            return value != 0
    return True


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments or result, in order (lists, tuples and dicts walked: cheaper
    than pytree for the flat argument lists aten calls carry)."""
    found: list[torch.Tensor] = []
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            pending.extend(reversed(item))
        elif isinstance(item, dict):
            pending.extend(reversed(list(item.values())))
    return found


def _has_tensor(items: list | tuple) -> bool:
    return any(isinstance(item, (torch.Tensor, list, tuple, dict)) for item in items)


# Formulas torch has for no release; `FLOP_MAPPING` adds the attention formulas the running release
# lacks (`explorer._torch_compat.flops`), and `FlopCounterMode(custom_mapping=FLOP_MAPPING)` counts
# with exactly `FLOP_FORMULAS`, so dry_run and forward_graph give the same counts on every release.
EXTRA_FLOP_FORMULAS = {_aten._grouped_mm: grouped_mm_flops}
FLOP_MAPPING = counter_mapping(EXTRA_FLOP_FORMULAS)
FLOP_FORMULAS = flop_formulas(FLOP_MAPPING)


def op_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one aten call by `FLOP_FORMULAS` (0 for ops it has none for).

    Mirrors `FlopCounterMode._count_flops` (torch 2.11 to 2.15): re-check the call convention on upgrades.
    """
    formula = FLOP_FORMULAS.get(func.overloadpacket)
    return int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0


class ForwardRecorder(TorchDispatchMode):
    """Writes each aten call into `graph`, owned by `modules.current`; see the module docstring."""

    def __init__(self, modules: ModuleStack) -> None:
        super().__init__()
        self.graph = InitGraph()
        self.modules = modules
        self.owners: list[str] = []  # per op: the module path that ran it
        self.flops: list[int] = []  # per op
        self.created_bytes: list[int] = []  # per op: bytes of the storages it created
        self._tensor_ids: dict[int, int] = {}
        self._storage_ids: dict[int, int] = {}
        self._alive: list[torch.Tensor] = []  # See: note [Forward tensors stay alive while recording]

    def known_id(self, tensor: torch.Tensor) -> int | None:
        """The id of `tensor` when an op read or made it, else None."""
        return self._tensor_ids.get(id(tensor))

    def tensor_id(self, tensor: torch.Tensor, producer: int = NO_PRODUCER) -> int:
        """The id of `tensor` in the graph, registering it (and its storage) on first sight."""
        known = self._tensor_ids.get(id(tensor))
        if known is not None:
            return known
        storage = tensor.untyped_storage()
        sid = self._storage_ids.get(storage._cdata)
        if sid is None:
            sid = self._storage_ids[storage._cdata] = len(self._storage_ids)
            self.graph.storages[sid] = StorageInfo(sid, storage.nbytes(), tensor.device, producer)
            if producer != NO_PRODUCER:
                self.graph.writers[sid] = [producer]
        tid = self._tensor_ids[id(tensor)] = len(self._tensor_ids)
        self.graph.tensors[tid] = TensorInfo(
            tid,
            sid,
            producer,
            tuple(tensor.shape),
            tuple(tensor.stride()),
            cast(int, tensor.storage_offset()),  # no ShapeEnv here: offsets are ints; torch's hint allows a SymInt
            tensor.dtype,
            tensor.device,
            tensor.requires_grad,
            isinstance(tensor, nn.Parameter),
        )
        self._alive.append(tensor)
        return tid

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace != "prim":  # metadata queries (`prim.device`): no data flows
            self._record(func, args, kwargs, out)
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        index = len(self.graph.ops)
        inputs = tuple(self.tensor_id(leaf) for leaf in tensors_in((args, kwargs)))
        output_ids = tuple(self.tensor_id(leaf, index) for leaf in tensors_in(out))
        storages = (self.graph.tensors[tid].storage for tid in output_ids)
        creates = tuple(dict.fromkeys(sid for sid in storages if self.graph.storages[sid].creator == index))
        facts = op_facts(func)
        written = []
        for position, name in facts.written:
            value = args[position] if position is not None and position < len(args) else kwargs.get(name)
            if isinstance(value, torch.Tensor):
                written.append(self.graph.tensors[self.tensor_id(value)].storage)
        for sid in written:
            self.graph.writers.setdefault(sid, []).append(index)
        aliases_only = not creates and not written and bool(output_ids)
        self.graph.ops.append(
            OpNode(
                index=index,
                func=func,
                args=self._references(args),
                kwargs=self._references(kwargs),
                outputs=None,
                output_ids=output_ids,
                inputs=inputs,
                reads=frozenset() if aliases_only else frozenset(inputs),
                externals=(),
                writes=tuple(written),
                creates=creates,
                aliases_only=aliases_only,
                random=draws_random(func, args, kwargs),
                source=None,
            )
        )
        self.owners.append(self.modules.current)
        self.flops.append(op_flops(func, args, kwargs, out))
        self.created_bytes.append(sum(self.graph.storages[sid].nbytes for sid in creates))

    def _references(self, value: Any) -> Any:
        """`value` with each tensor replaced by its TensorRef (lists, tuples and dicts walked)."""
        if isinstance(value, torch.Tensor):
            return TensorRef(self.tensor_id(value))
        if isinstance(value, (list, tuple)):
            return type(value)(self._references(item) for item in value) if _has_tensor(value) else value
        if isinstance(value, dict):
            return {key: self._references(item) for key, item in value.items()}
        return value

    def release(self) -> None:
        """Drop the tensors held while recording (the graph keeps metadata only)."""
        self._alive.clear()
        self._tensor_ids.clear()
        self._storage_ids.clear()
