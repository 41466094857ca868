"""The per-module table of a training step, read from the snapshots PyTorch's trackers take.

`MemTracker` snapshots a module before and after each forward call and keeps its peak in forward
and in backward; `FSDPMemTracker` does the same for the modules `fully_shard` was applied to (only
those get rows when sharded). States are read by their values, which both trackers share the
meaning of (`_ModState` / `_FSDPModState` in PyTorch 2.13; re-check on upgrades).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from torch import nn

if TYPE_CHECKING:  # the tracker's module loads torch.distributed's tools: not for the widgets' import
    from .._torch_compat.memory_tracker import MemTracker

MODULE_COLUMNS = [
    "name",
    "class",
    "calls",
    "forward_peak_bytes",
    "backward_peak_bytes",
    "activation_bytes",
]
# (peak in forward, peak in backward, before a forward call, after it), per tracker.
_STATES = {
    "MemTracker": ("Peak-Forward", "Peak-Backward", "Pre-Forward", "Post-Forward"),
    "FSDPMemTracker": (
        "Peak Forward",
        "Peak Backward",
        "Before Pre-Forward",
        "After Post-Forward",
    ),
}
FORWARD_ACTIVATION_COLUMNS = ["name", "class", "activation_bytes"]
OUTSIDE_MODULES = "(outside modules)"  # the name of ops run outside every module's forward (a loss function)
_WRAPPED = "_checkpoint_wrapped_module"


def _total(snapshot: dict) -> int:
    return max((device_snap["Total"] for device_snap in snapshot.values()), default=0)


def _activations(snapshot: dict) -> int:
    return sum(
        value
        for device_snap in snapshot.values()
        for key, value in device_snap.items()
        if getattr(key, "value", None) == "Activation"
    )


def _states(tracker: MemTracker) -> tuple[str, str, str, str]:
    for cls in type(tracker).__mro__:
        if cls.__name__ in _STATES:
            return _STATES[cls.__name__]
    raise TypeError(f"not a PyTorch memory tracker: {type(tracker).__name__}")


def _by_state(stats: object) -> dict[str, list[dict]]:
    return {state.value: snapshots for state, snapshots in stats.snapshots.items()}  # type: ignore[attr-defined]  # torch's private _ModMemStats


def block_peak_snapshots(twin: nn.Module, tracker: MemTracker, blocks: list[str]) -> dict[tuple[str, str], dict]:
    """For each block path in `blocks` and each of "forward" and "backward", the snapshot (category →
    bytes, "Total") of the device holding most at the block's peak while that pass of it ran; blocks
    the step did not run are left out. Paths are the twin's, checkpoint wrappers folded."""
    return {
        key: max(calls, key=lambda snap: snap["Total"])
        for key, calls in block_call_snapshots(twin, tracker, blocks).items()
    }


def block_call_snapshots(root: nn.Module, tracker: MemTracker, blocks: list[str]) -> dict[tuple[str, str], list[dict]]:
    """For each block path in `blocks` (paths in `root`, checkpoint wrappers folded) and each of
    "forward" and "backward", the peak snapshot of each call of that pass, in call order (the device
    holding most; category → bytes, "Total"): a pipeline stage's block runs once per microbatch,
    and each call's peak is a candidate of its own (note [Composing a pipelined step]). The trackers
    start a peak snapshot at each call's start and raise only that one while the call runs."""
    peak_fw, peak_bw, _, _ = _states(tracker)
    tracked: dict[str, object] = {}  # the outermost tracked module at each unwrapped path
    for path, sub in root.named_modules():
        stats = tracker.memory_tracking.get(sub)
        if stats is not None:
            tracked.setdefault(unwrapped(path), stats)
    found: dict[tuple[str, str], list[dict]] = {}
    for path in blocks:
        stats = tracked.get(path)
        if stats is None:
            continue
        snapshots = _by_state(stats)
        for phase, state in (("forward", peak_fw), ("backward", peak_bw)):
            calls = [
                max(per_device.values(), key=lambda snap: snap["Total"])
                for per_device in snapshots.get(state, [])
                if per_device
            ]
            if calls:
                found[(path, phase)] = calls
    return found


def module_table(module: nn.Module, twin: nn.Module, tracker: MemTracker) -> pd.DataFrame:
    """One row per module of `twin` the step ran, named by its path in `module` (checkpoint wrappers
    are folded into the block they wrap): calls, the peak bytes while its forward ran and while its
    backward ran, and `activation_bytes`, the activations its forward calls created and still held
    when they returned (what backward needs from it, plus its outputs)."""
    peak_fw, peak_bw, before, after = _states(tracker)
    classes = {path: type(sub).__name__ for path, sub in module.named_modules()}
    rows = []
    for path, sub in twin.named_modules():
        stats = tracker.memory_tracking.get(sub)
        if stats is None or type(sub).__name__ == "CheckpointWrapper":
            continue
        name = unwrapped(path)
        snapshots = _by_state(stats)
        pairs = zip(snapshots.get(before, []), snapshots.get(after, []))
        rows.append(
            {
                "name": name,
                "class": classes.get(name, type(sub).__name__),
                "calls": len(snapshots.get(before, [])),
                "forward_peak_bytes": max((_total(s) for s in snapshots.get(peak_fw, [])), default=0),
                "backward_peak_bytes": max((_total(s) for s in snapshots.get(peak_bw, [])), default=0),
                "activation_bytes": sum(_activations(post) - _activations(pre) for pre, post in pairs),
            }
        )
    return pd.DataFrame(rows, columns=MODULE_COLUMNS)


def unwrapped(path: str) -> str:
    """`path` with checkpoint wrappers folded into the module they wrap."""
    return ".".join(part for part in path.split(".") if part != _WRAPPED)


def forward_activation_table(module: nn.Module, twin: nn.Module, owners: dict[str | None, int]) -> pd.DataFrame:
    """One row per module whose own forward code created activations still alive (`owners`: bytes by
    ModTracker name, from `memory_tracker.activations_by_owner`), in the order of `module`'s modules,
    named by path in `module` (checkpoint wrappers folded); a module's row excludes what its
    submodules created, so the rows add up to all activations alive. Ops outside every module come
    last, as `OUTSIDE_MODULES`."""
    classes = {path: type(sub).__name__ for path, sub in module.named_modules()}
    order = {unwrapped(path): index for index, (path, _) in enumerate(twin.named_modules())}
    by_name: dict[str, int] = {}
    for owner, value in owners.items():
        # ModTracker names modules "<root class>.<path>"; None: no module was running
        name = OUTSIDE_MODULES if owner is None else unwrapped(owner.partition(".")[2])
        by_name[name] = by_name.get(name, 0) + value
    rows = [
        {"name": name, "class": classes.get(name, ""), "activation_bytes": value}
        for name, value in sorted(by_name.items(), key=lambda item: order.get(item[0], len(order)))
        if value
    ]
    return pd.DataFrame(rows, columns=FORWARD_ACTIVATION_COLUMNS)
