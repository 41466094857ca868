"""Where materialized tensors go (`device=`) and where their ops run.

With rng="eager" ops run on the device they were recorded on, so random values come from the
generator eager construction would have used, and the results are moved afterwards. With
rng="fast", or when the recorded device is absent and nothing random is involved, ops run on the
target device directly. A "meta" target never computes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from ..errors import MaterializationError
from .rng import RNG_MODES, RngMode

DeviceLike = str | torch.device | int


@runtime_checkable
class TensorPlacement(Protocol):
    """A device per tensor name rather than per recorded device (`explorer.plan_devices`'s MemoryPlan).

    `materialize_module(module, device=placement)` calls `placement.resolver(module)` once and asks
    the returned function for the target of each qualified tensor name (relative to `module`).
    """

    def resolver(self, module: Any) -> Callable[[str], DeviceLike]: ...


DeviceMap = DeviceLike | Mapping[DeviceLike, DeviceLike] | TensorPlacement | None


def parse_device(value: object) -> torch.device:
    """`torch.device(value)`, with a MaterializationError naming the bad string."""
    if isinstance(value, torch.device):
        return value
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise MaterializationError(
            f"device must be a string such as 'cpu' or 'cuda:0', a torch.device or a device index, "
            f"got {type(value).__name__} {value!r:.60}"
        )
    try:
        return torch.device(value)
    except (RuntimeError, TypeError) as error:
        raise MaterializationError(f"unknown device {value!r}: {error}") from None


def normalize(device: torch.device) -> torch.device:
    """The device a tensor made there reports: cuda → cuda:0 (as fake tensors report it), cpu:0 →
    cpu and meta:0 → meta (PyTorch drops their index), others unchanged."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", 0)
    if device.type in ("cpu", "meta") and device.index is not None:
        return torch.device(device.type)
    return device


def is_available(device: torch.device) -> bool:
    """Whether real tensors can be allocated on `device` on this machine."""
    if device.type in ("cpu", "meta"):
        return True
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()
    try:
        torch.empty(0, device=device)
    except RuntimeError:
        return False
    return True


def describe_absence(device: torch.device) -> str:
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return f"device {device} is not available (this machine has {count} CUDA device{'s' * (count != 1)})"
    return f"device {device} is not available on this machine"


@dataclass(frozen=True)
class DeviceRouting:
    """The answer to "where does a tensor recorded on device X go, and where do its ops run"."""

    exact: tuple[tuple[str, torch.device], ...]  # recorded device → target
    by_type: tuple[tuple[str, torch.device], ...]  # recorded device type → target ("cuda" → cpu)
    default: torch.device | None  # target for everything else; None keeps the recorded device
    rng: RngMode
    # Answers already given: each recorded device is routed once per materialization, since asking
    # CUDA whether a device is there costs 0.2 ms, per op without this (issue 36's profile).
    _targets: dict[torch.device, torch.device] = field(default_factory=dict, compare=False, repr=False)
    _exec_devices: dict[object, torch.device] = field(default_factory=dict, compare=False, repr=False)

    def target(self, recorded: torch.device) -> torch.device:
        """Where a tensor recorded on `recorded` ends up."""
        found = self._targets.get(recorded)
        if found is None:
            found = self._targets[recorded] = self._route(recorded)
        return found

    def _route(self, recorded: torch.device) -> torch.device:
        recorded = normalize(recorded)
        for name, target in self.exact:
            if name == str(recorded):
                return target
        for name, target in self.by_type:
            if name == recorded.type:
                return target
        return self.default if self.default is not None else recorded

    def exec_device(self, recorded: torch.device | str) -> torch.device:
        """Where ops producing a tensor recorded on `recorded` (a device, or a stream key such as
        'cuda:0') run."""
        found = self._exec_devices.get(recorded)
        if found is None:
            found = self._exec_devices[recorded] = self._exec_device(torch.device(recorded))
        return found

    def _exec_device(self, recorded: torch.device) -> torch.device:
        target = self.target(recorded)
        if target.type == "meta":
            return target
        if self.rng == "eager" and is_available(normalize(recorded)):
            return normalize(recorded)
        return target


def route_devices(device: DeviceMap, rng: RngMode) -> DeviceRouting:
    """Validate `device=` and `rng=` and turn them into a `DeviceRouting`.

    Raises MaterializationError for unknown device strings, absent target devices and unknown rng
    modes, before anything is replayed.
    """
    if rng not in RNG_MODES:
        raise MaterializationError(f"rng must be one of {RNG_MODES}, got {rng!r}")
    exact: list[tuple[str, torch.device]] = []
    by_type: list[tuple[str, torch.device]] = []
    default = None
    if isinstance(device, Mapping):
        for recorded, target in device.items():
            recorded_device, target_device = parse_device(recorded), normalize(parse_device(target))
            if recorded_device.index is None and recorded_device.type != "cpu":
                by_type.append((recorded_device.type, target_device))
            else:
                exact.append((str(normalize(recorded_device)), target_device))
    elif device is not None:
        default = normalize(parse_device(device))
    for target in [t for _, t in exact] + [t for _, t in by_type] + ([default] if default else []):
        if not is_available(target):
            raise MaterializationError(f"cannot materialize onto {target}: {describe_absence(target)}")
    return DeviceRouting(tuple(exact), tuple(by_type), default, rng)
