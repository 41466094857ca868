"""The recorded initialization program: plain data, filled by `record`, read by everything else.

Invariants the graph keeps:
- ops are in the chronological order the constructor issued them; an op's index is its position;
- every fake tensor the constructor produced has a `TensorInfo` whose `producer` is the op that made
  it and whose `storage` is shared with every view of the same memory;
- `writers[storage]` lists, in order, every op that created or wrote that storage; an op writes a
  storage when its schema marks the argument as written (in-place and out= ops) or when it created it.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import linecache
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from ._torch_compat.dispatch import OpOverload

TensorId = int
StorageId = int
OpIndex = int

# Ops that overwrite every element of `self` without reading it: an earlier write to a storage they
# fully cover is dead. Used by rng="fast" to skip the first of Hugging Face's two initialisations.
_aten = torch.ops.aten
OVERWRITING_OPS = frozenset(
    {
        _aten.fill_.Scalar,
        _aten.fill_.Tensor,
        _aten.zero_.default,
        _aten.uniform_.default,
        _aten.normal_.default,
        _aten.random_.default,
        getattr(_aten.random_, "from"),
        _aten.random_.to,
        _aten.exponential_.default,
        _aten.geometric_.default,
        _aten.log_normal_.default,
        _aten.cauchy_.default,
        _aten.bernoulli_.float,
        _aten.copy_.default,
    }
)


@functools.cache
def is_inplace_random(func: OpOverload) -> bool:
    """Random ops like uniform_ that write `self` in place and return it."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    returns = func._schema.returns
    first = func._schema.arguments[0] if func._schema.arguments else None
    return (
        len(returns) == 1
        and first is not None
        and returns[0].alias_info is not None
        and first.alias_info is not None
        and first.alias_info.is_write
    )


@functools.cache
def accepts_generator(func: OpOverload) -> bool:
    return any(argument.name == "generator" for argument in func._schema.arguments)


@functools.cache
def generator_position(func: OpOverload) -> int | None:
    """Where `func` takes its generator positionally (`poisson(self, generator)`), else None."""
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == "generator" and not argument.kwarg_only:
            return position
    return None


def with_generator(func: OpOverload, args: tuple, kwargs: dict, extra: dict) -> tuple[tuple, dict]:
    """`func`'s `args` and `kwargs` with `extra` added (`{"generator": g}` or nothing), in place of a
    generator given positionally (`poisson(self, generator)`), else by keyword."""
    if not extra:
        return args, kwargs
    position = generator_position(func)
    if position is not None and position < len(args):
        return (*args[:position], extra["generator"], *args[position + 1 :]), kwargs
    return args, {**kwargs, **extra}


@dataclass(frozen=True)
class SourceLocation:
    """A line of user code: the innermost frame outside torch and this package."""

    filename: str
    lineno: int
    function: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno} in {self.function}"

    @property
    def line(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip()


# Note: [Draws fixed by sizes]
# Random ops whose number of draws is fixed by their tensors' sizes and dtypes and their plain
# arguments: fills (`normal_`, `bernoulli_(p)` with a tensor p too), factories, `*_like` with plain
# bounds, `multinomial`, dropout masks and the recorded `trunc_normal_` (whose rejection loop reads
# only its own draws). Run on stand-in tensors, they move a generator as eager's run did. Any other
# (`poisson`'s rejection sampling, `rrelu`'s draw per negative element, `randint_like` with a tensor
# bound) may draw as many values as its inputs' values need: a run that moves a generator must give
# it eager's input values (replay), or not be done (a constructor's own generator is refused).
_DRAWS_FIXED_BY_SIZES = frozenset({
    "normal_", "uniform_", "random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "bernoulli_",
    "normal", "uniform", "random", "exponential", "geometric", "cauchy", "log_normal", "bernoulli",
    "normal_functional", "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
    "multinomial", "dropout", "dropout_", "native_dropout", "_fused_dropout", "feature_dropout",
    "feature_dropout_", "alpha_dropout", "alpha_dropout_", "feature_alpha_dropout", "feature_alpha_dropout_",
    "trunc_normal_",
})  # fmt: skip


def draws_fixed_by_sizes(func: Any) -> bool:
    """Whether random op `func` draws a number of values fixed without its inputs' values (see note
    [Draws fixed by sizes])."""
    packet = getattr(func, "_overloadpacket", None)
    if packet is None or packet.__name__ not in _DRAWS_FIXED_BY_SIZES:
        return False
    return not (packet.__name__ == "randint_like" and "Tensor" in func._overloadname)  # a tensor bound


@dataclass(frozen=True, slots=True)
class TensorRef:
    """An op argument that is a fake tensor of this graph, as it was when the op ran."""

    id: TensorId


@dataclass(frozen=True, slots=True)
class ExternalRef:
    """An op argument that is a real tensor from outside (module args, constants): kept by reference."""

    index: int


@dataclass(frozen=True, eq=False, slots=True)
class GeneratorState:
    """An op argument that was a generator of the constructor's own (`generator=g`, not a default
    generator): its device and its state when the op ran, which is all replay needs to draw what
    eager drew (record/private_generators.py). `label` names it for tables and messages."""

    device: str
    state: torch.Tensor
    label: str

    def __repr__(self) -> str:
        return f"<{self.label}>"


@dataclass(slots=True)
class ExternalTensor:
    """A real tensor the constructor read, and its version counter when it was read.

    `version` is None for inference tensors, which have no version counter to check. `fresh`: a
    constant `torch.tensor([...])` made inside the constructor, which nobody else can change.
    `as_read`: (storage, dtype, shape, stride, offset) when it was read, for plain strided tensors;
    see note [External tensors are kept as read] in record/builder.py.
    """

    tensor: torch.Tensor
    version: int | None
    fresh: bool = False
    as_read: tuple | None = None
    # Version bumps expected without a byte written: layout changes (`set_`, `t_()`) of a recorded
    # view of this tensor, which shares its version counter.
    layout_bumps: int = 0

    def described(self) -> tuple[torch.dtype, tuple[int, ...], torch.device]:
        """(dtype, shape, device) as read, without making a tensor (safe inside a recording)."""
        if self.as_read is None:
            return self.tensor.dtype, tuple(self.tensor.shape), self.tensor.device
        storage, dtype, shape, _, _ = self.as_read
        return dtype, shape, storage.device

    def value(self) -> torch.Tensor:
        """The tensor as the recording read it: its memory, with the dtype and layout it had then."""
        if self.as_read is None:
            return self.tensor
        storage, dtype, shape, stride, offset = self.as_read
        with torch.inference_mode(self.tensor.is_inference()):  # replay may run under inference mode
            return torch.empty((0,), dtype=dtype, device=storage.device).set_(storage, offset, shape, stride)


OutLayout = tuple[str, tuple[int, ...], tuple[int, ...]]  # an `out=` argument's (name, shape, stride)


def _schema_returns(func: Any) -> int:
    """How many values an op's schema returns (0 for checks; a Python function recorded as an op
    counts as returning something)."""
    schema = getattr(func, "_schema", None)
    return 1 if schema is None else len(schema.returns)


@dataclass(slots=True)
class TensorInfo:
    """Metadata of one fake tensor (one Python tensor object, or one state of it after `.data = `)."""

    id: TensorId
    storage: StorageId
    producer: OpIndex
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    is_param: bool = False
    # A conjugate or negative view (`x.conj()` of a complex tensor, `torch._neg_view`): its memory
    # is read through that bit, which a tensor laid over the storage again must set too.
    conj: bool = False
    neg: bool = False


@dataclass(slots=True)
class StorageInfo:
    """One fake storage: the memory a base tensor and its views share."""

    id: StorageId
    nbytes: int
    device: torch.device
    creator: OpIndex


@dataclass(slots=True)
class OpNode:
    """One aten call the constructor made (or a synthetic alias for `.data = x`)."""

    index: OpIndex
    func: OpOverload
    args: tuple
    kwargs: dict
    outputs: Any  # the op's return value with fake tensors replaced by TensorRef
    output_ids: tuple[TensorId, ...]
    inputs: tuple[TensorId, ...]  # fake tensors among the arguments, in order
    reads: frozenset[TensorId]  # inputs whose contents the op reads (not pure aliasing, not overwritten)
    externals: tuple[int, ...]  # indices into InitGraph.externals
    writes: tuple[StorageId, ...]  # storages written in place (not counting created ones)
    creates: tuple[StorageId, ...]
    aliases_only: bool  # outputs only alias inputs and nothing is written
    random: bool
    source: SourceLocation | None
    name: str = ""  # display name; defaults to the aten name
    overwrites: bool = False  # writes every element of its only written storage without reading it
    stream: tuple[str, int] | None = None  # random ops: (generator key, position in that stream)
    resizes: bool = False  # grew a storage it writes (resize_, a resized out=): never a dead write
    inference: bool = False  # ran under torch.inference_mode(): replayed there, makes inference tensors
    # Its output shape came from its inputs' true values (record/computed.py): replay must give those
    # inputs eager's values, whatever the rng mode, or the shape would change.
    from_values: bool = False
    # torch.get_default_dtype() when it ran, where that decides its result: an op promoting integer or
    # bool inputs to a floating or complex result (`arange(n) / 3`) under a default other than
    # float32 (note [Default dtype at record time]). None: float32, or its inputs decide.
    default_dtype: torch.dtype | None = None
    # An op's `out=` arguments as recorded: (name, shape, stride) each. A kernel may pick other
    # strides for the same out= call (`cholesky_inverse`, `fft.ifft` into an empty out, `linalg.solve`)
    # than the fake kernel did: note [Out layouts as recorded] in replay/replay.py.
    out_layouts: tuple[OutLayout, ...] = ()

    @property
    def label(self) -> str:
        return self.name or str(self.func)


@dataclass(frozen=True)
class RngRestart:
    """Where eager's generator state before random op `position` of a stream comes from, when it is
    not the state after the stream's previous op (see note [Eager's generator after construction]
    in record/rng_ledger.py).

    Exactly one form: `base` jumped over `jump` draws (the real generator's state when the op was
    recorded, plus the draws deferred random ops took since the last reseed, which eager would
    have taken and the real generator did not); or the state after random op `after_position` of
    stream `after_key` of `after_graph` (another graph, or an earlier part of this one), when the
    real generator had not moved since that op and a draw count in between is not known in advance;
    or `unknown`, the reason no state can be given.
    """

    base: torch.Tensor | None = None
    jump: int = 0
    after_graph: InitGraph | None = None
    after_key: str = "cpu"
    after_position: int = -1
    unknown: str = ""  # why eager's state here cannot be known (the op that needs it is refused)
    # False when eager code set the generator's cached normal sample while draws were owed: eager's
    # cached value is then unknown, and an op reading it (normal_ below 16 elements) is refused.
    cache_known: bool = True


class OpRecorder(Protocol):
    """Records one more op into a finished graph (implemented by `record.extension.Recorder`)."""

    def run(self, func: OpOverload, args: tuple, kwargs: dict) -> Any: ...

    def catch_up(self, tensor: torch.Tensor) -> None: ...

    def reopened(self, touched: Callable[[], list[torch.Tensor]]) -> contextlib.AbstractContextManager[None]: ...

    def redefer_given_data(self, roots: list[Any]) -> int: ...


class ReplayMemory(Protocol):
    """What replays of one graph keep between calls (implemented by `replay.ReplayState`)."""

    lock: threading.RLock

    def forget_states(self, key: str, position: int) -> None:
        """Drop generator states cached for positions >= `position` of stream `key` (a restart was
        recorded there: they no longer follow)."""

    def before_recorded_write(self, tids: Iterable[TensorId], where: str) -> None:
        """Refuse an op about to be recorded that writes tensors `tids`, where a real tensor made on
        their memory changed since (note [Writes after a tensor was made] in replay/replay.py)."""

    def after_recorded_layout_change(
        self, before: TensorId, after: TensorId, apply: Callable[[torch.Tensor], object]
    ) -> None:
        """A fake that was tensor `before` is now `after`, by an in-place layout op (`t_()`): a real
        tensor made for it takes that op too, `apply` (the same note)."""

    def after_recorded_swap(self, before: TensorId, after: TensorId) -> None:
        """A fake parameter that was tensor `before` holds tensor `after` now (a module cast swapped
        it): a real tensor made for it takes `after`'s values as its `.data` (the same note)."""

    def after_recorded_writes(self, written: Mapping[StorageId, TensorId]) -> None:
        """The ops just recorded wrote these storages (each with a tensor on it): real tensors made
        on them take the new values (the same note)."""


@dataclass
class InitGraph:
    """Everything `deferred_init` recorded for one module construction."""

    ops: list[OpNode] = field(default_factory=list)
    tensors: dict[TensorId, TensorInfo] = field(default_factory=dict)
    storages: dict[StorageId, StorageInfo] = field(default_factory=dict)
    writers: dict[StorageId, list[OpIndex]] = field(default_factory=dict)
    externals: list[ExternalTensor] = field(default_factory=list)
    rng_start: dict[str, torch.Tensor | None] = field(default_factory=dict)  # generator key → state
    # checkpoint path → its stamp when the recording first read it (record/file_stamps.py)
    file_stamps: dict[str, tuple] = field(default_factory=dict)
    random_streams: dict[str, list[OpIndex]] = field(default_factory=dict)  # key → random ops in order
    # key → position → where eager's state before that random op comes from, where it does not
    # continue from the previous op (position 0: rng_start, unless a restart is there).
    rng_restarts: dict[str, dict[int, RngRestart]] = field(default_factory=dict)
    finished: bool = False
    root: weakref.ReferenceType[nn.Module] | None = None  # the module deferred_init returned
    # every top-level module the recording made (a deferred() block's several; `root` is the last)
    roots: tuple[weakref.ReferenceType[nn.Module], ...] = ()
    # Filled by materialization (`replay.ReplayState`): what replay already produced, weakly, so
    # dropping a module frees it. Typed by the contract, not the class: the graph sits below replay.
    replay_state: ReplayMemory | None = None
    # Set when the constructor returned: ops on the module's fakes after that are recorded through
    # it (record/extension.py); `constructor_ops` is how many ops the constructor itself made.
    recorder: OpRecorder | None = None
    constructor_ops: int = 0
    # (len(ops) when computed, the answer) of value_feeding_random_ops: ops are only appended
    _value_feeding: tuple[int, frozenset[OpIndex]] = field(default=(-1, frozenset()), repr=False, compare=False)
    _checks: tuple[int, tuple[OpIndex, ...]] = field(default=(-1, ()), repr=False, compare=False)

    def value_feeding_random_ops(self) -> frozenset[OpIndex]:
        """Random ops whose values an op recorded `from_values` depends on (rng="fast" must still
        draw them as eager did). Asked per parameter by rows, so kept until an op is appended."""
        counted, known = self._value_feeding
        if counted == len(self.ops):
            return known
        sources = [tid for op in self.ops if op.from_values for tid in op.inputs]
        answer = (
            frozenset(i for i in self.closure_of(sources) if self.ops[i].stream is not None) if sources else frozenset()
        )
        self._value_feeding = (len(self.ops), answer)
        return answer

    def writers_before(self, storage: StorageId, before: OpIndex) -> list[OpIndex]:
        """Ops that created or wrote `storage` strictly before op `before`, oldest first."""
        writers = self.writers.get(storage, [])
        return writers[: bisect.bisect_left(writers, before)]

    def last_write(self, storage: StorageId) -> OpIndex:
        return self.writers[storage][-1]

    def written_since(self, first: OpIndex) -> dict[StorageId, TensorId]:
        """The storages ops `first..` wrote in place, each with a tensor on it that they wrote."""
        written: dict[StorageId, TensorId] = {}
        for op in self.ops[first:]:
            for tid in (*op.output_ids, *op.inputs):
                sid = self.tensors[tid].storage
                if sid in op.writes:
                    written.setdefault(sid, tid)
        return written

    def closure_of(
        self,
        tensor_ids: Iterable[TensorId],
        *,
        skip_dead_writes: bool = False,
        has_object: Callable[[TensorId], bool] = lambda tid: False,
        storage_ready: Callable[[StorageId, OpIndex], bool] = lambda sid, before: False,
    ) -> list[OpIndex]:
        """Every op that replaying needs to reproduce `tensor_ids` as they were when recording ended.

        That is: the op that produced each tensor, every write to its storage, and recursively, for
        each of those ops, the ops producing its inputs plus every earlier write to the storages it
        reads (ops that only make aliases, or overwrite without reading, need no earlier writes). With
        `skip_dead_writes`, writes fully overwritten by a later op that reads nothing of the old
        contents are left out (their values could never be observed).

        The replayer passes what it already holds: `has_object(tid)` (a real tensor for `tid` exists,
        so its producer need not run) and `storage_ready(sid, before)` (a real copy of the storage in
        its state just before op `before` exists, so its writers need not run).
        """
        end = len(self.ops)
        return self._closure([(tid, end, True) for tid in tensor_ids], skip_dead_writes, has_object, storage_ready)

    def inputs_closure(self, index: OpIndex) -> list[OpIndex]:
        """Every op that replaying needs to give op `index`'s inputs the values they had when it ran
        (a scratch run of a sampler whose draw count depends on them; `index` itself excluded)."""
        op = self.ops[index]
        starts = [(tid, index, tid in op.reads) for tid in op.inputs]
        return self._closure(starts, True, lambda tid: False, lambda sid, before: False)

    def _closure(
        self,
        starts: list[tuple[TensorId, OpIndex, bool]],
        skip_dead_writes: bool,
        has_object: Callable[[TensorId], bool],
        storage_ready: Callable[[StorageId, OpIndex], bool],
    ) -> list[OpIndex]:
        """`closure_of` from (tensor, as before op, whether its data is read) triples."""
        needed: set[OpIndex] = set()
        stack: list[OpIndex] = []

        def require(tid: TensorId, before: OpIndex, reads_data: bool) -> None:
            info = self.tensors[tid]
            if not has_object(tid):
                stack.append(info.producer)
            if reads_data and not storage_ready(info.storage, before):
                stack.extend(self._live_writers(info.storage, before, skip_dead_writes))

        for tid, before, reads_data in starts:
            require(tid, before, reads_data)
        checks = self._check_ops()
        while stack:
            while stack:
                index = stack.pop()
                if index in needed:
                    continue
                needed.add(index)
                op = self.ops[index]
                for tid in op.inputs:
                    require(tid, index, tid in op.reads)
            stack.extend(index for index in checks if index not in needed and self._checks_needed(index, needed))
        return sorted(needed)

    def _check_ops(self) -> tuple[OpIndex, ...]:
        """Ops that make and write nothing: value checks (`_linalg_check_errors` after
        `linalg.cholesky`, `_assert_async`), which raise where eager raised. Kept until an op is
        appended."""
        counted, known = self._checks
        if counted != len(self.ops):
            known = tuple(op.index for op in self.ops if op.inputs and not op.writes and not _schema_returns(op.func))
            self._checks = (len(self.ops), known)
        return known

    def _checks_needed(self, index: OpIndex, needed: set[OpIndex]) -> bool:
        """Whether check `index` reads a tensor made by an op replay runs: it runs too."""
        return any(self.tensors[tid].producer in needed for tid in self.ops[index].inputs)

    def _live_writers(self, storage: StorageId, before: OpIndex, skip_dead_writes: bool) -> list[OpIndex]:
        writers = self.writers_before(storage, before)
        if skip_dead_writes:
            for position in range(len(writers) - 1, 0, -1):
                if self.ops[writers[position]].overwrites:
                    # The creator stays: it makes the tensor object that later ops write into; so do
                    # resizes, which give the storage the size later layouts need.
                    resized = [w for w in writers[1:position] if self.ops[w].resizes]
                    return [writers[0], *resized, *writers[position:]]
        return writers
