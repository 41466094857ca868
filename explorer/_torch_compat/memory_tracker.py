"""PyTorch's memory trackers (`MemTracker`, `FSDPMemTracker`) with their per-op bookkeeping made cheap.

Note: [Fast memory trackers]
`torch.distributed._tools.mem_tracker.MemTracker` categorizes every storage an op creates
(parameter, gradient, activation, temporary, optimizer state...) and after every op updates the
peak of each module that is running. It finds those modules by walking *every* module it has seen
(a `WeakIdKeyDictionary`, one weak reference made per lookup) and deep-copies a snapshot for each
one whose peak rose — on a 7B Llama step that is most of the time the step takes. The trackers here
keep PyTorch's categorization untouched (same hooks, same enums, same rules: they are subclasses)
and replace only that update, `_update_peak_stats`, by an equivalent one (and `get_tracker_snapshot`'s
deep copy by a copy one level deep, the same values): the running modules
are looked up by name among `ModTracker.parents` (a handful) in an index rebuilt when a module is
first seen, and snapshots are copied one level deep (their values are ints). The results are
byte-for-byte PyTorch's (`tests/explorer/analysis/test_train_memory_tracker.py` compares them).
Two behaviours are added: parameters without `requires_grad` (frozen layers) get no gradient hooks,
where PyTorch's tracker raises trying to register them (`_FrozenParameters`); and each activation
storage remembers the innermost module running when the op that created it ran
(`_ActivationOwners`), so the activations alive at a moment can be split by module.
This mirrors private PyTorch internals (2.13): re-check `_update_peak_stats` on upgrades.

Note: [A root that runs once per microbatch]
`MemTracker._pre_fw_hook` refuses a second forward of the root module while no other module runs
("does not support memory tracking for multiple iterative calls"), to catch a tracker left open
over two training iterations. A pipeline stage runs its root once per microbatch within one step.
`_RepeatedRootForwards` lets it: for a module already tracked, entered again in forward, it marks
a placeholder module as running for the length of PyTorch's own hook, which then takes its path for
a submodule called twice (the module's input bytes and a fresh forward snapshot; no storage is
categorized differently). `FSDPMemTracker` refuses the same in its wrapper of FSDP's pre-forward
(`_fsdp_state_pre_forward`), by the same condition; `FastFSDPPipelineMemTracker` marks the
placeholder there too. Re-check both conditions on upgrades.

Note: [An op's outputs, mapped directly]
After every op, PyTorch's trackers hand each output tensor to their bookkeeping with pytree's
`tree_map_only`, which builds a wrapper, flattens and rebuilds the outputs: a tenth of a planner's
fake step. The trackers' modules look the function up as a global at each call; importing this
module points both at `_flat_tree_map_only`, which gives the same result (a tensor, or a plain tuple or
list of leaves, is mapped directly; anything else, pytree's own walk). Nothing else changes, for
PyTorch's own trackers either: tests/explorer/test_torch_compat.py compares the two on every kind
of tree. Re-check that the trackers still call it by that global name on upgrades.

Note: [Device queries are not ops]
A fake tensor keeps its device in Python: Python's `.device` reads it, but every `.device` C++
asks of it (the autograd engine asks of each gradient it routes) is dispatched as `prim.device`
through every mode. A real tensor answers in C++ without any: PyTorch's trackers never see the query in a real
run. The fast trackers answer it without their bookkeeping (no storage is created, nothing is
categorized, no peak is taken), as a real run's tracker would never have been asked, and answer a
fake tensor's as FakeTensorMode does, without passing through it. It was half of the ops a fake
FSDP step dispatched.

Note: [Bytes by part]
`split_by_part` makes a tracker also count each storage's bytes under the part of the model that
owns it: its current snapshot gains `PartKey(part, category)` keys next to PyTorch's categories, so
every snapshot the tracker copies (its peak, each module's peaks, the windows) carries the split,
and the split adds up to "Total". A part is whatever the caller names from a module path (the
planner: the top-level modules, the repeated blocks' container as one part). A storage's part is:
- for parameters, buffers, gradients and optimizer states, and FSDP's shards and unsharded copies
  of them: the part of the module holding the parameter, claimed when the tracker categorizes them;
- for a storage an op makes during the optimizer step (its states, its temporaries): the part of
  the input it is made from (element i of a foreach op's first list for output i; otherwise the
  op's first tensor argument), so that the optimizer's peak is split by parameter as it happens;
- for any other storage (activations, temporaries, all-gather and reduce-scatter buffers, inputs):
  the part of the innermost module running when the op that made it ran (`part_of_name(None)`
  outside every module).
A storage keeps its part when it changes category. Without `split_by_part` nothing changes: the
snapshots are PyTorch's, byte for byte.
"""

from __future__ import annotations

__all__ = [
    "FastFSDPMemTracker",
    "FastFSDPPipelineMemTracker",
    "FastMemTracker",
    "FastTracker",
    "FastPipelineMemTracker",
    "FSDPPipelineMemTracker",
    "PipelineMemTracker",
    "MemTracker",
    "PartKey",
    "activations_by_owner",
    "bytes_by_part",
    "current_snapshot",
    "innermost_module",
]

import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch

# Importing the module registers fake (meta) kernels for c10d collectives, used under FakeTensorMode.
import torch.distributed._tools.fake_collectives
import torch.distributed._tools.fsdp2_mem_tracker as _fsdp2_mem_tracker_module
import torch.distributed._tools.mem_tracker as _mem_tracker_module
import torch.utils._pytree as _pytree
from torch import nn
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType, _UpdateType
from torch.distributed._tools.mod_tracker import ModTracker
from torch.distributed.fsdp import FSDPModule
from torch.utils.weak import WeakIdKeyDictionary

from .fake import FakeTensor, fake_device_of, in_kernel_invocation

_tree_map_only = _pytree.tree_map_only
_MICROBATCH_PLACEHOLDER = "<microbatch>"  # note [A root that runs once per microbatch]
_NOT_MODULES = frozenset({"Global", _MICROBATCH_PLACEHOLDER})  # ModTracker's parents that name no module
_NODES = _pytree.SUPPORTED_NODES  # the types pytree walks into; every other object is a leaf


def _flat_tree_map_only(type_or_types_or_pred, func, tree, is_leaf=None):
    """`tree_map_only`, the same result, without pytree's walk for what an op returns: a tensor, or a
    plain tuple or list of leaves (note [An op's outputs, mapped directly])."""
    if type_or_types_or_pred is torch.Tensor and is_leaf is None:
        if isinstance(tree, torch.Tensor) and type(tree) not in _NODES:
            return func(tree)
        kind = type(tree)
        if (kind is tuple or kind is list) and not any(type(leaf) in _NODES for leaf in tree):
            return kind(func(leaf) if isinstance(leaf, torch.Tensor) else leaf for leaf in tree)
    return _tree_map_only(type_or_types_or_pred, func, tree, is_leaf=is_leaf)


for _module in (_mem_tracker_module, _fsdp2_mem_tracker_module):
    if getattr(_module, "tree_map_only", None) is _tree_map_only:
        _module.tree_map_only = _flat_tree_map_only  # type: ignore[attr-defined]  # the trackers' global lookup


class _FastPeaks:
    """Mixin replacing `MemTracker._update_peak_stats` (see note [Fast memory trackers])."""

    _indexed_count: int = -1
    _by_name: dict
    # MemTracker's, which comes after this mixin in the MRO: declared (not assigned) for the type checker
    memory_tracking: WeakIdKeyDictionary
    _mod_tracker: ModTracker
    _curr_mem_snap: dict[torch.device, dict[str, int]]
    _peak_mem: dict[torch.device, int]
    _peak_mem_snap: dict[torch.device, dict[str, int]]
    # The peak since `start_window()`: (total, snapshot) per device. A phase's own peak, where the
    # tracker's is the running peak of everything so far.
    _window_peaks: dict[torch.device, tuple[int, dict[str, int]]] | None = None

    def start_window(self) -> None:
        """Start measuring a window's own peak from the bytes alive now (`window_peak()`)."""
        self._window_peaks = {device: (snap[_TOTAL_KEY], dict(snap)) for device, snap in self._curr_mem_snap.items()}

    def window_peak(self) -> dict[torch.device, dict[str, int]]:
        """Per device, the snapshot (category → bytes, "Total") at the most bytes alive since
        `start_window()` (since the tracker started, without one)."""
        if self._window_peaks is None:
            return {device: dict(snap) for device, snap in self._peak_mem_snap.items()}
        return {device: dict(snap) for device, (_, snap) in self._window_peaks.items()}

    def _running_stats(self) -> list:
        tracking = self.memory_tracking
        if len(tracking) != self._indexed_count:
            by_name: dict[str, list] = {}
            for stats in tracking.values():
                by_name.setdefault(stats.mod_fqn, []).append(stats)
            self._by_name, self._indexed_count = by_name, len(tracking)
        running = []
        for name in self._mod_tracker.parents:
            running.extend(self._by_name.get(name, ()))
        return running

    def get_tracker_snapshot(self, type: str = "current") -> dict[torch.device, dict[Any, int]]:
        """MemTracker's, copied one level deep rather than deep-copied: the same values (ints under
        immutable keys), without `deepcopy`'s walk, which FSDP's tracker takes at every FSDP hook."""
        if type == "current":
            return {device: dict(snap) for device, snap in self._curr_mem_snap.items()}
        if type == "peak":
            return {device: dict(snap) for device, snap in self._peak_mem_snap.items()}
        return super().get_tracker_snapshot(type)  # type: ignore[misc]  # MemTracker's, next in the MRO: raises

    def reset_mod_stats(self) -> None:
        super().reset_mod_stats()  # type: ignore[misc]  # MemTracker's, next in the MRO
        self._indexed_count = -1  # the index would hold the old statistics once as many modules ran again

    def _update_peak_stats(self, peak_state) -> None:
        current = self._curr_mem_snap
        for stats in self._running_stats():
            if stats.mod_fqn not in self._mod_tracker.parents:  # renamed since indexed
                continue
            if peak_state in stats.snapshots:
                for device, device_snap in current.items():
                    if stats.local_peak.get(device, 0) < device_snap[_TOTAL_KEY]:
                        stats.local_peak[device] = device_snap[_TOTAL_KEY]
                        stats.snapshots[peak_state][-1][device] = dict(device_snap)
        peaks = self._peak_mem
        for device, device_snap in current.items():
            if peaks.get(device, 0) < device_snap[_TOTAL_KEY]:
                peaks[device] = device_snap[_TOTAL_KEY]
                self._peak_mem_snap[device] = dict(device_snap)
        window = self._window_peaks
        if window is not None:
            for device, device_snap in current.items():
                if window.get(device, (-1, None))[0] < device_snap[_TOTAL_KEY]:
                    window[device] = (device_snap[_TOTAL_KEY], dict(device_snap))


class _FrozenParameters:
    """Mixin: parameters that do not require grad (frozen layers, LoRA bases) get no gradient hooks.

    `MemTracker._track_module_params_and_buffers` registers a hook on every parameter, which raises
    for one without `requires_grad`; here hooks go only on those that have it, as PyTorch's would.
    """

    _param_to_grad_hook_handles: WeakIdKeyDictionary  # MemTracker's, after this mixin in the MRO

    def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
        totals = super()._track_module_params_and_buffers(module, install_grad_hooks=False)  # type: ignore[misc]  # MemTracker's, next in the MRO
        if install_grad_hooks:
            handles = self._param_to_grad_hook_handles
            for param in module.parameters():
                if param.requires_grad and handles.get(param, None) is None:
                    handles[param] = (
                        param.register_hook(self._grad_hook),
                        param.register_post_accumulate_grad_hook(lambda p: self._grad_hook(p.grad)),
                    )
        return totals

    def _grad_hook(self, grad) -> None:
        self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)  # type: ignore[attr-defined]  # MemTracker's, after this mixin in the MRO


# A fake tensor answers `.device` through dispatch (it reports a device it has no storage on).
_DEVICE_QUERY = torch.ops.prim.device.default
_META = torch.device("meta")


def _device_of(tensor: object) -> torch.device:
    """`prim.device` of `tensor`, as FakeTensorMode answers it (its `_device_handler`: the fake device,
    or meta while a kernel of the fake mode runs) without passing through the mode; any other
    tensor asks the modes below."""
    if isinstance(tensor, FakeTensor):
        return _META if in_kernel_invocation(tensor.fake_mode) else fake_device_of(tensor)
    return _DEVICE_QUERY(tensor)


class _FailureSite:
    """Mixin: remembers the innermost module running when an op raised, as `failed_in`; and hands
    every op the tracker ran to `op_observer`, when one is set.

    ModTracker's forward hooks always run, so by the time an error leaves the step the modules it
    was raised in are no longer "running"; the op that raised still passes through this mode.
    `op_observer(func, args, kwargs, result)` sees each op the tracker sees (both trackers decline
    DTensor ops, so that DTensor's own collectives reach them desugared): what a dispatch mode
    entered just inside the tracker would see, without the cost of one more mode per op.
    """

    failed_in: str | None = None
    op_observer: Callable[[Any, tuple, dict, Any], None] | None = None
    _mod_tracker: ModTracker  # MemTracker's, after this mixin in the MRO

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE_QUERY:
            # a fake tensor's `.device`, asked by C++ (the autograd engine asks of every gradient):
            # no storage comes of it (note [Device queries are not ops])
            return _device_of(args[0]) if len(args) == 1 and not kwargs else func(*args, **(kwargs or {}))
        try:
            result = super().__torch_dispatch__(func, types, args, kwargs)  # MemTracker's, next in the MRO
        except Exception:
            if self.failed_in is None:
                self.failed_in = innermost_module(self._mod_tracker)
            raise
        if self.op_observer is not None and result is not NotImplemented:
            self.op_observer(func, args, kwargs or {}, result)
        return result


class _ActivationOwners:
    """Mixin: an activation storage records, as `forward_owner` on its `_WeakRefInfo`, the innermost
    module running (ModTracker's name, None outside every module) when the op that created it ran.

    `MemTracker._track` creates the storage's info for each output of an op; ops run in the order
    modules run, so the innermost running module is the one whose own forward code made it.
    """

    _WINFO: WeakIdKeyDictionary  # MemTracker's, after this mixin in the MRO
    _mod_tracker: ModTracker

    def _track(self, reftype, t) -> None:
        super()._track(reftype, t)  # type: ignore[misc]  # MemTracker's, next in the MRO
        if not _is_activation(reftype):
            return
        owner = innermost_module(self._mod_tracker)
        for storage in get_untyped_storages(t):
            winfo, _ = self._WINFO.get(storage, (None, None))
            if winfo is not None and not hasattr(winfo, "forward_owner"):
                winfo.forward_owner = owner


def _is_activation(reftype: object) -> bool:
    """MemTracker's and FSDPMemTracker's activation categories (two enums, one value)."""
    return getattr(reftype, "value", None) == _MemRefType.ACT.value


def current_snapshot(tracker: MemTracker) -> tuple[torch.device | None, dict]:
    """The device holding the most bytes now and its current snapshot (category → bytes, "Total")."""
    snapshot = tracker.get_tracker_snapshot("current")
    if not snapshot:
        return None, {}
    device = max(snapshot, key=lambda dev: snapshot[dev][_TOTAL_KEY])
    return device, snapshot[device]


def activations_by_owner(tracker: MemTracker, device: torch.device) -> dict[str | None, int]:
    """The bytes of the activation storages alive now on `device`, by the module that created them
    (`_ActivationOwners`; ModTracker's names, None for ops outside every module). They add up to
    the tracker's current activation bytes on `device`: the same storages, the same sizes."""
    owners: dict[str | None, int] = {}
    for winfo, weak_storage in list(tracker._WINFO.values()):
        if weak_storage() is None or not _is_activation(winfo.reftype) or winfo.device != device:
            continue
        owner = getattr(winfo, "forward_owner", None)
        owners[owner] = owners.get(owner, 0) + winfo.mem_consumed
    return owners


def innermost_module(mod_tracker: ModTracker) -> str | None:
    """The deepest module ModTracker has running (its longest name), None outside any."""
    names = sorted(mod_tracker.parents - _NOT_MODULES, key=len)
    return names[-1] if names else None


class PartKey(NamedTuple):
    """A snapshot key: the bytes of one part of the model in one of the tracker's categories
    (note [Bytes by part])."""

    part: str
    category: str  # the tracker's category name: "Activation", "Sharded Param"...

    def __deepcopy__(self, memo: dict) -> PartKey:
        return self  # immutable: FSDP's tracker deep-copies snapshots at every FSDP hook


# The categories whose storages belong to a parameter or buffer (note [Bytes by part]); the names
# of MemTracker's and FSDPMemTracker's enums ("Optstate" and "OptState" are one category).
_CLAIMED = frozenset(
    {
        "Parameter",
        "Buffer",
        "Gradient",
        "Optstate",
        "OptState",
        "Sharded Param",
        "Unsharded Param",
        "Sharded Grad",
        "Unsharded Grad",
    }
)
_Claims = dict[int, tuple[weakref.ref, str]]


def bytes_by_part(device_snap: dict) -> dict[tuple[str, str], int]:
    """A device snapshot's bytes by (part, tracker category), nonzero ones only: empty unless the
    tracker split them (note [Bytes by part])."""
    return {(key.part, key.category): value for key, value in device_snap.items() if type(key) is PartKey and value}


def _fsdp_params(module: nn.Module) -> Sequence[Any]:
    """FSDP2's per-parameter records of `module`'s own parameter group (none for other modules)."""
    if not isinstance(module, FSDPModule):
        return ()
    group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
    return group.fsdp_params if group is not None else ()


def _claims_of(
    roots: Sequence[nn.Module], part_of_module: Callable[[nn.Module], str], optimizer: torch.optim.Optimizer | None
) -> _Claims:
    """Each parameter-owned tensor alive now (parameters, buffers, their gradients, FSDP's sharded and
    unsharded parameters and gradients, optimizer states) → its part, by id, with a weak reference to
    tell a reused id apart. Weak: holding a gradient here would keep its storage alive."""
    claims: _Claims = {}

    def claim(tensor: object, part: str) -> None:
        if isinstance(tensor, torch.Tensor) and id(tensor) not in claims:
            claims[id(tensor)] = (weakref.ref(tensor), part)

    for root in roots:
        for module in root.modules():
            part = part_of_module(module)
            for param in module._parameters.values():
                if param is not None:
                    claim(param, part)
                    claim(param.grad, part)
            for buffer in module._buffers.values():
                claim(buffer, part)
            for fsdp_param in _fsdp_params(module):
                owner = part_of_module(fsdp_param._module_info.module)
                for param in (fsdp_param.sharded_param, getattr(fsdp_param, "_unsharded_param", None)):
                    if param is not None:
                        claim(param, owner)
                        claim(param.grad, owner)
    if optimizer is not None:
        for trained, state in optimizer.state.items():
            entry = claims.get(id(trained))
            if entry is not None:
                for value in state.values():
                    claim(value, entry[1])
    return claims


class _PartShares:
    """Mixin: with `split_by_part`, the tracker's snapshots also hold its bytes by part of the model
    (note [Bytes by part])."""

    _part_of_name: Callable[[str | None], str] | None = None
    _output_parts: Iterator[str | None] | None = None
    _pending_part: str | None = None
    # MemTracker's, after this mixin in the MRO: declared (not assigned) for the type checker
    _curr_mem_snap: dict[torch.device, dict[Any, int]]
    _mod_tracker: ModTracker
    _WINFO: WeakIdKeyDictionary
    _ref_class: Any
    _in_opt: bool

    def split_by_part(
        self,
        part_of_name: Callable[[str | None], str],
        part_of_module: Callable[[nn.Module], str],
        roots: Iterable[nn.Module],
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        """Count bytes by part from now on (call before anything is tracked). `part_of_name`: the part
        of a module by ModTracker's name (None: outside every module); `part_of_module`: the part of
        a module of `roots` (the modules whose parameters the step trains); `optimizer`: the step's,
        whose states belong to their parameters' parts."""
        self._part_of_name = part_of_name
        self._part_of_module = part_of_module
        self._part_roots = tuple(roots)
        self._part_optimizer = optimizer
        self._parts_by_name: dict[str | None, str] = {}
        self._claims: _Claims = {}

    def _running_part(self) -> str:
        name = innermost_module(self._mod_tracker)
        part = self._parts_by_name.get(name)
        if part is None:
            assert self._part_of_name is not None
            part = self._parts_by_name[name] = self._part_of_name(name)
        return part

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
        if self._part_of_name is not None:
            self._share(u_type, winfo, old_mem_consumed, old_reftype)
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)  # type: ignore[misc]  # MemTracker's, next in the MRO

    def _share(self, u_type, winfo, old_mem_consumed, old_reftype) -> None:
        """The same change as `MemTracker._update_snap`'s, on the storage's part."""
        part = winfo.__dict__.get("part")
        if part is None:
            part = winfo.part = self._pending_part or self._running_part()
        snap = self._curr_mem_snap.get(winfo.device)
        if snap is None:  # as MemTracker's `_update_snap` makes it, which then finds it
            snap = self._curr_mem_snap[winfo.device] = dict.fromkeys(self._ref_class, 0)
        size = winfo.mem_consumed
        if u_type is _UpdateType.ADD:
            change = size
        elif u_type is _UpdateType.DEL:
            change = -size
        elif u_type is _UpdateType.SIZE:
            change = size - old_mem_consumed
        else:  # a change of category
            old = PartKey(part, old_reftype.value)
            snap[old] = snap.get(old, 0) - size
            change = size
        key = PartKey(part, winfo.reftype.value)
        snap[key] = snap.get(key, 0) + change

    def _update_and_maybe_create_winfos(self, t, reftype, update_existing: bool = False):
        winfos = super()._update_and_maybe_create_winfos(t, reftype, update_existing)  # type: ignore[misc]  # MemTracker's, next in the MRO
        if self._part_of_name is not None and getattr(reftype, "value", None) in _CLAIMED:
            part = self._claimed_part(t)
            if part is not None:
                self._move(winfos, part)
        return winfos

    def _claimed_part(self, tensor: torch.Tensor) -> str | None:
        """The part of the parameter `tensor` belongs to; the claims are taken again when it is new."""
        entry = self._claims.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            self._claims = _claims_of(self._part_roots, self._part_of_module, self._part_optimizer)
            entry = self._claims.get(id(tensor))
            if entry is None or entry[0]() is not tensor:
                return None
        return entry[1]

    def _move(self, winfos: Iterable[Any], part: str) -> None:
        """Count the storages' bytes under `part` from now on."""
        for winfo in winfos:
            old = winfo.__dict__.get("part")
            if old == part:
                continue
            winfo.part = part
            if old is None or not winfo.mem_consumed:
                continue
            snap = self._curr_mem_snap[winfo.device]
            category = winfo.reftype.value
            snap[PartKey(old, category)] -= winfo.mem_consumed
            key = PartKey(part, category)
            snap[key] = snap.get(key, 0) + winfo.mem_consumed

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._part_of_name is None or not self._in_opt:
            return super().__torch_dispatch__(func, types, args, kwargs)  # MemTracker's, next in the MRO
        self._output_parts = self._input_parts(args)
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            self._output_parts = None

    def _input_parts(self, args: tuple) -> Iterator[str | None]:
        """The parts an optimizer-step op's outputs take, in order (note [Bytes by part])."""
        first = args[0] if args else None
        if isinstance(first, (list, tuple)):  # a foreach op: output i is made from element i
            return iter([self._tensor_part(value) for value in first])
        tensor = next((value for value in args if isinstance(value, torch.Tensor)), None)
        return itertools.repeat(self._tensor_part(tensor))

    def _tensor_part(self, tensor: object) -> str | None:
        if not isinstance(tensor, torch.Tensor):
            return None
        for storage in get_untyped_storages(tensor):
            winfo, _ = self._WINFO.get(storage, (None, None))
            if winfo is not None:
                return winfo.__dict__.get("part")
        return None

    def _track(self, reftype, t) -> None:
        parts = self._output_parts
        if parts is None:
            super()._track(reftype, t)  # type: ignore[misc]  # MemTracker's, next in the MRO
            return
        self._pending_part = next(parts, None)
        try:
            super()._track(reftype, t)  # type: ignore[misc]  # MemTracker's, next in the MRO
        finally:
            self._pending_part = None


class _RepeatedRootForwards:
    """Mixin: the root module may run forward again within one tracked step (note [A root that runs
    once per microbatch])."""

    _PLACEHOLDER = _MICROBATCH_PLACEHOLDER
    memory_tracking: WeakIdKeyDictionary  # MemTracker's, after this mixin in the MRO
    _mod_tracker: ModTracker

    @contextmanager
    def _allowed_again(self, module) -> Iterator[None]:
        """While active, a second forward of `module` reads as a submodule's (see the note)."""
        again = module in self.memory_tracking and not self._mod_tracker.is_bw
        parents = self._mod_tracker.parents
        if again:
            parents.add(self._PLACEHOLDER)
        try:
            yield
        finally:
            if again:
                parents.discard(self._PLACEHOLDER)

    def _pre_fw_hook(self, module, inputs) -> None:
        with self._allowed_again(module):
            super()._pre_fw_hook(module, inputs)  # type: ignore[misc]  # MemTracker's, next in the MRO


class PipelineMemTracker(_RepeatedRootForwards, MemTracker):
    """PyTorch's `MemTracker`, but that a stage's root may run once per microbatch (note [A root that
    runs once per microbatch]); what a real pipeline run is measured with."""


class FastMemTracker(_FailureSite, _ActivationOwners, _PartShares, _FastPeaks, _FrozenParameters, MemTracker):
    """`MemTracker` with a cheap peak update; same categories and bytes (note [Fast memory trackers])."""


class FastFSDPMemTracker(_FailureSite, _ActivationOwners, _PartShares, _FastPeaks, FSDPMemTracker):
    """`FSDPMemTracker` with a cheap peak update; same categories and bytes (note [Fast memory trackers])."""


FastTracker = FastMemTracker | FastFSDPMemTracker


class FastPipelineMemTracker(_RepeatedRootForwards, FastMemTracker):
    """`FastMemTracker` for a pipeline stage: its root runs once per microbatch (note [A root that runs
    once per microbatch])."""


class _RepeatedFSDPRootForwards(_RepeatedRootForwards):
    """Mixin for `FSDPMemTracker`: a rank's pipeline stages are FSDP roots, each run once per
    microbatch (note [A root that runs once per microbatch]). `roots`: the rank's stages (several
    with an interleaved schedule); PyTorch's tracker takes one root and instruments the FSDP modules
    under it, so several are held under one `nn.ModuleList` (not an FSDP module; nothing runs it)."""

    def __init__(self, roots: Sequence[nn.Module], optm: torch.optim.Optimizer | None = None) -> None:
        super().__init__(roots[0], optm)  # type: ignore[call-arg]  # FSDPMemTracker's, next in the MRO
        if len(roots) > 1:
            # typed as an FSDP module by PyTorch; only its module tree and buffers are read
            vars(self)["_root_mod"] = nn.ModuleList(roots)

    def _fsdp_state_pre_forward(self, fsdp_mod, orig_fsdp_state_pre_fw):
        # FSDPMemTracker's FSDP pre-forward wrapper refuses a second forward of a root as
        # MemTracker's module hook does: the same placeholder lets both through.
        inner = super()._fsdp_state_pre_forward(fsdp_mod, orig_fsdp_state_pre_fw)  # FSDPMemTracker's, next in the MRO

        def allowed_again(*args, **kwargs):
            with self._allowed_again(fsdp_mod):
                return inner(*args, **kwargs)

        return allowed_again


class FSDPPipelineMemTracker(_RepeatedFSDPRootForwards, FSDPMemTracker):
    """PyTorch's `FSDPMemTracker` for a rank's FSDP2-sharded pipeline stages (`_RepeatedFSDPRootForwards`);
    what a real pipeline of sharded stages is measured with."""


class FastFSDPPipelineMemTracker(_RepeatedFSDPRootForwards, FastFSDPMemTracker):
    """`FastFSDPMemTracker` for a rank's FSDP2-sharded pipeline stages (`_RepeatedFSDPRootForwards`)."""
