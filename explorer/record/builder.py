"""Turning aten calls on fake tensors into `OpNode`s of an `InitGraph`.

`GraphBuilder` is called by the recording modes after each op has run under FakeTensorMode. It
gives every new fake tensor an id, every new storage an id, and notes which storages each op
writes (from the op's schema) so that `InitGraph.closure_of` can later find what to replay.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import torch

from .._torch_compat.dispatch import metadata_access, storage_id, storage_of
from .._torch_compat.fake import FakeTensor, fake_device_of
from ..errors import DeferredInitError
from ..graph import (
    OVERWRITING_OPS,
    ExternalRef,
    ExternalTensor,
    InitGraph,
    OpIndex,
    OpNode,
    OutLayout,
    SourceLocation,
    StorageId,
    StorageInfo,
    TensorId,
    TensorInfo,
    TensorRef,
)
from ..naming import dtype_name
from . import rng_ledger
from .fake import HANDLE_ATTR, DeferredHandle, DeferredTensor, describe, handle_of, version_of
from .foreign import READ_DEFERRED, mixed_recordings
from .generators import capture_start_state, stream_key
from .initializers import INITIALIZER_OPS
from .plans import FactoryPlan, Layout
from .private_generators import given_generator, move_on_like_eager, recorded_generator
from .scope import outside_recording
from .source import building_modules

_aten = torch.ops.aten
_SEEDED = torch.Tag.nondeterministic_seeded
# Argument types stored as they are (checked first: most arguments are one of these).
_PLAIN_ARGUMENTS = frozenset(
    {int, float, bool, str, type(None), torch.device, torch.dtype, torch.layout, torch.memory_format}
)


PLAIN_ARGUMENTS = _PLAIN_ARGUMENTS

_NO_READS: frozenset = frozenset()
SELF_ONLY = ((0, "self"),)  # `OpFacts.written` of an op that writes its first argument only
# The C method itself: DeferredTensor.untyped_storage wraps storages for users (record/no_data.py),
# which the recorder, asking for every op's storages, does not need.
_storage = storage_of
# The address of a tensor's StorageImpl, which is `_storage(t)._cdata` without making the Python
# storage object (half the cost; asked for every fake argument of every op). Private to torch:
# re-check on upgrades (tests/explorer/record/test_direct_records.py records alias-heavy programs).
_storage_key: Callable[[torch.Tensor], int] = storage_id
_stream_keys: dict[torch.device, str] = {}


class OpFacts(NamedTuple):
    """What the recorder needs to know about an op overload, read once from its schema and tags."""

    written: tuple[tuple[int | None, str], ...]  # see `written_arguments`
    random: bool  # draws random numbers (`nondeterministic_seeded`)
    overwrites_self: bool  # overwrites `self` without reading it (OVERWRITING_OPS)
    takes_dtype: bool  # has a keyword-only `dtype` (note [Default dtype at record time])
    may_resize: bool  # may grow a storage it writes: only out= arguments and the resize/set family
    returned: tuple[int | None, str] | None  # the written argument it returns (`returned_argument`)


# OpOverload hashes in Python (torch/_ops.py): an op's facts are found by its id() instead, the
# overload kept alive beside them so the id is never reused. Ops repeat by the thousand.
_FACTS_BY_ID: dict[int, tuple[Any, OpFacts]] = {}


def op_facts(func: Any) -> OpFacts:
    """The `OpFacts` of an op overload (read once per overload)."""
    entry = _FACTS_BY_ID.get(id(func))
    if entry is None:
        entry = _FACTS_BY_ID[id(func)] = (func, _read_facts(func))
    return entry[1]


def _read_facts(func: Any) -> OpFacts:
    written = written_arguments(func)
    name = func._schema.name.split("::")[-1]
    may_resize = any(argument != "self" for _, argument in written) or "resize" in name or name.startswith("set_")
    overwrites = func in OVERWRITING_OPS or func in INITIALIZER_OPS
    return OpFacts(written, _SEEDED in func.tags, overwrites, _takes_dtype(func), may_resize, _returned_position(func))


def _contents_read(
    inputs: list[TensorId], written_tids: list[TensorId], aliases_only: bool, overwrites_self: bool
) -> frozenset[TensorId]:
    """The inputs whose contents an op reads: none for pure aliasing; an op that overwrites its
    target does not read the target's old contents, unless that is also its source (`x.copy_(x)`)."""
    if aliases_only or not inputs:
        return _NO_READS
    if overwrites_self and written_tids:
        target = written_tids[0]
        if len(inputs) == 1:  # `w.normal_()`, `w.fill_(1)`: reads nothing
            return _NO_READS if inputs[0] == target else frozenset(inputs)
        return frozenset(inputs) if inputs.count(target) > 1 else frozenset(inputs) - {target}
    return frozenset(inputs)


@functools.cache
def written_arguments(func: Any) -> tuple[tuple[int | None, str], ...]:
    """(position, name) of every argument the op's schema marks as written (`Tensor(a!)`); the
    position is None for keyword-only arguments (`out=`)."""
    return tuple(
        (None if argument.kwarg_only else position, argument.name)
        for position, argument in enumerate(func._schema.arguments)
        if argument.alias_info is not None and argument.alias_info.is_write
    )


def _returned_position(func: Any) -> tuple[int | None, str] | None:
    """(position, name) of the written argument an op returns itself (`Tensor(a!)` in and out: `self`
    of an in-place op, `out=`), position None for a keyword-only one; None for other ops."""
    returns = func._schema.returns
    if len(returns) != 1 or returns[0].alias_info is None or not returns[0].alias_info.is_write:
        return None
    alias = returns[0].alias_info.before_set
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write and argument.alias_info.before_set == alias:
            return (None if argument.kwarg_only else position), argument.name
    return None


def _returned_argument(returned: tuple[int | None, str], args: tuple, kwargs: dict, out: Any) -> Any:
    """What an op that returns written argument `returned` returns, as its schema says: that
    argument. A fake kernel can hand back another tensor (FakeTensorMode's `slice_scatter.out`
    returns `self`), and the recording would then bind the result to the wrong tensor."""
    position, name = returned
    value = kwargs.get(name) if position is None else (args[position] if position < len(args) else kwargs.get(name))
    return value if isinstance(value, torch.Tensor) else out


def out_layouts(facts: OpFacts, kwargs: dict) -> tuple[OutLayout, ...]:
    """An op's keyword-only written tensors (`out`, `(Q, R)`) as laid out now, each that starts at
    its storage's beginning: `OpNode.out_layouts` after its kernel ran, and what the recorder
    compares it with before (note [Out layouts as recorded] in replay/replay.py)."""
    return tuple(
        (name, tuple(tensor.shape), tuple(tensor.stride()))
        for position, name in facts.written
        if position is None and isinstance(tensor := kwargs.get(name), torch.Tensor) and tensor.storage_offset() == 0
    )


# `torch.tensor([...])` lifts a constant it has just made: only the recording holds it.
_LIFTS = frozenset({_aten.lift_fresh.default, _aten.lift_fresh_copy.default})


@functools.cache
def views_external(func: Any) -> bool:
    """True when a real tensor argument's memory is aliased by the op's output (view ops: schema
    `-> Tensor(a)`), except for the fresh constants of `torch.tensor([...])`."""
    if func in _LIFTS:
        return False
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


# `Tensor.to` reaches the dispatcher as itself (not `_to_copy`) under inference mode; its schema says
# it may alias `self`, which it does only when nothing changes.
_TO_OPS = frozenset({_aten.to.dtype, _aten.to.device, _aten.to.other, _aten.to.dtype_layout})


def _copied_by_to(func: Any, args: tuple, out: Any) -> bool:
    """True for a `Tensor.to` call whose result is a new tensor (its dtype or device changed)."""
    if func not in _TO_OPS or not args or not isinstance(args[0], torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    device = fake_device_of(out) if isinstance(out, FakeTensor) else out.device
    return out.dtype != args[0].dtype or device != args[0].device


def _snapshot_of_foreign_memory(tensor: torch.Tensor) -> torch.Tensor:
    """Note: [Constants made from foreign memory]
    `torch.tensor(ndarray)`, `torch.from_numpy(a)`, `torch.as_tensor(a)` and `torch.frombuffer(b)`
    lift a tensor over memory torch did not allocate (its storage cannot be resized): numpy's or a
    buffer's. Eager copies the values out of it when the constructor runs (`torch.tensor`, then
    `.clone()` or a dtype change); a later write into the array (a scratch array refilled in a
    loop, the caller's table reused after deferred_init) must not change what materializes. So the
    recording keeps a copy of that memory as it is now: its storage's bytes, with the same layout.
    Eager's `from_numpy` tensor keeps sharing the array, which the copy does not: a write into the
    array after that, or through the tensor into the array, is not followed (README, Limitations)."""
    with outside_recording(), torch.inference_mode(tensor.is_inference()):
        copy = torch.empty((0,), dtype=tensor.dtype, device=tensor.device)
        return copy.set_(_storage(tensor).clone(), tensor.storage_offset(), tensor.shape, tensor.stride())


def _argument(args: tuple, kwargs: dict, position: int | None, name: str) -> Any:
    """An argument given by position or by name (`written_arguments` says which it may be)."""
    if position is not None and position < len(args):
        return args[position]
    return kwargs.get(name)


def _covers_storage(tensor: torch.Tensor, storage_nbytes: int | None = None) -> bool:
    """True when writing every element of `tensor` writes every byte of its storage (whose size
    is asked of the storage unless the caller knows it)."""
    if tensor.storage_offset() != 0 or not tensor.is_contiguous():
        return False
    if storage_nbytes is None:
        storage_nbytes = _storage(tensor).nbytes()
    return tensor.numel() * tensor.element_size() == storage_nbytes


def _name_in(model: torch.nn.Module, tensor: torch.Tensor) -> str | None:
    """The name under which `model` holds `tensor`, or a tensor over the same memory (`p.data`)."""
    key = _storage_key(tensor)
    named = (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False))
    for name, held in named:
        if held is tensor:
            return name
    for name, held in named:
        if not isinstance(held, FakeTensor) and _storage_key(held) == key:
            return name
    return None


# Note: [External tensors are kept as read]
# A real tensor the recording reads (a module argument, a tensor made before deferred_init, an
# `nn.Parameter(ext)` the constructor wrapped) is kept twice: the object itself, whose version
# counter tells in-place writes made later (replay refuses them, replay/preflight.py), and its
# storage with the dtype and layout it had when read, which is what replay reads. What happens to
# the caller's object afterwards — `.data = x`, `torch.utils.swap_tensors`, a module cast such as
# `model.double()` converting a real parameter the constructor read — then cannot change what
# replay reads, as it could not change what eager construction read. (A detached alias would do
# both, but below autograd, where recording runs, `detach` does not share the version counter.)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


# Note: [Default dtype at record time]
# A factory op called without `dtype` (torch.empty, linspace, scalar_tensor, randn...) takes
# torch.get_default_dtype() at the moment it runs. Constructors change it while they run
# (Hugging Face's `from_config(config, dtype=torch.bfloat16)` sets it around __init__), and replay
# runs later under whatever default is current then. So an op whose schema has a keyword-only
# `dtype` left unset is recorded with the dtype its output actually had; for ops whose dtype
# follows their floating inputs (sums, new_empty, _to_copy) that is the same computation. An op
# given integer or bool tensors can still take the default by type promotion (`arange(n) / 3`,
# `int_tensor * 0.5`, `arange(n).sqrt()`, `arange(n) * 1j`), and such an op cannot be given a
# dtype: the general record keeps the default it ran under (`OpNode.default_dtype`, when it is
# not float32), and replay runs it under that default (`replay.default_dtype_set`).
@functools.cache
def _takes_dtype(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is not None and any(a.name == "dtype" and a.kwarg_only for a in schema.arguments)


def all_plain(values: Any) -> bool:
    """True when every value is stored as it is (`_PLAIN_ARGUMENTS`, or a list or tuple of them)."""
    plain = _PLAIN_ARGUMENTS
    for value in values:
        kind = type(value)
        if kind in plain:
            continue
        if kind is not list and kind is not tuple:
            return False
        for item in value:
            if type(item) not in plain:
                return False
    return True


# Note: [Direct records]
# Constructors issue a few op shapes by the thousand, layer after layer (`empty` + `detach` +
# `uniform_` + `normal_` per Linear weight): a factory with plain arguments, `detach` of one fake,
# and an op writing only its fake `self`. `GraphBuilder.record` treats any op (tensors in lists,
# real tensors from outside, out= arguments, resizes); for these shapes most of its questions have a
# known answer, and `record_factory`, `record_detach` and `record_self_write` build the same
# `OpNode` directly (tests/explorer/record/test_direct_records.py compares whole graphs recorded
# both ways). `RecordingDispatchMode` picks them; any other op takes `record`.


def _first_tensor_dtype(out: Any) -> torch.dtype | None:
    if isinstance(out, torch.Tensor):
        return out.dtype
    if isinstance(out, (list, tuple)):
        for item in out:
            if isinstance(item, torch.Tensor):
                return item.dtype
    return None


class GraphBuilder:
    """Appends ops to one graph; keeps the only references from storages to ids."""

    def __init__(self, graph: InitGraph) -> None:
        self.graph = graph
        self._storage_ids: dict[int, int] = {}
        self._storage_keys: list[int] = []  # storage id → address key
        self._storage_objects: list[torch.UntypedStorage] = []  # keeps storage addresses unique
        self._storage_anchor: dict[int, TensorId] = {}
        # Weak: holding fakes would change what PyTorch does (`.data` detaches twice when the first
        # result is still referenced elsewhere). Keyed by id() so `unreferenced` can drop one.
        self._fakes: dict[int, weakref.ref] = {}
        # Fake storages that are views of real tensors from outside: replay aliases the real memory.
        self._external_views: set[int] = set()
        # ...and which externals (indices into graph.externals) each of those storages views.
        self._viewed_externals: dict[int, tuple[int, ...]] = {}
        self._tensor_refs: list[TensorRef] = []  # TensorRef(i) at i, made once (see _tensor_ref)
        # Whether writing all of tensor `tid` writes all of its storage, with the storage's size then
        # (a storage another view resized since is asked again): constructors write each tensor twice.
        self._covering: dict[TensorId, tuple[int, bool]] = {}
        # device → (generator key, the graph's positions list of that stream), once the stream exists
        self._streams: dict[torch.device, tuple[str, list[OpIndex]]] = {}
        # The model of the `with deferred(model):` block recording now, if one is: names its tensors
        # in errors (`_real_write_refusal`).
        self.block_model: torch.nn.Module | None = None

    # -- ids ---------------------------------------------------------------------------------
    def _storage_id(self, tensor: torch.Tensor, device: torch.device, creator: int) -> tuple[int, bool]:
        key = _storage_key(tensor)
        sid = self._storage_ids.get(key)
        if sid is not None:
            return sid, False
        storage = _storage(tensor)
        sid = len(self._storage_keys)
        self._storage_ids[key] = sid
        self._storage_keys.append(key)
        self._storage_objects.append(storage)
        self.graph.storages[sid] = StorageInfo(sid, storage.nbytes(), device, creator)
        self.graph.writers[sid] = [creator]
        return sid, True

    def _new_tensor(self, tensor: FakeTensor, producer: int) -> tuple[TensorId, int | None]:
        """Register a fake that an op produced; returns its id and its storage id if new."""
        device = fake_device_of(tensor)
        sid, created = self._storage_id(tensor, device, producer)
        tensors = self.graph.tensors
        tid = len(tensors)
        tensors[tid] = TensorInfo(
            tid,
            sid,
            producer,
            tensor.shape,
            tensor.stride(),
            cast(int, tensor.storage_offset()),  # no ShapeEnv while recording: never a SymInt
            tensor.dtype,
            device,
            tensor.requires_grad,
            conj=tensor.is_conj(),
            neg=tensor.is_neg(),
        )
        if sid not in self._storage_anchor:
            self._storage_anchor[sid] = tid
        if type(tensor) is FakeTensor:
            tensor.__class__ = DeferredTensor
        tensor.__dict__[HANDLE_ATTR] = DeferredHandle(self.graph, tid, version_of(tensor))
        self._remember(tensor)
        return tid, (sid if created else None)

    def _remember(self, tensor: torch.Tensor) -> None:
        # A dead entry is harmless: a new fake reusing its id() replaces it. It is popped first so that
        # the new fake goes last: `finish` records trailing `.data = x` swaps in this dict's order,
        # which must be the order fakes were made, not where a reused address once stood.
        fakes = self._fakes
        fakes.pop(id(tensor), None)
        fakes[id(tensor)] = weakref.ref(tensor)

    @contextlib.contextmanager
    def unreferenced(self, tensors: tuple[torch.Tensor, ...]) -> Iterator[None]:
        """Drop the weak references to `tensors` for the block, then take them again.

        `torch.utils.swap_tensors` (which `Module._apply` uses on fake parameters: `.to(dtype)`,
        `.float()` inside a constructor) refuses a tensor that has a weak reference.
        """
        dropped = [tensor for tensor in tensors if self._fakes.pop(id(tensor), None) is not None]
        try:
            yield
        finally:
            for tensor in dropped:
                self._remember(tensor)

    def id_of(self, tensor: FakeTensor, source: SourceLocation | None) -> TensorId:
        """The id of a fake input. Fakes made behind the dispatcher's back (`_make_subclass`), or
        whose storage `.data = x` swapped in C++, get a synthetic alias op recorded now."""
        handle = tensor.__dict__.get(HANDLE_ATTR)
        storage_key = _storage_key(tensor)
        if handle is not None:
            if handle.graph is not self.graph:
                raise mixed_recordings(source)
            info = self.graph.tensors[handle.tensor_id]
            if (
                self._storage_keys[info.storage] == storage_key
                and tensor.shape == info.shape
                and tensor.stride() == info.stride
                and tensor.storage_offset() == info.storage_offset
            ):  # `_unchanged`, inlined: this runs for every fake argument of every op
                return handle.tensor_id
            name = "set_data"
        else:
            name = "alias"
        sid = self._storage_ids.get(storage_key)
        if sid is None and handle is not None and torch.Tensor.untyped_storage(tensor).device.type != "meta":
            when = "after deferred_init" if self.graph.finished else "inside the constructor"
            noticed = source or ("materialization" if self.graph.finished else "the end of the recording")
            raise DeferredInitError(
                f"{describe(tensor)} had its .data set to a real tensor {when} (noticed at {noticed}); a "
                "deferred tensor can only take deferred data. Replace the parameter instead "
                "(module.weight = nn.Parameter(x)), or copy into it (with torch.no_grad(): module.weight.copy_(x))"
            )
        if sid is None:
            raise DeferredInitError(
                f"a fake tensor that deferred_init did not create was used at {source}; "
                "it may come from another FakeTensorMode"
            )
        return self.alias(tensor, self._storage_anchor[sid], name=name, source=source)

    def records_storage_of(self, tensor: torch.Tensor) -> bool:
        """True when `tensor` views a storage of this recording (a real tensor given a fake's data:
        note [A materialized tensor given deferred data] in record/redeferred.py)."""
        return _storage_key(tensor) in self._storage_ids

    def recorded_device_of(self, tensor: torch.Tensor) -> torch.device:
        """The device recorded for the storage `tensor` views (`records_storage_of` must hold)."""
        return self.graph.storages[self._storage_ids[_storage_key(tensor)]].device

    def refuse_other_recordings(self, args: tuple, kwargs: dict, source: SourceLocation | None) -> None:
        """Refuse an op given a fake of another recording, before fake mode runs it.

        `record` refuses such an op too (`id_of`), but only after fake mode ran it, and fake mode
        takes a fake of another FakeTensorMode for a real tensor: it rebuilds it as a meta tensor
        from its view base, which `.data = x` may have given another dtype (`base.data = floats`
        after `view = base[0:1]` of an int64 `base`). That rebuild then fails inside PyTorch
        ("float32 != int64", "view Float as Long"), hiding the refusal that says what to do.
        """
        for value in (*args, *kwargs.values()):
            if isinstance(value, (list, tuple)):  # Tensor[] arguments (cat, stack, index_put_)
                for item in value:
                    self._refuse_if_other_recording(item, source)
            else:
                self._refuse_if_other_recording(value, source)

    def _refuse_if_other_recording(self, value: Any, source: SourceLocation | None) -> None:
        if isinstance(value, FakeTensor):
            handle = value.__dict__.get(HANDLE_ATTR)
            if handle is not None and handle.graph is not self.graph:
                raise mixed_recordings(source)

    def _unchanged(self, tensor: FakeTensor, handle: DeferredHandle) -> bool:
        """True when `tensor` of this graph has the storage and layout its id was recorded with."""
        if handle.graph is not self.graph:
            return False
        info = self.graph.tensors[handle.tensor_id]
        return (
            self._storage_keys[info.storage] == _storage_key(tensor)
            and tensor.shape == info.shape
            and tensor.stride() == info.stride
            and tensor.storage_offset() == info.storage_offset
        )

    def alias(self, tensor: FakeTensor, base: TensorId, *, name: str, source: SourceLocation | None) -> TensorId:
        """Record `tensor` as an alias of `base` by its metadata (for `.data = x`, `_make_subclass`)."""
        index = len(self.graph.ops)
        if tensor.dtype == self.graph.tensors[base].dtype:
            func, args = (
                _aten.as_strided.default,
                (TensorRef(base), tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()),
            )
        else:
            raise DeferredInitError(f"cannot record a {tensor.dtype} alias of a storage at {source}")
        op = OpNode(
            index=index,
            func=func,
            args=args,
            kwargs={},
            outputs=None,
            output_ids=(),
            inputs=(base,),
            reads=frozenset(),
            externals=(),
            writes=(),
            creates=(),
            aliases_only=True,
            random=False,
            source=source,
            name=name,
            inference=torch.is_inference_mode_enabled(),
        )
        self.graph.ops.append(op)
        tid, _ = self._new_tensor(tensor, index)
        op.outputs = TensorRef(tid)
        op.output_ids = (tid,)
        return tid

    def _tensor_ref(self, tid: TensorId) -> TensorRef:
        """The graph's one (immutable) reference to tensor `tid`: ops mention a tensor many times."""
        refs = self._tensor_refs
        while len(refs) <= tid:
            refs.append(TensorRef(len(refs)))
        return refs[tid]

    def _external(self, tensor: torch.Tensor, func: Any) -> int:
        """Keep a real argument for replay as it is now; see note [External tensors are kept as read]."""
        fresh = func in _LIFTS
        if fresh and not _storage(tensor).resizable():
            tensor = _snapshot_of_foreign_memory(tensor)
        as_read = None
        # A conjugate or negative view (`x.conj()`, `torch._neg_view`) is kept itself: its memory
        # laid out again would lose the bit that says how to read it.
        bits = tensor.is_conj() or tensor.is_neg()
        if (
            not fresh
            and type(tensor) in _PLAIN_TENSORS
            and tensor.layout == torch.strided
            and not tensor.is_quantized
            and not bits
        ):
            as_read = (
                _storage(tensor),
                tensor.dtype,
                tuple(tensor.shape),
                tuple(tensor.stride()),
                tensor.storage_offset(),
            )
        self.graph.externals.append(ExternalTensor(tensor, version_of(tensor), fresh, as_read))
        return len(self.graph.externals) - 1

    # -- ops ---------------------------------------------------------------------------------
    def _ref(
        self,
        value: Any,
        inputs: list[TensorId],
        externals: list[int],
        func: Any,
        source: SourceLocation | None,
        known: dict[int, TensorId] | None = None,
    ) -> Any:
        """An argument as the graph stores it: tensors become refs, everything else stays. `known`
        holds ids taken before the op ran (`before_write`)."""
        if type(value) in _PLAIN_ARGUMENTS:
            return value
        if isinstance(value, FakeTensor) and func is not READ_DEFERRED:
            tid = known.get(id(value)) if known else None
            if tid is None:
                tid = self.id_of(value, source)
            inputs.append(tid)
            return self._tensor_ref(tid)
        if isinstance(value, torch.Tensor):
            position = self._external(value, func)
            externals.append(position)
            return ExternalRef(position)
        if isinstance(value, (list, tuple)):
            for item in value:  # a loop, not any(): sizes are passed as lists op after op
                if isinstance(item, (torch.Tensor, list, tuple)):
                    return type(value)(self._ref(item, inputs, externals, func, source, known) for item in value)
            return value
        if isinstance(value, torch.Generator):
            raise DeferredInitError(  # random ops take theirs as `generator=` (record/private_generators.py)
                f"{func} was given a torch.Generator at {source} as an argument other than generator=, "
                "which deferred_init cannot replay"
            )
        return value

    def _out_ref(self, value: Any, index: int, output_ids: list[TensorId], created: list[int]) -> Any:
        if isinstance(value, FakeTensor):
            handle = value.__dict__.get(HANDLE_ATTR)
            if handle is not None and handle.graph is self.graph:
                tid = handle.tensor_id  # in-place and out= ops return their argument
            else:
                tid, new_storage = self._new_tensor(value, index)
                if new_storage is not None:
                    created.append(new_storage)
            output_ids.append(tid)
            return self._tensor_ref(tid)
        if isinstance(value, (list, tuple)):
            return type(value)(self._out_ref(item, index, output_ids, created) for item in value)
        return value

    def _deciding_default_dtype(self, inputs: list[TensorId], externals: list[int]) -> torch.dtype | None:
        """The default dtype, when it is not float32 and type promotion of an integer or bool input
        may have taken it (note [Default dtype at record time])."""
        default = torch.get_default_dtype()
        if default is torch.float32:
            return None
        tensors, recorded = self.graph.tensors, self.graph.externals
        dtypes = [tensors[tid].dtype for tid in inputs] + [recorded[i].described()[0] for i in externals]
        return default if any(not (d.is_floating_point or d.is_complex) for d in dtypes) else None

    def record(
        self,
        func: Any,
        args: tuple,
        kwargs: dict,
        out: Any,
        source: SourceLocation | None,
        written: dict[int, TensorId] | None = None,
    ) -> None:
        """Append one op that has just run under fake mode, with its (fake) result `out`; `written`
        is what `before_write` returned for it."""
        entry = _FACTS_BY_ID.get(id(func))
        facts = entry[1] if entry is not None else op_facts(func)
        inputs: list[TensorId] = []
        externals: list[int] = []
        own_generator = None
        if facts.random and given_generator(func, args, kwargs) is not None:  # note [A constructor's own generators]
            given = args, kwargs
            args, kwargs, own_generator = recorded_generator(
                func, args, kwargs, self._random_device(func, args, kwargs, out), source
            )
        ref_args = self._argument_refs(func, args, inputs, externals, source, written)
        ref_kwargs = self._keyword_refs(func, facts, kwargs, out, inputs, externals, source, written)
        index = len(self.graph.ops)  # after any synthetic alias ops that the refs appended
        drawn = facts.random and own_generator is None
        stream = self._random_stream(func, args, kwargs, out, index, source) if drawn else None
        written_tids, resizes = self._written_tensors(facts, args, kwargs, written) if facts.written else ([], False)
        if facts.returned is not None and type(out) is DeferredTensor:
            out = _returned_argument(facts.returned, args, kwargs, out)
        outputs, output_ids, created = self._output_refs(out, index)
        if externals and created and views_external(func) and not _copied_by_to(func, args, out):
            self._note_external_views(created, externals)
        writes = self._note_writes(written_tids, index) if written_tids else ()
        aliases_only = not writes and not created and bool(output_ids)
        self.graph.ops.append(
            OpNode(
                index=index,
                func=func,
                args=ref_args,
                kwargs=ref_kwargs,
                outputs=outputs,
                output_ids=output_ids,
                inputs=tuple(inputs),
                reads=_contents_read(inputs, written_tids, aliases_only, facts.overwrites_self),
                externals=tuple(externals),
                writes=writes,
                creates=created,
                aliases_only=aliases_only,
                random=facts.random,
                source=source,
                overwrites=facts.overwrites_self and len(writes) == 1 and _covers_storage(args[0]),
                stream=stream,
                resizes=resizes,
                inference=torch.is_inference_mode_enabled(),
                default_dtype=self._deciding_default_dtype(inputs, externals),
                out_layouts=out_layouts(facts, kwargs) if facts.may_resize else (),
            )
        )
        if own_generator is not None:
            move_on_like_eager(func, *given)

    def record_other_recording_read(
        self, pinned: FakeTensor, stand_in: FakeTensor, source: SourceLocation | None
    ) -> None:
        """Record `stand_in` as the value of `pinned`, a fake of another recording, kept as an
        external input (note [Reading another recording] in record/foreign.py)."""
        self.record(READ_DEFERRED, (pinned,), {}, stand_in, source)

    # -- the ops constructors repeat, recorded directly -----------------------------------------
    # See note [Direct records]. Each returns False, having changed nothing, when the op is not of
    # its shape; the caller then calls `record`.

    def record_factory(
        self, func: Any, facts: OpFacts, args: tuple, kwargs: dict, out: Any, source: SourceLocation | None
    ) -> bool:
        """A factory (`empty`, `ones`...) with plain arguments whose result is a new fake."""
        if facts.random or facts.written or type(out) is not DeferredTensor or HANDLE_ATTR in out.__dict__:
            return False
        if not (all_plain(args) and all_plain(kwargs.values())):
            return False
        ref_kwargs = dict(kwargs)
        if facts.takes_dtype and kwargs.get("dtype") is None:
            ref_kwargs["dtype"] = out.dtype
        offset = cast(int, out.storage_offset())  # no ShapeEnv while recording: never a SymInt
        layout = (out.shape, out.stride(), offset, out.dtype, out.requires_grad)
        self._append_factory(func, args, ref_kwargs, out, source, fake_device_of(out), None, layout)
        return True

    def record_planned_factory(self, func: Any, plan: FactoryPlan, args: tuple, out: DeferredTensor,
                               source: SourceLocation | None) -> None:  # fmt: skip
        """`record_factory` for a fake made by `plan` (note [Op plans] in record/plans.py): its
        metadata is the plan's, not read back from the fake."""
        self._append_factory(func, args, dict(plan.kwargs), out, source, plan.device, plan.nbytes, plan.layout)

    def _append_factory(
        self,
        func: Any,
        args: tuple,
        ref_kwargs: dict,
        out: DeferredTensor,
        source: SourceLocation | None,
        device: torch.device,
        nbytes: int | None,
        layout: Layout,
    ) -> None:
        """Register factory `out` (shape, stride, offset, dtype, requires_grad in `layout`) with its
        new storage (of `nbytes`, asked of the storage when None), and append its op."""
        graph = self.graph
        index = len(graph.ops)
        # `_new_tensor` for a fake that certainly has a storage of its own, inlined
        key = _storage_key(out)
        if key in self._storage_ids:  # a storage seen before: not a new tensor's
            raise AssertionError(f"{func} returned a fake over a storage recorded before")
        storage = _storage(out)
        sid = len(self._storage_keys)
        self._storage_ids[key] = sid
        self._storage_keys.append(key)
        self._storage_objects.append(storage)
        graph.storages[sid] = StorageInfo(sid, storage.nbytes() if nbytes is None else nbytes, device, index)
        graph.writers[sid] = [index]
        tid = len(graph.tensors)
        shape, stride, offset, dtype, requires_grad = layout
        graph.tensors[tid] = TensorInfo(tid, sid, index, shape, stride, offset, dtype, device, requires_grad)
        self._storage_anchor[sid] = tid
        out.__dict__[HANDLE_ATTR] = DeferredHandle(graph, tid, version_of(out))
        self._remember(out)
        refs = self._tensor_refs
        graph.ops.append(
            OpNode(
                index, func, args, ref_kwargs, refs[tid] if tid < len(refs) else self._tensor_ref(tid),
                (tid,), (), _NO_READS, (), (), (sid,), False, False, source, "", False, None, False,
                torch.is_inference_mode_enabled(), False,
            )
        )  # fmt: skip

    def record_detach(self, func: Any, tensor: FakeTensor, out: DeferredTensor, source: SourceLocation | None) -> None:
        """`detach` of fake `tensor` (`nn.Parameter(t)` issues one per parameter): `out` is a new
        alias with `tensor`'s layout, registered from `tensor`'s record instead of asking `out`."""
        base = self.id_of(tensor, source)
        graph = self.graph
        index = len(graph.ops)
        info = graph.tensors[base]
        tid = len(graph.tensors)
        graph.tensors[tid] = TensorInfo(
            tid, info.storage, index, info.shape, info.stride, info.storage_offset, info.dtype, info.device,
            out.requires_grad, conj=info.conj, neg=info.neg,
        )  # fmt: skip
        out.__dict__[HANDLE_ATTR] = DeferredHandle(graph, tid, version_of(out))
        self._remember(out)
        refs = self._tensor_refs
        graph.ops.append(
            OpNode(
                index, func, (refs[base] if base < len(refs) else self._tensor_ref(base),), {},
                refs[tid] if tid < len(refs) else self._tensor_ref(tid), (tid,), (base,), _NO_READS, (), (), (),
                True, False, source, "", False, None, False, torch.is_inference_mode_enabled(), False,
            )
        )  # fmt: skip

    def direct_write_target(self, tensor: FakeTensor, source: SourceLocation | None) -> TensorId | None:
        """The id of fake `tensor` before an op writes it, as `before_write` gives it, when
        `record_self_write` may record that op; None when some fake views memory from outside
        (`before_write` then checks what the op writes)."""
        if self._external_views:
            return None
        return self.id_of(tensor, source)

    def record_self_write(
        self, func: Any, facts: OpFacts, target: TensorId, args: tuple, kwargs: dict, source: SourceLocation | None
    ) -> None:
        """An op that writes only its fake `self` (`normal_`, `fill_`, `zero_`...) and returns it,
        its other arguments plain; `target` is `self`'s id before the op ran (`direct_write_target`)."""
        graph = self.graph
        index = len(graph.ops)
        stream = None
        if facts.random:
            device = fake_device_of(args[0])
            known = self._streams.get(device)
            if known is not None and not graph.finished:  # `_stream_position`, inlined for its common case
                key, positions = known
                stream = (key, len(positions))
                positions.append(index)
                rng_ledger.note_draw(graph, key, stream[1])
            elif device.type != "meta":
                stream = self._stream_position(device, func, index, source)
        info = graph.tensors[target]
        sid = info.storage
        graph.writers[sid].append(index)
        refs = self._tensor_refs
        ref = refs[target] if target < len(refs) else self._tensor_ref(target)
        overwrites = facts.overwrites_self
        if overwrites:
            nbytes = graph.storages[sid].nbytes
            covering = self._covering.get(target)
            if covering is None or covering[0] != nbytes:
                covering = self._covering[target] = (nbytes, _covers_storage(args[0], nbytes))
            overwrites = covering[1]
        graph.ops.append(
            OpNode(
                index, func, (ref, *args[1:]), dict(kwargs) if kwargs else {}, ref, (target,), (target,),
                _NO_READS if facts.overwrites_self else frozenset((target,)), (), (sid,), (), False, facts.random,
                source, "", overwrites, stream, False, torch.is_inference_mode_enabled(), False,
            )
        )  # fmt: skip

    def _argument_refs(
        self,
        func: Any,
        args: tuple,
        inputs: list[TensorId],
        externals: list[int],
        source: SourceLocation | None,
        written: dict[int, TensorId] | None,
    ) -> tuple:
        """The positional arguments as the graph stores them (see `_ref`); fakes' ids go to `inputs`,
        real tensors' positions in `graph.externals` to `externals`."""
        plain = _PLAIN_ARGUMENTS
        refs = self._tensor_refs
        ref_list = []
        for a in args:
            kind = type(a)
            if kind in plain:
                ref_list.append(a)
            elif kind is DeferredTensor and func is not READ_DEFERRED:  # `_ref`'s fake branch, inlined
                tid = written.get(id(a)) if written else None
                if tid is None:
                    tid = self.id_of(a, source)
                inputs.append(tid)
                ref_list.append(refs[tid] if tid < len(refs) else self._tensor_ref(tid))
            else:
                ref_list.append(self._ref(a, inputs, externals, func, source, written))
        return tuple(ref_list)

    def _keyword_refs(
        self,
        func: Any,
        facts: OpFacts,
        kwargs: dict,
        out: Any,
        inputs: list[TensorId],
        externals: list[int],
        source: SourceLocation | None,
        written: dict[int, TensorId] | None,
    ) -> dict[str, Any]:
        """The keyword arguments as the graph stores them, with the dtype a factory took from the
        default filled in (note [Default dtype at record time])."""
        plain = _PLAIN_ARGUMENTS
        ref_kwargs = (
            {
                k: v if type(v) in plain else self._ref(v, inputs, externals, func, source, written)
                for k, v in kwargs.items()
            }
            if kwargs
            else {}
        )
        if facts.takes_dtype and kwargs.get("dtype") is None:
            dtype = _first_tensor_dtype(out)
            if dtype is not None and (dtype.is_complex or not self._any_complex(inputs, externals)):
                ref_kwargs["dtype"] = dtype
        return ref_kwargs

    def _any_complex(self, inputs: list[TensorId], externals: list[int]) -> bool:
        """Whether an op's tensor inputs include a complex one. A real result of complex inputs (a
        norm: `linalg_vector_norm`'s `dtype` is the complex one it computes in) does not name the
        op's `dtype`, so none is filled in for it (note [Default dtype at record time])."""
        tensors, known = self.graph.tensors, self.graph.externals
        return any(tensors[t].dtype.is_complex for t in inputs) or any(
            known[e].tensor.dtype.is_complex for e in externals
        )

    def _output_refs(self, out: Any, index: OpIndex) -> tuple[Any, tuple[TensorId, ...], tuple[StorageId, ...]]:
        """The op's result as the graph stores it, the ids of its tensors, and the storages it
        created; fakes seen for the first time are registered as made by op `index`."""
        if type(out) is DeferredTensor:  # `_out_ref` for the one-tensor result of most ops, inlined
            handle = out.__dict__.get(HANDLE_ATTR)
            created: tuple[StorageId, ...] = ()
            if handle is not None and handle.graph is self.graph:
                tid = handle.tensor_id  # in-place and out= ops return their argument
            else:
                tid, new_storage = self._new_tensor(out, index)
                if new_storage is not None:
                    created = (new_storage,)
            refs = self._tensor_refs
            return (refs[tid] if tid < len(refs) else self._tensor_ref(tid)), (tid,), created
        output_ids: list[TensorId] = []
        created_list: list[StorageId] = []
        outputs = self._out_ref(out, index, output_ids, created_list)
        return outputs, tuple(output_ids), tuple(created_list)

    def _note_external_views(self, created: tuple[StorageId, ...], externals: list[int]) -> None:
        """New storages that view real tensors from outside: replay aliases the real memory."""
        self._external_views.update(created)
        for sid in created:
            self._viewed_externals[sid] = tuple(externals)

    def _written_tensors(
        self, facts: OpFacts, args: tuple, kwargs: dict, written: dict[int, TensorId] | None
    ) -> tuple[list[TensorId], bool]:
        """The fakes an op writes (ids as before it ran), and whether it grew one of their storages
        (`resize_`, or an `out=` tensor the op resized). `written` is `before_write`'s answer."""
        if written and not facts.may_resize and facts.written == SELF_ONLY and args:
            tid = written.get(id(args[0]))  # most writes: one fake `self`, its id taken just before
            if tid is not None:
                return [tid], False
        written_tids: list[TensorId] = []
        resizes = False
        for position, name in facts.written:
            argument = _argument(args, kwargs, position, name)
            for tensor in argument if isinstance(argument, (list, tuple)) else (argument,):
                if isinstance(tensor, FakeTensor):
                    tid = tensor.__dict__[HANDLE_ATTR].tensor_id
                    written_tids.append(tid)
                    if not facts.may_resize:
                        continue
                    storage = self.graph.storages[self.graph.tensors[tid].storage]
                    nbytes = _storage(tensor).nbytes()
                    if nbytes > storage.nbytes:
                        storage.nbytes = nbytes
                        resizes = True
        return written_tids, resizes

    def _note_writes(self, written_tids: list[TensorId], index: OpIndex) -> tuple[StorageId, ...]:
        """The storages op `index` writes, each once; appends the op to their writers."""
        if not written_tids:
            return ()
        tensors = self.graph.tensors
        writes = tuple(dict.fromkeys([tensors[tid].storage for tid in written_tids]))
        for sid in writes:
            self.graph.writers[sid].append(index)
        return writes

    def _random_stream(
        self, func: Any, args: tuple, kwargs: dict, out: Any, index: OpIndex, source: SourceLocation | None
    ) -> tuple[str, int] | None:
        """(generator key, position) of a random op in its device's stream; None on meta."""
        device = self._random_device(func, args, kwargs, out)
        if device is None or device.type == "meta":
            return None
        return self._stream_position(device, func, index, source)

    def _stream_position(
        self, device: torch.device, func: Any, index: OpIndex, source: SourceLocation | None
    ) -> tuple[str, int]:
        """Append random op `index` to `device`'s stream: its (generator key, position). An op
        recorded after construction starts where eager's generator would be (note [Eager's
        generator after construction]); raises DeferredInitError where that cannot be known."""
        key = _stream_keys.get(device)
        if key is None:
            key = _stream_keys[device] = stream_key(device)
        graph = self.graph
        if key not in graph.rng_start:
            graph.rng_start[key] = capture_start_state(key)
        positions = graph.random_streams.setdefault(key, [])
        self._streams[device] = (key, positions)
        position = len(positions)
        if graph.finished and key == rng_ledger.KEY:
            where = f"{func} at {source or '<unknown source>'}"
            restart = rng_ledger.restart_for(graph, key, position, torch.default_generator.get_state(), where)
            if restart is not None:
                graph.rng_restarts.setdefault(key, {})[position] = restart
                if graph.replay_state is not None:  # a materialization may have guessed this state
                    graph.replay_state.forget_states(key, position)
        positions.append(index)
        rng_ledger.note_draw(graph, key, position)
        return key, position

    def before_write(self, func: Any, args: tuple, kwargs: dict, source: SourceLocation | None) -> dict[int, TensorId]:
        """Called before an op that writes some of its arguments runs; returns the ids of the fakes
        it writes, keyed by `id()`, as they are now.

        The op may change their layout (an `out=` tensor resized, `resize_`): `record` must name the
        tensors the op was given, and the new layout is picked up by `id_of` at their next use.

        Refuses an op that writes a real tensor from outside the constructor or a view of one: eager
        construction changes the caller's tensor there and then, and deferred_init can neither defer
        that side effect nor replay it later without changing the tensor a second time.
        """
        entry = _FACTS_BY_ID.get(id(func))
        facts = entry[1] if entry is not None else op_facts(func)
        if facts.written == SELF_ONLY and args and type(args[0]) is DeferredTensor and not self._external_views:
            return {id(args[0]): self.id_of(args[0], source)}  # the common case: `w.normal_()`, `w.fill_(1)`
        ids: dict[int, TensorId] = {}
        for position, name in facts.written:
            argument = _argument(args, kwargs, position, name)
            for tensor in argument if isinstance(argument, (list, tuple)) else (argument,):
                if not isinstance(tensor, torch.Tensor):
                    continue
                if isinstance(tensor, FakeTensor):
                    if not (
                        self._external_views and self._storage_ids.get(_storage_key(tensor)) in self._external_views
                    ):
                        ids[id(tensor)] = self.id_of(tensor, source)
                        continue
                    what = "a view of a real tensor"
                else:
                    what = "a real tensor"
                dtype = dtype_name(tensor.dtype)
                if self.graph.finished:
                    raise self._real_write_refusal(func, tensor, self._real_memory_of(tensor), what, source)
                raise DeferredInitError(
                    f"{func} writes in place into {what} from outside the constructor ({dtype}"
                    f"{list(tensor.shape)} on {tensor.device}) while building {building_modules(2)} at "
                    f"{source or '<unknown source>'}; eager construction would change that tensor, which "
                    "deferred_init cannot defer: clone it first (x = x.clone()) or change it before "
                    "calling deferred_init",
                    self.graph,
                )
        return ids

    def _real_memory_of(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """`tensor` if it is real; for a fake viewing real tensors from outside, those tensors."""
        if not isinstance(tensor, FakeTensor):
            return [tensor]
        sid = self._storage_ids.get(_storage_key(tensor))
        return [self.graph.externals[index].tensor for index in self._viewed_externals.get(sid, ())] if sid else []

    def _real_write_refusal(
        self, func: Any, tensor: torch.Tensor, real: list[torch.Tensor], what: str, source: SourceLocation | None
    ) -> DeferredInitError:
        """Why `func`, recorded after construction, cannot write deferred values into `tensor`, which
        is (or views) the real tensors `real`."""
        where = f"({dtype_name(tensor.dtype)}{list(tensor.shape)} on {tensor.device}) at {source or '<unknown source>'}"
        model = self.block_model
        name = next((n for t in real if model is not None and (n := _name_in(model, t)) is not None), None)
        if name is not None:
            module = "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in name.split(".")[:-1])
            return DeferredInitError(
                f"{func} writes values of a deferred model into '{name}' {where}, which was materialized "
                "before this block: it holds real values and the written ones are not made yet, so the write "
                f"cannot be deferred. Release it before the block (explorer.release_module(model{module})), "
                "which makes it deferred again and lets the block record "
                "the write, or materialize what the write reads first",
                self.graph,
            )
        inside = self.block_model is not None
        return DeferredInitError(
            f"{func} writes values of a deferred model into {what} {where}; the deferred tensors have no "
            "values yet, and writing eager's into a tensor made outside the model's recording cannot be "
            "deferred. "
            + (
                "Make that tensor inside this block, or materialize the model first (explorer.materialize_module)"
                if inside
                else "Run this code inside `with explorer.deferred(model): ...` (new modules and tensors are then "
                "recorded with the model's: model surgery), or materialize the model first "
                "(explorer.materialize_module)"
            ),
            self.graph,
        )

    @staticmethod
    def _random_device(func: Any, args: tuple, kwargs: dict, out: Any) -> torch.device | None:
        if type(out) is DeferredTensor:  # in-place random ops return their (fake) argument
            return fake_device_of(out)
        for value in (*(out if isinstance(out, (list, tuple)) else (out,)), *args):
            if isinstance(value, FakeTensor):
                return fake_device_of(value)
            if isinstance(value, torch.Tensor):
                return value.device
        device = kwargs.get("device")
        return torch.device(device) if device is not None else torch.device("cpu")

    def record_inplace_view(self, tensor: FakeTensor, func: Any, source: SourceLocation | None) -> TensorId:
        """`t_()`, `squeeze_()`...: the same tensor object now has a new layout over the same storage
        (its new id is returned).

        Recorded as an alias with the new layout (by metadata), not as the op itself: replaying the
        op on the alias would apply it twice.
        """
        self._absorb_layout_bump(self.graph.tensors[tensor.__dict__[HANDLE_ATTR].tensor_id].storage)
        # The storage it has now: `set_(source)` (parametrize's right_inverse) moves it to another one.
        sid = self._storage_ids.get(_storage_key(tensor))
        if sid is None:
            raise DeferredInitError(
                f"{func} at {source or '<unknown source>'} points a deferred tensor at the memory of a real "
                "tensor, which replay cannot alias; clone the source into a deferred tensor first",
                self.graph,
            )
        return self.alias(tensor, self._storage_anchor[sid], name=str(func), source=source)

    def _absorb_layout_bump(self, sid: StorageId) -> None:
        """A layout change (`t_()`, `set_`) of a fake that views a caller's tensor bumps the version
        counter they share without writing a byte: every record of that tensor expects one more
        bump, so replay does not mistake it for the caller changing its tensor."""
        targets = {id(self.graph.externals[index].tensor) for index in self._viewed_externals.get(sid, ())}
        for record in self.graph.externals:
            if id(record.tensor) in targets:
                record.layout_bumps += 1

    def finish(self) -> None:
        """Stamp each live fake with its version now, to catch in-place changes made after recording."""
        graph = self.graph
        tensors = graph.tensors
        storage_keys = self._storage_keys
        with metadata_access():  # lazy parameters refuse metadata reads
            for reference in list(self._fakes.values()):
                tensor = reference()
                if tensor is None:
                    continue
                stamped = tensor.__dict__.get(HANDLE_ATTR)
                info = tensors[stamped.tensor_id] if stamped is not None and stamped.graph is graph else None
                if (
                    info is None
                    or storage_keys[info.storage] != _storage_key(tensor)
                    or tensor.shape != info.shape
                    or tensor.stride() != info.stride
                    or tensor.storage_offset() != info.storage_offset
                ):  # not `_unchanged` (inlined: every live fake is asked)
                    self.id_of(tensor, None)  # records a trailing `.data = x`
                    stamped = handle_of(tensor)
                    assert stamped is not None  # id_of registered the fake
                try:
                    stamped.version = tensor._version
                except RuntimeError:  # an inference tensor has no version counter (`version_of`)
                    stamped.version = None
        self._fakes.clear()
        # `_storage_objects` stay: fake storages hold no memory, and keeping them keeps storage
        # addresses unique for ops recorded after construction (record/extension.py).

    def settle(self, values: list[Any]) -> None:
        """After an op recorded once construction finished: stamp the fakes it touched with their
        versions now, and drop the weak references taken meanwhile (`torch.utils.swap_tensors`, which
        `Module._apply` uses on fake parameters, refuses tensors that have weak references)."""
        with metadata_access():
            for value in values:
                handle = handle_of(value) if isinstance(value, FakeTensor) else None
                if handle is not None and handle.graph is self.graph:
                    self.id_of(value, None)
                    stamped = handle_of(value)
                    assert stamped is not None  # id_of registered the fake
                    stamped.version = version_of(value)
        self._fakes.clear()

    def failure(self, func: Any, error: BaseException, source: SourceLocation | None) -> DeferredInitError:
        """The error to raise when an op cannot run under deferred_init."""
        message = (
            f"{func} failed under deferred_init while building {building_modules(3)} at {source or '<unknown source>'}"
        )
        if source is not None and source.line:
            message += f"\n    {source.line}"
        message += f"\n{type(error).__name__}: {error}"
        return DeferredInitError(message, self.graph, op=str(func), reason=f"{type(error).__name__}: {error}")
