"""`init_report(module)`: what each parameter and buffer's initialization is, and what is wrong with it.

The recording holds every write that made each tensor's value; `init_writes` reads them (note [Init
audit: which write counts]) and this module lays the answers out as one table, one row per name,
and raises the flags people debugging a training start look for. Nothing is materialized or
recorded into the module's graph; tensors that already have memory are measured.
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from .._torch_compat.dispatch import metadata_access
from ..graph import InitGraph
from ..naming import dtype_name
from ..record.fake import handle_of, is_fake
from ..replay.provenance import origin_of
from .init_distributions import UNINITIALIZED, UNRECORDED, Distribution
from .init_flags import severity_of, write_seconds_per_byte
from .init_measure import Measured, disagrees, measure
from .init_reinit import ReinitFunction, named_slots, record_reinit
from .init_writes import GraphAudit, TensorInit

INIT_COLUMNS = [
    "name",
    "module",
    "module_class",
    "kind",
    "shape",
    "dtype",
    "numel",
    "state",
    "init",
    "family",
    "params",
    "mean",
    "std",
    "writes",
    "dead_writes",
    "dead_bytes",
    "uninitialized",
    "source",
    "role",
    "flags",
    "severity",
    "wasted_bytes",
    "wasted_s",
    "measured_mean",
    "measured_std",
    "measured_min",
    "measured_max",
    "nan_count",
    "inf_count",
]
REINIT_COLUMNS = ["reinit", "reinit_source"]
_INDEX = re.compile(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)")
_OUTLIER_GROUP = 3  # a role needs this many names before a differing one is an outlier


def role_of(name: str) -> str:
    """`model.layers.7.mlp.up_proj.weight` → `model.layers.*.mlp.up_proj.weight`: the name with
    every index of a repeated module (a number between dots) replaced by `*`."""
    return _INDEX.sub("*", name)


def init_report(module: nn.Module, reinit: ReinitFunction | None = None) -> pd.DataFrame:
    """One row per parameter and buffer name of `module`: its initialization and what is wrong with it.

    Columns (`INIT_COLUMNS`, then `REINIT_COLUMNS` with `reinit`):
    - `name`, `module`, `module_class`, `kind` (parameter / buffer / non-persistent buffer), `shape`,
      `dtype`, `numel`, `state` (fake, materialized, real);
    - `init`: what determines the final value, in words (`normal(mean=0.0, std=0.02)`,
      `uniform(-0.25, 0.25)`, `constant(1.0)`, `zeros`, `eye`, `orthogonal(gain=1.0)`,
      `copied from checkpoint f.safetensors:key`, `computed (arange, pow, ...)`, `uninitialized`;
      several parts: `normal(...); 4 elements: zeros`), `family` its kind (`Family`) and `params` the
      family's parameters (normal: mean, std; uniform: low, high; trunc_normal: mean, std, a, b;
      constant: value; followed by ("*", factor) / ("+", offset) pairs for later scalings);
    - `mean`, `std`: one element's expected value and population standard deviation, from the
      recorded ops (NaN where no formula applies);
    - `writes`: writes touching its bytes; `dead_writes`: those whose every byte a later write
      overwrote unread, and `dead_bytes` what they write at replay (rng="fast" skips them; "eager"
      still jumps over their draws); `uninitialized`: elements no write covers after an allocation
      that leaves memory as it was (`torch.empty`), through views too;
    - `source`: the line of the write that determines most elements; `role`: the name with indices
      of repeated modules as `*`;
    - `flags`: a list of `FLAGS` words: "uninitialized" (some or all elements), "overwritten" (dead
      writes), "outlier" (an init differing from most names of its role, among 3 or more),
      "constant matrix" (a parameter of 2+ dims whose elements are all one nonzero value: nothing
      breaks the symmetry of its rows; zeros are a deliberate init, as LoRA's B), "nan/inf" and
      "measured differs" (materialized tensors whose values are further from `mean`/`std` than
      sampling error allows), and with `reinit`
      "uninitialized after reinit" and "reinit differs" (`FLAGS`, explorer/analysis/init_flags.py);
    - `severity`: "defect" when a flag is one (wrong or irreproducible values), "waste" when every
      flag is ("overwritten": right values, lost work), None without flags (`SEVERITY` says why
      each flag is which);
    - `wasted_bytes`: the bytes the dead writes write (their views' sizes in the recorded graph), 0
      without any; a tensor tied under several names counts them under its first name only, so the
      column sums to the model's waste; `wasted_s`: an *estimate* of their time, `wasted_bytes` times
      the seconds per byte of a `uniform_` draw into a 16 MiB float32 CPU tensor, measured once per
      process (`write_seconds_per_byte`);
    - `measured_*`, `nan_count`, `inf_count`: tensors with memory (materialized or real), else NaN;
    - with `reinit`: `reinit` (what `reinit(module)` run after `to_empty()` gives, same words) and
      `reinit_source` (the line of `reinit`'s write, or "never written by <fn> (file:line)").

    `reinit` is recorded on an empty copy (explorer/analysis/init_reinit.py): the module and its
    recording are unchanged; errors it raises propagate with a note. Raises TypeError when `module`
    is not an nn.Module.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"explorer.init_report expects an nn.Module, got {type(module).__name__}")
    with _collector_paused():
        rows = _rows(module)
    table = pd.DataFrame(rows, columns=INIT_COLUMNS + ["_key"])
    _flag_outliers(table)
    if reinit is not None:
        _compare_reinit(table, module, reinit)
    table["severity"] = pd.Series([severity_of(flags) for flags in table["flags"]], index=table.index, dtype=object)
    wasted = table["wasted_bytes"].sum()
    table["wasted_s"] = table["wasted_bytes"] * (write_seconds_per_byte() if wasted else 0.0)
    return table.drop(columns=["_key"])


class _Audits:
    """One `GraphAudit` per recorded graph, and each recorded tensor's `TensorInit` once."""

    def __init__(self) -> None:
        self.audits: dict[int, GraphAudit] = {}
        self.inits: dict[tuple[int, int], TensorInit] = {}

    def init_of(self, graph: InitGraph, tid: int) -> TensorInit:
        key = (id(graph), tid)
        init = self.inits.get(key)
        if init is None:
            audit = self.audits.get(id(graph))
            if audit is None:
                audit = self.audits[id(graph)] = GraphAudit(graph)
            init = self.inits[key] = audit.tensor_init(tid)
        return init


def _rows(module: nn.Module) -> list[dict]:
    audits, rows = _Audits(), []
    measured_cache: dict[int, tuple[Any, ...]] = {}
    wasted_once: set[tuple[int, int | None]] = set()  # a tied tensor's dead writes, counted under its first name
    for name, path, owner, kind, tensor, _ in named_slots(module):
        with metadata_access():  # lazy parameters refuse metadata reads
            shape, dtype, device_type = tuple(tensor.shape), tensor.dtype, tensor.device.type
        graph, tid, state = _recorded(tensor)
        init = audits.init_of(graph, tid) if graph is not None and tid is not None else None  # both or neither
        distribution = init.distribution if init is not None else UNRECORDED
        flags = _recorded_flags(init, kind, shape, distribution)
        wasted_bytes = 0
        if init is not None and (id(graph), tid) not in wasted_once:
            wasted_once.add((id(graph), tid))
            wasted_bytes = init.dead_bytes
        measured = (math.nan,) * 4 + (pd.NA, pd.NA)
        if state != "fake" and device_type != "meta":  # a meta tensor (materialized to "meta") has no values
            measured = measured_cache.get(id(tensor)) or measured_cache.setdefault(id(tensor), tuple(measure(tensor)))
            flags += _measured_flags(Measured(*measured), init, distribution, math.prod(shape), dtype)
        rows.append(
            {
                "name": name,
                "module": path,
                "module_class": type(owner).__name__,
                "kind": kind,
                "shape": shape,
                "dtype": dtype_name(dtype),
                "numel": math.prod(shape),
                "state": state,
                "init": distribution.text,
                "family": distribution.family,
                "params": distribution.params,
                "mean": distribution.mean,
                "std": distribution.std,
                "writes": init.writes if init else pd.NA,
                "dead_writes": init.dead_writes if init else pd.NA,
                "dead_bytes": init.dead_bytes if init else pd.NA,
                "uninitialized": init.uninitialized if init else pd.NA,
                "source": str(init.source) if init is not None and init.source is not None else None,
                "role": role_of(name),
                "flags": flags,
                "wasted_bytes": wasted_bytes,
                "measured_mean": measured[0],
                "measured_std": measured[1],
                "measured_min": measured[2],
                "measured_max": measured[3],
                "nan_count": measured[4],
                "inf_count": measured[5],
                "_key": distribution.key,
            }
        )
    return rows


def _recorded_flags(
    init: TensorInit | None, kind: str, shape: tuple[int, ...], distribution: Distribution
) -> list[str]:
    """The flags the recording alone raises: uninitialized, overwritten, constant matrix."""
    flags = []
    if init is not None and init.uninitialized:
        flags.append("uninitialized")
    if init is not None and init.dead_writes:
        flags.append("overwritten")
    # zeros are deliberate (LoRA's B, zero-initialized output projections, adaLN-Zero): the random
    # matrix beside them breaks the symmetry
    if (
        kind == "parameter"
        and len(shape) >= 2
        and math.prod(shape) > 1
        and distribution.std == 0
        and distribution.mean != 0
    ):
        flags.append("constant matrix")
    return flags


def _measured_flags(
    measured: Measured, init: TensorInit | None, distribution: Distribution, count: int, dtype: torch.dtype
) -> list[str]:
    """The flags a tensor with memory raises: nan/inf, and a measurement the expectation rules out."""
    flags = ["nan/inf"] if measured.nan or measured.inf else []
    if (
        init is not None
        and not init.uninitialized
        and disagrees(measured, distribution.mean, distribution.std, count, distribution.random, dtype)
    ):
        flags.append("measured differs")
    return flags


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The audit allocates many small acyclic objects; a full collection triggered meanwhile would
    scan the whole recorded graph of a large model (a 70B graph: half a second). Restored on exit."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _recorded(tensor: torch.Tensor) -> tuple[InitGraph | None, int | None, str]:
    """The recorded graph and tensor id behind a slot, and its state (fake, materialized, real)."""
    handle = handle_of(tensor)
    if handle is not None:
        return handle.graph, handle.tensor_id, "fake"
    if is_fake(tensor):
        return None, None, "fake"
    origin = origin_of(tensor)
    if origin is None:
        return None, None, "real"
    graph = origin.graph()
    return graph, (origin.tensor_id if graph is not None else None), "materialized"


def _flag_outliers(table: pd.DataFrame) -> None:
    """Add "outlier" to names whose init differs from the majority of their role (3+ names)."""
    if table.empty:
        return
    keys = table["_key"].map(repr)
    sizes = table.groupby("role")["role"].transform("size")
    counts = keys.groupby([table["role"], keys]).transform("size")
    majority = counts.groupby(table["role"]).transform("max")
    outliers = (sizes >= _OUTLIER_GROUP) & (counts < majority) & (majority * 2 > sizes)
    for position in np.flatnonzero(outliers.to_numpy()):
        table.at[table.index[position], "flags"].append("outlier")


def _compare_reinit(table: pd.DataFrame, module: nn.Module, reinit: Callable) -> None:
    """Add the `reinit` columns and flags: what `reinit` gives each name after `to_empty()`."""
    recording = record_reinit(module, reinit)
    audit = GraphAudit(recording.graph)
    texts: list[str] = []
    sources: list[str | None] = []
    for position, name in enumerate(table["name"]):
        tid = recording.tensor_ids.get(name)
        flags = table.at[table.index[position], "flags"]
        if tid is None:
            texts.append(UNRECORDED.text)
            sources.append(None)
            continue
        init = audit.tensor_init(tid)
        texts.append(init.distribution.text)
        if init.source is not None and init.distribution is not UNINITIALIZED:
            sources.append(str(init.source))
        else:
            sources.append(f"never written by {recording.function}")
        if init.uninitialized:
            flags.append("uninitialized after reinit")
        elif init.distribution.key != table.at[table.index[position], "_key"] and not _both_computed(
            init.distribution.family, table.at[table.index[position], "family"]
        ):
            flags.append("reinit differs")
    table["reinit"] = texts
    table["reinit_source"] = sources


def _both_computed(first: str, second: str) -> bool:
    """Values computed by ops on both sides have no comparable parameters: not "differs"."""
    return first == "computed" and second == "computed"
