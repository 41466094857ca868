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
from ..graph import TensorId
from ..record.fake import DeferredHandle, handle_of, is_fake
from .deferred_forms import remember_deferred_forms
from .preflight import check_materializable
from .provenance import remember_origins
from .replay import Progress, Replay, StepReport
from .rng import RngMode
from .routing import DeviceLike, DeviceMap, TensorPlacement, route_devices
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
        by_graph.setdefault(id(_handle(fake).graph), []).append(position)
    results: list[torch.Tensor | None] = [None] * len(fakes)
    for group in by_graph.values():
        graph = _handle(fakes[group[0]]).graph
        positions = []
        for position in group:  # a view made alone earlier is that object again (a tie stays one)
            alone = made_alone(graph, _handle(fakes[position]).tensor_id, routing)
            if alone is None:
                positions.append(position)
            else:
                results[position] = alone
        if not positions:
            continue
        tids = [_handle(fakes[p]).tensor_id for p in positions]
        replay = Replay(graph, routing, names={tid: names[p] for tid, p in zip(tids, positions)})
        reals = replay.run([fakes[p] for p in positions], tids, progress, on_step)
        remember_origins(graph, tids, reals)  # so inspect still tells them from eager tensors
        remember_deferred_forms([fakes[p] for p in positions], reals)  # so release_module can put them back
        for position, real in zip(positions, reals):
            results[position] = real
    return results  # type: ignore[return-value]  # every position was filled above


def check_fakes(fakes: list[torch.Tensor], names: list[str], device: DeviceMap, rng: RngMode) -> None:
    """Raise the MaterializationError `materialize_fakes(fakes, names, device, rng)` would raise
    before running anything (device, rng mode, lazy or swapped tensors, changed checkpoints and
    inputs), and run nothing."""
    routing = route_devices(device, rng)
    by_graph: dict[int, tuple[Replay, list[TensorId]]] = {}
    for fake, name in zip(fakes, names):
        handle = check_materializable(fake, name)
        assert handle is not None  # fakes only
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
    slots = deferred_slots(module, buffers_only, check_fn, attributes=True)
    if not slots:
        return module
    fakes, names = [t for _, t in slots], [s[3] for s, _ in slots]
    if isinstance(device, TensorPlacement):
        reals = materialize_placed(fakes, names, device.resolver(module), rng, progress, on_step)
    else:
        reals = materialize_fakes(fakes, names, device, rng, progress, on_step)
    for ((owner, kind, key, _), _), real in zip(slots, reals):
        getattr(owner, kind)[key] = real
    _fill_tied_slots_elsewhere(module, {id(fake): real for fake, real in zip(fakes, reals)}, fakes)
    return module


def _fill_tied_slots_elsewhere(module: nn.Module, real_of: dict[int, torch.Tensor], fakes: list[torch.Tensor]) -> None:
    """Note: [Ties across a partial materialization]
    A tensor tied outside the materialized submodule (`lm_head.weight is embed_tokens.weight`,
    materializing `lm_head` alone) is held by slots of the recording's root that `module` does not
    reach. Left fake there, the tie is broken until both sides are materialized: a load into the
    fake side (`load_checkpoint`) never reaches the real one, and a save stores both. So every slot
    of the root that holds one of the materialized fakes gets the same real tensor."""
    roots = {id(root): root for fake in fakes if (root := root_of(fake)) is not None and root is not module}
    for root in roots.values():
        for (owner, kind, key, _), fake in deferred_slots(root, attributes=True):
            real = real_of.get(id(fake))
            if real is not None:
                getattr(owner, kind)[key] = real


def root_of(fake: torch.Tensor) -> nn.Module | None:
    """The module `deferred_init` returned for `fake`'s recording, while it lives."""
    handle = handle_of(fake)
    root = handle.graph.root if handle is not None else None
    return root() if root is not None else None
