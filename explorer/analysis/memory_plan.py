"""`plan_devices`: which device each part of a module goes to, given a memory budget per device.

Placement is greedy and in module order, like `accelerate.infer_auto_device_map`: devices fill one
after another; a unit (a module, or one tensor of a split module) goes to the current device when
it fits, is split into its direct tensors and children when it does not and has children (unless
its class is in `no_split`), and otherwise moves everything after it to the next device.

Tied tensors stay together: sizes count storages (from the census, so a tied weight, a shared
module or a view and its base count once), and a unit whose storages are also held by other units
is placed together with them, all on one device. When the group does not fit but the unit alone
would, the first splittable partner is split instead (as accelerate does), so only the part that
holds the tie follows the unit.

The plan is plain data: `device_map` maps module paths and tensor names to devices (a name goes to
the device of its longest dotted prefix). `materialize_module(module, device=plan)` accepts it.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ..errors import MaterializationError
from ..inspection.census import PARAMETER, Census, take_census
from ..naming import parent_of
from ..replay.replay import Progress
from ..replay.rng import RngMode
from ..replay.routing import parse_device

Size = int | str
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
TABLE_COLUMNS = ["device", "budget_bytes", "planned_bytes", "free_bytes", "entries"]


class DevicePlanError(ValueError):
    """A budget cannot be read, or some part of the module fits on no device (names it and its bytes)."""


def parse_size(value: Size) -> int:
    """Bytes from an int or a string such as "20GB" (10**9 bytes), "16GiB" (2**30 bytes), "512MB"."""
    if isinstance(value, bool):
        raise DevicePlanError(f"cannot read size {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise DevicePlanError(f"a size cannot be negative, got {value}")
        return value
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if match is None or match.group(2).upper() not in _UNITS:
        raise DevicePlanError(
            f"cannot read size {value!r}: use bytes (an int) or a string like '20GB', '16GiB', '512MB'"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


@dataclass(eq=False)
class _Unit:
    """One thing to place: a module path (its whole subtree) or one tensor name of a split module."""

    name: str
    module: nn.Module | None  # None for a tensor
    entries: list[int]  # indices into Census.tensors


@dataclass(frozen=True, repr=False)
class MemoryPlan:
    """Where each part of a module goes.

    `device_map`: module path or tensor name → device string, in module order ("" is the whole
    module); `table`: one row per device with its budget, the bytes planned onto it, what is left
    and how many `device_map` entries point to it.
    """

    device_map: dict[str, str]
    table: pd.DataFrame
    _root: Callable[[], nn.Module | None] = field(repr=False)
    world_size: int = 1  # >1: bytes are one rank's FSDP2 shards (see plan_devices)

    def device_for(self, name: str) -> str:
        """The device of a tensor or module path (relative to the planned module)."""
        probe = name
        while True:
            if probe in self.device_map:
                return self.device_map[probe]
            if not probe:
                raise KeyError(f"{name!r} is not covered by this plan")
            probe = parent_of(probe)

    def resolver(self, module: nn.Module) -> Callable[[str], str]:
        """For `materialize_module`: names relative to `module` (the planned module or a submodule of
        it) → device. Raises MaterializationError for a module outside the planned one."""
        if self.world_size != 1:
            raise MaterializationError(
                f"this plan counts one rank's FSDP2 shards over {self.world_size} ranks; materialize "
                "with explorer.distributed.fully_shard_deferred on each rank, not materialize_module"
            )
        root = self._root()
        if root is None:
            raise MaterializationError("the module this plan was made for no longer exists")
        for path, candidate in root.named_modules(remove_duplicate=False):
            if candidate is module:
                prefix = f"{path}." if path else ""
                return lambda name: self.device_for(prefix + name)
        raise MaterializationError(
            f"this plan was made for a {type(root).__name__}; the {type(module).__name__} given is neither "
            "it nor one of its submodules"
        )

    def materialize(self, module: nn.Module, *, rng: RngMode = "eager", progress: Progress | None = None) -> nn.Module:
        """`materialize_module(module, device=self, rng=rng, progress=progress)`."""
        from ..replay.materialize import materialize_module

        return materialize_module(module, device=self, rng=rng, progress=progress)

    def _repr_html_(self) -> str:
        """Rich display in notebooks (the text repr stays for terminals)."""
        from ..render.rich import memory_plan_html  # render reads this package: imported when displayed

        return memory_plan_html(self)

    def __repr__(self) -> str:
        per_rank = f", per rank of {self.world_size}" if self.world_size != 1 else ""
        lines = [f"MemoryPlan ({len(self.device_map)} entries{per_rank})"]
        for row in self.table.itertuples():
            lines.append(f"  {row.device}: {row.planned_bytes:,} of {row.budget_bytes:,} bytes")
        return "\n".join(lines)


class _Planner:
    """The greedy placement over one census (see the module docstring)."""

    def __init__(
        self, census: Census, devices: list[str], budgets: list[int], no_split: Iterable, storage_bytes: list[int]
    ) -> None:
        self.census = census
        self.storage_bytes = storage_bytes
        self.devices = devices
        self.remaining = dict(zip(devices, budgets))
        self.no_split = {c if isinstance(c, str) else c.__name__ for c in no_split}
        self.under: dict[str, list[int]] = {path: [] for path, _ in census.modules}
        for index, entry in enumerate(census.tensors):
            path = entry.module
            while True:
                self.under[path].append(index)
                if not path:
                    break
                path = parent_of(path)
        self.owner: list[_Unit | None] = [None] * len(census.tensors)  # pending unit holding each entry
        self.queue: list[_Unit] = []
        self.placed: dict[str, str] = {}  # unit name → device
        self.split: dict[str, list[str]] = {}  # split module path → its units' names, in order
        self.current = 0

    def _pending(self, unit: _Unit) -> _Unit:
        for index in unit.entries:
            self.owner[index] = unit
        return unit

    def _subunits(self, unit: _Unit) -> list[_Unit]:
        prefix = f"{unit.name}." if unit.name else ""
        module = unit.module
        assert module is not None  # _split runs on _splittable units, which hold a module
        tensors = self.census.tensors
        direct = {tensors[i].name: i for i in unit.entries if tensors[i].module == unit.name}
        units = [
            _Unit(prefix + key, None, [direct[prefix + key]])
            for key, p in module._parameters.items()
            if p is not None and prefix + key in direct
        ]
        units += [
            _Unit(prefix + name, child, self.under.get(prefix + name, []))
            for name, child in module._modules.items()
            if child is not None
        ]
        units += [
            _Unit(prefix + key, None, [direct[prefix + key]])
            for key, b in module._buffers.items()
            if b is not None and prefix + key in direct
        ]
        return units

    def _splittable(self, unit: _Unit) -> bool:
        return (
            unit.module is not None and bool(unit.module._modules) and type(unit.module).__name__ not in self.no_split
        )

    def _split(self, unit: _Unit) -> None:
        subunits = [self._pending(u) for u in self._subunits(unit)]
        self.split[unit.name] = [u.name for u in subunits]
        position = next(i for i, u in enumerate(self.queue) if u is unit)
        self.queue[position : position + 1] = subunits

    def _group(self, unit: _Unit) -> list[_Unit]:
        """`unit` and every pending unit holding a storage it holds, transitively."""
        group, seen, stack = [unit], {id(unit)}, [unit]
        tensors, storages = self.census.tensors, self.census.storages
        while stack:
            for index in stack.pop().entries:
                for other in storages[tensors[index].storage].names:
                    holder = self.owner[other]
                    if holder is not None and id(holder) not in seen:
                        seen.add(id(holder))
                        group.append(holder)
                        stack.append(holder)
        return group

    def _bytes(self, units: list[_Unit]) -> int:
        tensors = self.census.tensors
        sids = {tensors[i].storage for unit in units for i in unit.entries}
        return sum(self.storage_bytes[sid] for sid in sids)

    def _place(self, group: list[_Unit], device: str, size: int) -> None:
        self.remaining[device] -= size
        for unit in group:
            self.placed[unit.name] = device
            for index in unit.entries:
                self.owner[index] = None
            self.queue.remove(unit)

    def run(self, root: nn.Module) -> None:
        self.queue = [self._pending(_Unit("", root, list(range(len(self.census.tensors)))))]
        while self.queue:
            unit = self.queue[0]
            group = self._group(unit)
            size = self._bytes(group)
            device = self.devices[self.current]
            if size <= self.remaining[device]:
                self._place(group, device, size)
                continue
            partner = next((p for p in group[1:] if self._splittable(p)), None)
            if partner is not None and self._bytes([unit]) <= self.remaining[device]:
                self._split(partner)
            elif self._splittable(unit):
                self._split(unit)
            elif self.current + 1 < len(self.devices):
                self.current += 1
            else:
                names = " + ".join(repr(u.name or "<root>") for u in group)
                alone = unit.module is not None and len(group) == 1
                what = f"{names} ({type(unit.module).__name__})" if alone else names
                left = ", ".join(f"{d}: {self.remaining[d]:,}" for d in self.devices)
                raise DevicePlanError(
                    f"{what} needs {size:,} bytes{' (tied tensors stay together)' if len(group) > 1 else ''} "
                    f"and fits on no device; bytes left: {left}"
                )

    def device_map(self) -> dict[str, str]:
        """Placed units in module order; a split module whose units all went to one device is one entry."""

        def collect(name: str) -> list[tuple[str, str]]:
            if name not in self.split:
                return [(name, self.placed[name])]
            items = [item for child in self.split[name] for item in collect(child)]
            devices = {device for _, device in items}
            return [(name, devices.pop())] if len(devices) == 1 else items

        return dict(collect(""))


def per_rank_storage_bytes(census: Census, world_size: int) -> list[int]:
    """Bytes one rank holds of each storage when FSDP2 shards every parameter along dim 0 over
    `world_size` ranks: ceil(rows / world_size) rows of it (FSDP2 pads every rank's shard to that
    size), a tied parameter once; buffers and 0-d parameters whole (replicated)."""
    sizes = [record.nbytes for record in census.storages]
    if world_size == 1:
        return sizes
    shards: dict[int, dict[tuple, int]] = {}
    for entry in census.tensors:
        tensor = entry.tensor
        if entry.kind != PARAMETER or is_lazy(tensor) or tensor.dim() == 0:
            continue
        rows = tensor.shape[0]
        row_bytes = (tensor.numel() // rows) * tensor.element_size() if rows else 0
        shards.setdefault(entry.storage, {})[entry.identity] = -(-rows // world_size) * row_bytes
    for sid, parameters in shards.items():
        sizes[sid] = sum(parameters.values())
    return sizes


def plan_devices(
    module: nn.Module,
    budgets: Mapping[str | int | torch.device, Size],
    *,
    no_split: Iterable = (),
    world_size: int = 1,
) -> MemoryPlan:
    """Assign whole submodules of `module` to devices in order, within `budgets`.

    `budgets` maps devices, in the order to fill them, to byte budgets (an int, or "20GB", "16GiB");
    an int key is a CUDA index. `no_split` lists module classes (or class names) never split across
    devices, e.g. decoder layers. Works on deferred, partly materialized and eager modules alike and
    changes nothing. Returns a MemoryPlan that `materialize_module(module, device=plan)` accepts.

    With `world_size` > 1 the budgets are one rank's and sizes count what FSDP2 gives each rank
    (`explorer.distributed.fully_shard_deferred`): parameters as padded dim-0 shards, buffers whole.
    The plan then answers "does it fit on that many ranks, and where", and its `table` gives each
    rank's bytes exactly; it is not a device map for `materialize_module`.

    Raises DevicePlanError for an unreadable budget or device, and when a unit that cannot be split
    (a module without children or of a `no_split` class, a tensor, or a group of tied ones) fits
    on no remaining device, naming it and its bytes.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"explorer.plan_devices expects an nn.Module, got {type(module).__name__}")
    if not budgets:
        raise DevicePlanError("budgets is empty: give at least one device and its size, e.g. {'cpu': '64GB'}")
    devices: list[str] = []
    sizes: list[int] = []
    for key, value in budgets.items():
        try:
            device = str(parse_device(f"cuda:{key}" if isinstance(key, int) else key))
        except MaterializationError as error:
            raise DevicePlanError(str(error)) from None
        if device == "cuda":
            device = "cuda:0"
        if device in devices:
            raise DevicePlanError(f"device {device} appears twice in budgets")
        devices.append(device)
        try:
            sizes.append(parse_size(value))
        except DevicePlanError as error:
            raise DevicePlanError(f"budget for {device}: {error}") from None

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise DevicePlanError(f"world_size must be a positive int, got {world_size!r}")
    census = take_census(module)
    planner = _Planner(census, devices, sizes, no_split, per_rank_storage_bytes(census, world_size))
    planner.run(module)
    device_map = planner.device_map()
    planned = {device: budget - planner.remaining[device] for device, budget in zip(devices, sizes)}
    entries = {device: sum(1 for d in device_map.values() if d == device) for device in devices}
    table = pd.DataFrame(
        {
            "device": devices,
            "budget_bytes": sizes,
            "planned_bytes": [planned[d] for d in devices],
            "free_bytes": [planner.remaining[d] for d in devices],
            "entries": [entries[d] for d in devices],
        },
        columns=TABLE_COLUMNS,
    )
    return MemoryPlan(device_map, table, weakref.ref(module), world_size)
