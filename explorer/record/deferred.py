"""`deferred_init`: build a module with fake tensors while recording what its constructor did."""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import torch
from torch import nn

from .._torch_compat.devices import allow_fake_cuda
from .._torch_compat.dispatch import metadata_access
from .._torch_compat.fake import FakeTensor, FakeTensorMode, meta_failures_unlogged
from ..errors import DeferredInitError, MaterializationError
from ..graph import InitGraph
from ..replay.replay import Replay
from ..replay.routing import DeviceRouting, is_available
from . import rng_ledger
from .builder import GraphBuilder
from .checkpoint_formats import recorded_torch_load
from .checkpoint_reads import recorded_checkpoint_reads
from .extension import Recorder, refresh_written
from .fake import handle_of
from .hub_open import recorded_hub_downloads
from .initializers import recorded_initializers
from .lazy import deferred_lazy_modules
from .lean_fake import FakeFactory
from .modes import RecordingDispatchMode
from .parameter_classes import recorded_parameter_classes
from .redeferred import redefer_swapped_tensors
from .scope import RecordingScope, recording, recording_graph
from .seeding import eager_state_reads, seeding_moves_the_start
from .source import module_being_built, user_location, user_location_of
from .surgery import install_surgery_hooks
from .swaps import install_attribute_keeping_swap, swappable_fakes

M = TypeVar("M", bound=nn.Module)


@contextlib.contextmanager
def _collector_paused() -> Any:
    """Pause Python's cyclic garbage collector while the constructor runs (restored on any exit).

    Recording allocates tens of thousands of long-lived records (ops, tensor metadata, fakes) and
    no tensor storage, so collections in the middle of construction only re-scan those records
    (measured: 5-15% of deferred_init on a 7B Llama), while the garbage they could free is
    storage-less. A collector the caller disabled stays disabled.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            _promote_survivors()
            gc.enable()


def _promote_survivors() -> None:
    """Move every object the recording allocated straight to the oldest generation.

    Re-enabled after a recording, the collector's first young-generation pass would scan all of the
    recording's records at once (measured: about 5% of deferred_init on a 7B Llama) to find them
    alive: they live as long as the model. `gc.freeze()` + `gc.unfreeze()` moves every tracked
    object to the oldest generation without scanning (both are O(1) list splices); a cycle that
    was garbage is still found, by the next full collection. Skipped whenever anything is frozen
    already: the caller's own objects (unfreezing would release them), or CPython 3.12's, which
    starts with a few hundred objects in the permanent generation (that interpreter then pays the
    young-generation pass).
    """
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


def _without_advice(error: MaterializationError) -> str:
    """A replay error's finding without its advice to materialize_* callers ("; use rng=...")."""
    return str(error).split("; use ")[0].split("; pass device=")[0]


def read_value(builder: GraphBuilder, fake: FakeTensor) -> torch.Tensor:
    """The true value of `fake` now, as eager construction would have it (for `.item()` etc.)."""
    graph = builder.graph
    with metadata_access():  # lazy parameters refuse metadata reads
        builder.id_of(fake, user_location(2))  # a `.data = x` since its last use: read x
    handle = handle_of(fake)
    if handle is None or handle.graph is not graph:
        raise DeferredInitError("a value was read from a fake tensor that this deferred_init did not create")
    recorded = graph.tensors[handle.tensor_id].device
    target = recorded if is_available(recorded) else torch.device("cpu")
    routing = DeviceRouting(exact=((str(recorded), target),), by_type=(), default=None, rng="eager")
    try:
        return Replay(graph, routing, remember=False).run([fake], [handle.tensor_id])[0]
    except MaterializationError as error:
        if target == recorded:
            raise
        # The replay's advice (rng='fast', device=) is for materialize_*; a read cannot take either.
        raise DeferredInitError(
            f"the code at {user_location(2) or 'an unknown line'} reads the value of a tensor on {recorded}, which "
            f"this machine does not have, and that value cannot be made elsewhere: {_without_advice(error)}. Build "
            f"the model on the CPU (no device, or device='cpu') to read values here, or run it where {recorded} exists",
            graph,
            reason=f"a value read needs {recorded}",
        ) from error


def deferred_init(module_fn: Callable[..., M], *args: Any, **kwargs: Any) -> M:
    """Call `module_fn(*args, **kwargs)` with every tensor fake and every op recorded.

    Parameters and buffers of the returned module are fake tensors (metadata, no storage) that
    `materialize_module` / `materialize_tensor` turn into the values eager construction would have
    produced from the RNG state at this call. The global RNG state is not advanced, except by a
    constructor that sets a state it read (`torch.random.fork_rng`): the generator is then left at
    eager's state of that point (note [States handed out while recording] in record/seeding.py).

    Raises TypeError for a non-callable `module_fn` or a non-Module result, DeferredInitError when
    an op cannot run without storage (naming op, module chain and source line) or when called inside
    another deferred_init, or when PyTorch read a fake's values in C++ (note [Reads the recorder
    cannot see]). An exception raised by `module_fn` propagates unchanged, with the partial
    graph attached as `error.deferred_graph`. Either error carries `partial_module`: the outermost
    module whose constructor was running (what it had built so far, its tensors fake; not
    materializable), or None. No mode stays active on any exit path.
    """
    if isinstance(module_fn, nn.Module):
        raise TypeError(
            f"deferred_init expects a callable that builds an nn.Module, got an already built "
            f"{type(module_fn).__name__} instance; pass the class and its arguments instead, e.g. "
            f"deferred_init({type(module_fn).__name__}, ...)"
        )
    if not callable(module_fn):
        raise TypeError(
            f"deferred_init expects a callable that builds an nn.Module (e.g. a class or a lambda), "
            f"got {type(module_fn).__name__} {module_fn!r:.80}"
        )
    if recording_graph() is not None:
        raise DeferredInitError(
            "deferred_init cannot be nested: it was called while another deferred_init is building a "
            "module; build the inner module directly, it is already deferred"
        )
    with _recording_into() as session:
        module = module_fn(*args, **kwargs)
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"deferred_init: {getattr(module_fn, '__qualname__', module_fn)!r} returned "
            f"{'a Tensor' if isinstance(module, torch.Tensor) else type(module).__name__}, not an nn.Module"
        )
    _finish(session, [module])
    return module


class _Session(NamedTuple):
    builder: GraphBuilder
    reader: Callable[[FakeTensor], torch.Tensor]
    fake_mode: FakeTensorMode


@contextlib.contextmanager
def _recording_into() -> Iterator[_Session]:
    """Every tensor op in the block is recorded, on fake tensors, into a new graph that starts from
    the RNG state now; on failure the error gets the partial graph and the module being built (see
    `deferred_init`)."""
    rng_ledger.install_reseed_hooks()
    install_attribute_keeping_swap()
    allow_fake_cuda()  # note [Fake CUDA on a build without CUDA]
    graph = InitGraph()
    start = graph.rng_start["cpu"] = torch.default_generator.get_state()
    restart = rng_ledger.start_of(graph, "cpu", start, str(user_location(1)))
    if restart is not None:  # eager's generator is past the draws of earlier deferred recordings
        graph.rng_restarts["cpu"] = {0: restart}
    builder = GraphBuilder(graph)

    def reader(fake: FakeTensor) -> torch.Tensor:
        return read_value(builder, fake)

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with (
            recording(RecordingScope(graph, reader)),
            meta_failures_unlogged(),  # note [Meta failures, unlogged]
            torch.compiler.set_stance("force_eager"),  # note [Compiled code in a constructor]
            _collector_paused(),
            fake_mode,
            RecordingDispatchMode(builder, reader, fake_mode),
            deferred_lazy_modules(),
            recorded_parameter_classes(),
            recorded_initializers(),
            recorded_checkpoint_reads(),
            recorded_hub_downloads(),
            recorded_torch_load(),
            swappable_fakes(builder),
            seeding_moves_the_start(graph),
        ):
            yield _Session(builder, reader, fake_mode)
    except DeferredInitError as error:
        rng_ledger.forget(graph)
        error.graph = error.graph or graph
        error.partial_module = module_being_built(error.__traceback__)
        raise
    except BaseException as error:
        rng_ledger.forget(graph)
        if isinstance(error, RuntimeError) and _C_READ_OF_FAKE in str(error):
            unseen = unseen_read_error(error, graph)
            unseen.partial_module = module_being_built(error.__traceback__)
            raise unseen from error
        try:
            # any exception may carry them (one with __slots__ refuses: AttributeError, below)
            error.deferred_graph = graph  # type: ignore[attr-defined]  # set on a foreign exception
            error.partial_module = module_being_built(  # type: ignore[attr-defined]  # likewise
                error.__traceback__
            )
        except AttributeError:
            pass
        raise


# Note: [Compiled code in a constructor]
# A constructor may call a `torch.compile`d submodule (a warm-up pass, a buffer computed by it).
# Dynamo would trace the recorder's fakes and fail in its own internals; the recording needs the
# ops, which the module's Python forward issues. So compiled code runs eagerly while a constructor
# is recorded (`torch.compiler.set_stance("force_eager")`, undone on exit), as it does under a
# deferred model's forward (note [A deferred model under torch.compile]); the compiled module
# compiles for real once its model is materialized.

# What PyTorch says when C++ code reads the memory of a tensor that has none (a fake's).
_C_READ_OF_FAKE = "but its data is not allocated yet"


def unseen_read_error(error: RuntimeError, graph: InitGraph) -> DeferredInitError:
    """Note: [Reads the recorder cannot see]
    Some PyTorch functions read a tensor's values in C++ without an op the recorder sees
    (`torch.tensor([t0, t1])` of 0-d tensors, `torch.tensor_split(x, index_tensor)`,
    `torch.quasirandom.SobolEngine`): on a fake, PyTorch raises its own "data is not allocated
    yet" error, which names no line. This says where, why, and what works instead."""
    where = user_location_of(error.__traceback__)
    return DeferredInitError(
        f"{where or '<unknown source>'}: a PyTorch function read the values of a deferred (fake) tensor in C++, "
        "where deferred_init cannot see the read, so it has none to give (eager reads them there). Read "
        "them explicitly first (`t.tolist()`, `t.item()`, `int(t)` give eager's values while recording), "
        "or use a tensor op instead (`torch.stack([t0, t1])` for `torch.tensor([t0, t1])`). "
        f"PyTorch said: {str(error).splitlines()[0]}",
        graph,
        reason="a C++ read of a fake tensor's memory",
    )


def _finish(session: _Session, roots: list[nn.Module]) -> None:
    """Close the recording: stamp live fakes, and let later ops on them record (record/extension.py)."""
    graph = session.builder.graph
    session.builder.finish()
    graph.finished = True
    graph.constructor_ops = len(graph.ops)
    graph.root = weakref.ref(roots[-1]) if roots else None
    graph.roots = tuple(weakref.ref(root) for root in roots)
    graph.recorder = Recorder(session.builder, session.reader, session.fake_mode, threading.RLock())
    for root in roots:
        _LIVE_ROOTS.add(root)
    install_surgery_hooks(deferred)


# Modules built by deferred_init / deferred() that are still alive (for notebooks' status views).
_LIVE_ROOTS: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def deferred_roots() -> list[nn.Module]:
    """The live modules built by `deferred_init` or inside `deferred()` (whole models, not their
    submodules), whether or not they are still deferred."""
    return list(_LIVE_ROOTS)


@dataclass
class DeferredBlock:
    """What a `with explorer.deferred() as block:` built: `modules`, the top-level modules holding
    deferred tensors, in the order they were created (filled when the block ends), and `graph`, the
    shared recording."""

    graph: InitGraph
    modules: list[nn.Module] = field(default_factory=list)


@contextlib.contextmanager
def deferred(model: nn.Module | None = None) -> Iterator[DeferredBlock]:
    """Run a block of ordinary code under deferred initialization.

    `deferred(model)` extends `model`'s own recording instead of starting one: model surgery
    (`model.resize_token_embeddings(n)`, swapping in new layers, copying between old and new
    tensors) mixes new modules with the model's fakes freely, and materializing gives what the same
    code gives on the eager model. Random ops in it start where eager's generator would be (note
    [Eager's generator after construction]); `torch.manual_seed` in it is a reseed like any other.

    Every tensor and module the block creates is fake and recorded, as inside `deferred_init`:
    `with explorer.deferred() as block: model = LlamaForCausalLM(config)` gives a deferred `model`.
    Modules built in the block share one recording, and each materializes on its own: only the ops
    its own tensors need are replayed, with eager's random numbers from the RNG state at the start
    of the block (which the block does not advance). The modes, patches and garbage collector are
    restored when the block ends, also when it raises (the error then carries the partial graph,
    as in `deferred_init`). Raises DeferredInitError when nested in another deferred scope.
    """
    if recording_graph() is not None:
        raise DeferredInitError(
            "explorer.deferred cannot be nested: a deferred_init or deferred block is already recording; "
            "what you build here is already deferred"
        )
    created: list[weakref.ref] = []
    if model is not None:
        graph = _recording_of(model)
        with _recording_onto(graph) as session, _tracking_modules(created):
            block = DeferredBlock(graph)
            session.builder.block_model = model
            try:
                yield block
                redefer_swapped_tensors(session.builder, FakeFactory(session.fake_mode), [model])
            finally:
                session.builder.block_model = None
        block.modules = [module for module in _top_level(created) if _holds_fakes_of(module, graph)]
        # `old.weight.data = new.weight.data` (Hugging Face's resize) swapped storages behind the
        # dispatcher: stamp every tensor of the model now, so materialization sees the new layout.
        session.builder.settle(
            [tensor for root in (model, *block.modules) for tensor in (*root.parameters(), *root.buffers())]
        )
        session.builder.finish()
        return
    with _recording_into() as session, _tracking_modules(created):
        block = DeferredBlock(session.builder.graph)
        yield block
    block.modules = [module for module in _top_level(created) if _holds_fakes_of(module, block.graph)]
    _finish(session, block.modules)


def _recording_of(model: nn.Module) -> InitGraph:
    """The finished recording `model`'s deferred tensors belong to (for `deferred(model)`)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"explorer.deferred(model) expects an nn.Module, got {type(model).__name__}")
    graphs = {
        id(handle.graph): handle.graph
        for tensor in [*model.parameters(), *model.buffers()]
        if (handle := handle_of(tensor)) is not None
    }
    if not graphs:
        raise DeferredInitError(
            f"explorer.deferred(model): this {type(model).__name__} holds no deferred tensor (built eagerly, "
            "or already materialized); run the code directly, or use `with explorer.deferred():` for new modules"
        )
    if len(graphs) > 1:
        # Modules of other recordings put into it (`model.head = other_model.head`): the block extends
        # the model's own recording, and reads the others' tensors (note [Reading another recording]).
        own = [graph for graph in graphs.values() if graph.root is not None and graph.root() is model]
        if len(own) != 1:
            raise DeferredInitError(
                f"explorer.deferred(model): this {type(model).__name__} holds tensors of {len(graphs)} deferred "
                "recordings, and none of them built it; extend one submodule at a time"
            )
        graphs = {id(own[0]): own[0]}
    graph = next(iter(graphs.values()))
    if graph.recorder is None:
        raise DeferredInitError("explorer.deferred(model): the model's recording has not finished")
    return graph


@contextlib.contextmanager
def _recording_onto(graph: InitGraph) -> Iterator[_Session]:
    """Every tensor op in the block is recorded into `graph`, a finished recording, after its ops.

    As `_recording_into`, without a new start state: the block's random ops are ops recorded after
    construction, and a reseed in it is heard by the ledger (record/rng_ledger.py)."""
    recorder = graph.recorder
    assert isinstance(recorder, Recorder)
    session = _Session(recorder.builder, recorder.read_value, recorder.fake_mode)
    first = len(graph.ops)
    try:
        with (
            recorder.lock,
            recording(RecordingScope(graph, session.reader)),
            _collector_paused(),
            session.fake_mode,
            RecordingDispatchMode(session.builder, session.reader, session.fake_mode),
            deferred_lazy_modules(),
            recorded_parameter_classes(),
            recorded_initializers(),
            recorded_checkpoint_reads(),
            recorded_hub_downloads(),
            recorded_torch_load(),
            swappable_fakes(session.builder),
            eager_state_reads(graph),
        ):
            yield session
    except DeferredInitError as error:
        error.graph = error.graph or graph
        _refresh_quietly(graph, first)
        raise
    except BaseException:
        _refresh_quietly(graph, first)
        raise
    refresh_written(graph, first)  # note [Writes after a tensor was made] in replay/replay.py


def _refresh_quietly(graph: InitGraph, first: int) -> None:
    """`refresh_written` for a block that raised: what it recorded before stays recorded, and real
    tensors on that memory take it too; a failure here must not hide the block's own error."""
    try:
        refresh_written(graph, first)
    except Exception:  # the block's error is the one to report
        pass


@contextlib.contextmanager
def _tracking_modules(created: list[weakref.ref]) -> Iterator[None]:
    """While the block runs, remember every module constructed (weakly), undone on any exit.

    Note: wraps `nn.Module.__init__`, which every module's `super().__init__()` reaches; only inside
    `deferred()` blocks.
    """
    original = nn.Module.__init__

    def tracking_init(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        created.append(weakref.ref(self))

    nn.Module.__init__ = tracking_init  # type: ignore[method-assign]  # patched for the block
    try:
        yield
    finally:
        nn.Module.__init__ = original  # type: ignore[method-assign]  # restoring torch's own


def _holds_fakes_of(module: nn.Module, graph: InitGraph) -> bool:
    """Whether `module` holds a tensor recorded into `graph` (parameterless modules, and those a
    library made at import time inside the block, are not what the block built)."""
    for tensor in [*module.parameters(), *module.buffers()]:
        handle = handle_of(tensor)
        if handle is not None and handle.graph is graph:
            return True
    return False


def _top_level(created: list[weakref.ref]) -> list[nn.Module]:
    """The live modules that are no other live module's submodule, in creation order."""
    alive = [module for module in (reference() for reference in created) if module is not None]
    inner: set[int] = set()
    for module in alive:
        inner.update(id(sub) for name, sub in module.named_modules(remove_duplicate=False) if name)
    roots, seen = [], set()
    for module in alive:
        if id(module) not in inner and id(module) not in seen:
            seen.add(id(module))
            roots.append(module)
    return roots
