"""Public materialization API (torchdistx-compatible): real tensors from recorded fakes.

The public names are `__all__`; `materialize_fakes`, `check_fakes`, `materialize_placed`,
`deferred_slots` and `module_slots` are the named entry points the engine's other stages (distributed hand-off, release,
save) share, not part of the user API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import cast

import torch
from torch import nn

from ..errors import MaterializationError
from ..graph import InitGraph, TensorId
from ..record.fake import DeferredHandle, handle_of, is_fake
from .deferred_forms import DeferredForm, deferred_form_of, remember_deferred_forms
from .preflight import check_materializable
from .provenance import remember_origins
from .replay import Progress, Replay, StepReport
from .rng import RngMode
from .routing import DeviceLike, DeviceMap, DeviceRouting, TensorPlacement, route_devices
from .slices import made_alone, materialize_slice

__all__ = ["is_deferred", "materialize_module", "materialize_tensor"]

TensorSlot = tuple[nn.Module, str, str, str]  # (owner, "_parameters" | "_buffers" | "__dict__", key, qualified name)

# Note: [Tensors held as attributes]
# A module may hold a tensor as a plain attribute (`self.scale = torch.randn(3)`, not a buffer).
# torchdistx left those fake; then a module `is_deferred` called materialized still held fakes, and
# its forward returned fakes. `materialize_module` and `release_module` treat such an attribute
# (the module's `__dict__`, not containers inside it) as a slot like a buffer's, with
# `buffers_only` skipping it. The distributed hand-off and `to_fx` keep to parameters and buffers.


def is_deferred(obj: torch.Tensor | nn.Module) -> bool:
    """True for a fake tensor recorded by deferred_init, or a module holding at least one."""
    if isinstance(obj, nn.Module):
        return any(handle_of(t) is not None for t in _module_tensors(obj))
    return handle_of(obj) is not None


def _handle(fake: torch.Tensor) -> DeferredHandle:
    """`handle_of` a fake known to be deferred: materialize_fakes and materialize_placed are given
    only tensors their callers chose by `handle_of(t) is not None`."""
    return cast(DeferredHandle, handle_of(fake))


def _module_tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    for sub in module.modules():
        yield from (p for p in sub._parameters.values() if p is not None)
        yield from (b for b in sub._buffers.values() if b is not None)
        yield from (
            a for a in sub.__dict__.values() if isinstance(a, torch.Tensor)
        )  # note [Tensors held as attributes]


def materialize_fakes(
    fakes: list[torch.Tensor],
    names: list[str],
    device: DeviceMap,
    rng: RngMode,
    progress: Progress | None,
    on_step: StepReport | None = None,
) -> list[torch.Tensor]:
    """Real tensors for `fakes` (named `names` in errors), one replay per recording they belong to,
    on `device` with `rng`; checked before anything runs (MaterializationError naming the tensor)."""
    routing = route_devices(device, rng)
    by_graph: dict[int, list[int]] = {}
    for position, (fake, name) in enumerate(zip(fakes, names)):
        check_materializable(fake, name)
        _refuse_values_from_meta(fake, name, routing)
        by_graph.setdefault(id(_handle(fake).graph), []).append(position)
    results: list[torch.Tensor | None] = [None] * len(fakes)
    to_replay: list[tuple[InitGraph, list[int]]] = []
    for group in by_graph.values():
        graph = _handle(fakes[group[0]]).graph
        positions = []
        for position in group:  # a view made alone earlier is that object again (a tie stays one)
            alone = made_alone(graph, _handle(fakes[position]).tensor_id, routing)
            if alone is None:
                positions.append(position)
            else:
                results[position] = alone
        if positions:
            to_replay.append((graph, positions))
    counted = _ProgressAcrossReplays(progress, [[fakes[p] for p in positions] for _, positions in to_replay])
    for graph, positions in to_replay:
        tids = [_handle(fakes[p]).tensor_id for p in positions]
        replay = Replay(graph, routing, names={tid: names[p] for tid, p in zip(tids, positions)})
        reals = replay.run([fakes[p] for p in positions], tids, counted.report if progress else None, on_step)
        counted.next_replay()
        remember_origins(graph, tids, reals)  # so inspect still tells them from eager tensors
        remember_deferred_forms([fakes[p] for p in positions], reals)  # so release_module can put them back
        for position, real in zip(positions, reals):
            results[position] = real
    return results  # type: ignore[return-value]  # every position was filled above


def _refuse_values_from_meta(fake: torch.Tensor, name: str, routing: DeviceRouting) -> None:
    """A tensor the constructor made on the meta device has no values in eager either: asked for
    on a real device, MaterializationError saying so, before anything runs."""
    recorded = fake.device
    if recorded.type == "meta" and (target := routing.target(recorded)).type != "meta":
        raise MaterializationError(
            f"{name!r} was recorded on the meta device (its constructor made it there: torch.device('meta') "
            f"or device='meta'), where eager construction has no values either, so there are none to put on "
            f"{target}: materialize it with device='meta', or build the model off the meta device"
        )


class _ProgressAcrossReplays:
    """One count for a call that replays several recordings: each replay reports its own tensors and
    bytes, which this offsets by the replays before it, against the totals of all of them."""

    def __init__(self, progress: Progress | None, groups: list[list[torch.Tensor]]) -> None:
        self.progress = progress
        sizes = [{_handle(fake).tensor_id: fake.numel() * fake.element_size() for fake in group} for group in groups]
        self.group_totals = [(len(size), sum(size.values())) for size in sizes]
        self.total = sum(count for count, _ in self.group_totals)
        self.total_bytes = sum(nbytes for _, nbytes in self.group_totals)
        self.done, self.done_bytes, self.group = 0, 0, 0

    def report(self, n: int, _total: int, nbytes: int, _total_bytes: int) -> None:
        if self.progress is not None:
            self.progress(self.done + n, self.total, self.done_bytes + nbytes, self.total_bytes)

    def next_replay(self) -> None:
        count, nbytes = self.group_totals[self.group]
        self.done, self.done_bytes, self.group = self.done + count, self.done_bytes + nbytes, self.group + 1


def check_fakes(fakes: list[torch.Tensor], names: list[str], device: DeviceMap, rng: RngMode) -> None:
    """Raise the MaterializationError `materialize_fakes(fakes, names, device, rng)` would raise
    before running anything (device, rng mode, lazy or swapped tensors, changed checkpoints and
    inputs), and run nothing."""
    routing = route_devices(device, rng)
    by_graph: dict[int, tuple[Replay, list[TensorId]]] = {}
    for fake, name in zip(fakes, names):
        handle = check_materializable(fake, name)
        assert handle is not None  # fakes only
        _refuse_values_from_meta(fake, name, routing)
        if id(handle.graph) not in by_graph:
            by_graph[id(handle.graph)] = (Replay(handle.graph, routing, names={}), [])
        replay, tids = by_graph[id(handle.graph)]
        replay.names[handle.tensor_id] = name
        tids.append(handle.tensor_id)
    for replay, tids in by_graph.values():
        replay.check(tids)


def materialize_placed(
    fakes: list[torch.Tensor],
    names: list[str],
    placement: Callable[[str], DeviceLike],
    rng: RngMode,
    progress: Progress | None,
    on_step: StepReport | None = None,
) -> list[torch.Tensor]:
    """`materialize_fakes` with a target device per tensor name: one replay per target device, every
    target validated before anything runs; progress counts across the groups."""
    groups: dict[str, list[int]] = {}
    for position, name in enumerate(names):
        groups.setdefault(str(placement(name)), []).append(position)
    for target in groups:
        route_devices(target, rng)
    handles = {(id(h.graph), h.tensor_id): f for f in fakes if (h := handle_of(f)) is not None}
    total = len(handles)
    total_bytes = sum(f.numel() * f.element_size() for f in handles.values())
    done = [0, 0]
    results: list[torch.Tensor | None] = [None] * len(fakes)
    for target, positions in groups.items():

        def group_progress(n: int, _total: int, nbytes: int, _total_bytes: int) -> None:
            cast(Progress, progress)(done[0] + n, total, done[1] + nbytes, total_bytes)  # passed when not None

        group = [fakes[p] for p in positions]
        reals = materialize_fakes(
            group, [names[p] for p in positions], target, rng, group_progress if progress is not None else None, on_step
        )
        for position, real in zip(positions, reals):
            results[position] = real
        distinct = {(id(_handle(f).graph), _handle(f).tensor_id): f for f in group}
        done[0] += len(distinct)
        done[1] += sum(f.numel() * f.element_size() for f in distinct.values())
    return results  # type: ignore[return-value]  # every position was filled above


def materialize_tensor(tensor: torch.Tensor, *, device: DeviceMap = None, rng: RngMode = "eager") -> torch.Tensor:
    """The real tensor for a fake one (a real tensor passes through unchanged).

    Memoized: the same fake, or another name for it, gives the same object; a view shares storage
    with its base materialized earlier. A view selecting rows of a base not materialized yet
    (`t[i]`, `t[a:b]`, `t.narrow(0, a, n)`, `t.select(0, i)`) whose value is made by position (a
    random fill or a constant, then pointwise ops) or is a checkpoint read is made alone, at the
    cost of the view (`explorer.slice_plan` says which); it then shares no memory with a base
    materialized later. A view the module holds as a parameter or buffer is made with its base. Other views of a larger
    base make the whole base, with a `WholeBaseWarning`. A fake parameter comes back as an `nn.Parameter`, so
    `module.w = materialize_tensor(module.w)` works. `device` is a device, or a map from recorded to
    target device ("meta" gives shapes only); `rng` is "eager" (bit-identical to eager construction)
    or "fast" (order-independent per-op seeds). Raises MaterializationError naming the culprit;
    nothing is changed when it does.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"explorer.materialize_tensor expects a tensor, got {type(tensor).__name__} {tensor!r:.80}")
    if handle_of(tensor) is None:
        if is_fake(tensor):
            raise MaterializationError(
                "this fake tensor was not created by deferred_init (another FakeTensorMode?), "
                "so there is nothing recorded to replay"
            )
        return tensor
    sliced = materialize_slice(tensor, device, rng)
    if sliced is not None:
        return sliced
    return materialize_fakes([tensor], ["<tensor>"], device, rng, None)[0]


def deferred_slots(
    module: nn.Module,
    buffers_only: bool = False,
    check_fn: Callable[[nn.Module], bool] | None = None,
    attributes: bool = False,
) -> list[tuple[TensorSlot, torch.Tensor]]:
    """Every deferred parameter/buffer slot `materialize_module` would fill, in module order; with
    `attributes`, also tensors held as plain attributes (note [Tensors held as attributes])."""
    kinds: tuple[str, ...] = ("_buffers",) if buffers_only else ("_parameters", "_buffers")
    if attributes and not buffers_only:
        kinds += ("__dict__",)
    return module_slots(module, kinds, check_fn, lambda tensor: handle_of(tensor) is not None, "materialized")


def redefer_given_data(module: nn.Module) -> None:
    """Real tensors of `module` given a deferred tensor's data outside a `deferred(model)` block
    (`real.data = fake`; `vector_to_parameters` after a partial materialization; a tensor made real
    after `deferred_init`, as PEFT's PiSSA init does with its adapters) hold the fake's
    meta storage, neither real nor deferred: each is deferred again by its recording (note [A
    materialized tensor given deferred data] in record/redeferred.py), as the block does at its end."""
    graphs: dict[int, InitGraph] = {}
    swapped = False
    for tensor in (*module.parameters(), *module.buffers()):
        # a fake first: a fake's `is_meta` is a query its recording answers (note [Recording after
        # deferred_init] in record/extension.py), costly per tensor
        if not is_fake(tensor) and tensor.is_meta:
            swapped = True  # materialized before, or never deferred (made real after deferred_init)
            if (form := deferred_form_of(tensor)) is not None:
                graph = cast(DeferredHandle, handle_of(form.fake)).graph
                graphs[id(graph)] = graph
    if not swapped:
        return
    for tensor in (*module.parameters(), *module.buffers()):
        if (handle := handle_of(tensor)) is not None:
            graphs.setdefault(id(handle.graph), handle.graph)
    for graph in graphs.values():
        if graph.recorder is not None:
            graph.recorder.redefer_given_data([module])


def made_on_meta_slots(
    module: nn.Module, buffers_only: bool, check_fn: Callable[[nn.Module], bool] | None, device: DeviceMap
) -> list[tuple[TensorSlot, torch.Tensor]]:
    """Slots holding a tensor an earlier `materialize_module(..., device="meta")` made (shapes only),
    each with the fake it was made from, when `device` (one device, or None: where it was recorded)
    asks for values: they are made again there, as if still deferred. Empty for device maps and
    plans, which keep what they placed."""
    if device is not None and not isinstance(device, str | torch.device):
        return []
    try:
        target = None if device is None else torch.device(device).type
    except RuntimeError:  # not a device: routing refuses it, naming it
        return []

    def meta_made(tensor: torch.Tensor) -> bool:
        if (form := deferred_form_of(tensor)) is None or not tensor.is_meta:  # a fake has no form
            return False
        return (target or form.fake.device.type) != "meta"

    kinds: tuple[str, ...] = ("_buffers",) if buffers_only else ("_parameters", "_buffers", "__dict__")
    return [
        (slot, cast(DeferredForm, deferred_form_of(tensor)).fake)
        for slot, tensor in module_slots(module, kinds, check_fn, meta_made, "materialized")
    ]


def module_slots(
    module: nn.Module,
    kinds: tuple[str, ...],
    check_fn: Callable[[nn.Module], bool] | None,
    wanted: Callable[[torch.Tensor], bool],
    action: str,
) -> list[tuple[TensorSlot, torch.Tensor]]:
    """Every slot of `kinds` ("_parameters", "_buffers") whose tensor is `wanted`, in module order,
    in the submodules `check_fn` chooses (each submodule once; children are visited either way). A
    check_fn that raises is a MaterializationError saying "nothing was {action}"."""
    slots: list[tuple[TensorSlot, torch.Tensor]] = []
    seen: set[int] = set()

    def visit(sub: nn.Module, prefix: str) -> None:
        if id(sub) in seen:
            return
        seen.add(id(sub))
        if check_fn is None or _chosen(check_fn, sub, prefix, action):
            for kind in kinds:
                for key, tensor in getattr(sub, kind).items():
                    if isinstance(tensor, torch.Tensor) and wanted(tensor):
                        slots.append(((sub, kind, key, prefix + key), tensor))
        for name, child in sub._modules.items():
            if child is not None:
                visit(child, f"{prefix}{name}.")

    visit(module, "")
    return slots


def _chosen(check_fn: Callable[[nn.Module], bool], sub: nn.Module, prefix: str, action: str) -> bool:
    try:
        return bool(check_fn(sub))
    except Exception as error:
        where = f"submodule {prefix[:-1]!r}" if prefix else "the root module"
        raise MaterializationError(
            f"check_fn raised {type(error).__name__} for {where} ({type(sub).__name__}): {error}; nothing was {action}"
        ) from error


def materialize_module(
    module: nn.Module,
    buffers_only: bool = False,
    check_fn: Callable[[nn.Module], bool] | None = None,
    *,
    device: DeviceMap = None,
    rng: RngMode = "eager",
    progress: Progress | None = None,
    on_step: StepReport | None = None,
) -> nn.Module:
    """Materialize the deferred parameters and buffers of `module` and its submodules, in place.

    As torchdistx: `buffers_only` skips parameters; `check_fn(submodule)` chooses which submodules'
    own tensors are materialized (children are visited either way). `device` and `rng` as for
    `materialize_tensor`, or a per-tensor placement such as `explorer.plan_devices(...)`'s plan;
    `progress(done, total, done_bytes, total_bytes)` is called as tensors
    complete and may raise to cancel; `on_step(step, detail)` when a step of the replay starts or
    ends ("rng": the generator jumped to eager's states, with how far and how long; "replay").
    All or nothing: on any error (or interrupt) every attribute of the module is left as it was.
    Returns `module`.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"explorer.materialize_module expects an nn.Module, got {type(module).__name__} {module!r:.80}")
    if check_fn is not None and not callable(check_fn):
        raise TypeError(f"check_fn must be a function of a submodule returning bool, got {type(check_fn).__name__}")
    route_devices(None if isinstance(device, TensorPlacement) else device, rng)  # refused before anything changes
    redefer_given_data(module)
    slots = deferred_slots(module, buffers_only, check_fn, attributes=True)
    slots += made_on_meta_slots(module, buffers_only, check_fn, device)
    if not slots:
        return module
    fakes, names = [t for _, t in slots], [s[3] for s, _ in slots]
    grads: dict[int, torch.Tensor] = {}  # position → the real gradient of a parameter that had one
    if isinstance(device, TensorPlacement):
        reals = materialize_placed(fakes, names, device.resolver(module), rng, progress, on_step)
    else:
        prefix = _path_in_model(module, fakes[0])  # errors name `layers.3.weight`, not `weight`
        deferred_grads = {
            p: grad for p, fake in enumerate(fakes) if (grad := _grad_of(fake)) is not None and is_fake(grad)
        }
        made = materialize_fakes(
            [*fakes, *deferred_grads.values()],
            [prefix + name for name in names] + [f"{prefix}{names[p]}.grad" for p in deferred_grads],
            device, rng, progress, on_step,
        )  # fmt: skip
        reals = made[: len(fakes)]
        grads = dict(zip(deferred_grads, made[len(fakes) :]))
    for ((owner, kind, key, _), _), real in zip(slots, reals):
        getattr(owner, kind)[key] = real
    _keep_gradients(fakes, reals, grads)
    _fill_tied_slots_elsewhere(module, {id(fake): real for fake, real in zip(fakes, reals)}, fakes)
    return module


def _grad_of(fake: torch.Tensor) -> torch.Tensor | None:
    """A leaf's `.grad` (a probe backward in the constructor gives a deferred one; a user may set a
    real one); None for tensors that cannot have one."""
    if not fake.requires_grad:
        return None
    try:
        leaf = fake.is_leaf
    except RuntimeError:  # a view of a multi-output op changed in place: autograd refuses even to say
        return None
    return fake.grad if leaf else None


def _keep_gradients(fakes: list[torch.Tensor], reals: list[torch.Tensor], grads: dict[int, torch.Tensor]) -> None:
    """The real tensors take the gradients their fakes held, as eager's parameters keep theirs:
    `grads` (materialized with them) or a real gradient set on the fake, moved to the tensor's device."""
    for position, (fake, real) in enumerate(zip(fakes, reals)):
        grad = grads.get(position)
        if grad is None:
            grad = _grad_of(fake)
            if grad is None or is_fake(grad):
                continue
            grad = grad.to(real.device)
        if real.requires_grad and real.is_leaf and real.grad is None:
            real.grad = grad


def _fill_tied_slots_elsewhere(module: nn.Module, real_of: dict[int, torch.Tensor], fakes: list[torch.Tensor]) -> None:
    """Note: [Ties across a partial materialization]
    A tensor tied outside the materialized submodule (`lm_head.weight is embed_tokens.weight`,
    materializing `lm_head` alone) is held by slots of the recording's root that `module` does not
    reach, or that `check_fn` did not choose. Left fake there, the tie is broken until both sides
    are materialized: two objects where eager has one, and a save stores both. So every slot of
    `module` and of the recording's top-level modules (a `deferred()` block's several) that holds
    one of the materialized fakes gets the same real tensor. A module no top-level module reaches
    (the root dropped, a submodule kept) keeps its fake until it is materialized itself; a write
    recorded on it meanwhile still reaches the real tensor (note [Writes after a tensor was made]
    in replay/replay.py)."""
    # `module` too: with `check_fn`, the other side of a tie may be in a part of it not chosen
    roots = {id(module): module, **{id(root): root for fake in fakes for root in roots_of(fake)}}
    for root in roots.values():
        for (owner, kind, key, _), fake in deferred_slots(root, attributes=True):
            real = real_of.get(id(fake))
            if real is not None:
                getattr(owner, kind)[key] = real


def _path_in_model(module: nn.Module, fake: torch.Tensor) -> str:
    """`module`'s dotted path in the top-level module of `fake`'s recording, with a trailing dot
    ("" for a top-level module, or one no top-level module reaches)."""
    for root in roots_of(fake):
        for path, sub in root.named_modules():
            if sub is module:
                return f"{path}." if path else ""
    return ""


def roots_of(fake: torch.Tensor) -> list[nn.Module]:
    """The live top-level modules of `fake`'s recording."""
    handle = handle_of(fake)
    if handle is None:
        return []
    return [root for ref in handle.graph.roots if (root := ref()) is not None]
