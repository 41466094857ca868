"""`check_checkpoint`: will this checkpoint load into this module? Answered from headers only.

The module side is `module.state_dict(keep_vars=True)`: the names loading uses (persistent buffers
only, state-dict hooks applied), with shapes and dtypes read off the tensors' metadata, so a
deferred module stays deferred and nothing is materialized or recorded. The checkpoint side is
`checkpoint_headers.read_headers`: safetensors headers, an index and its shards' headers, a
`torch.save` file loaded onto the meta device, or DCP metadata; no tensor data is read.

Ties come from the census (`tied_with`: the same tensor object, or a materialized tensor and the
fakes of the same recorded tensor), not from shared storage, so two views of one storage with
different shapes are not a tie. A tied name absent from the checkpoint while a partner is present
is not missing: loading the partner fills it (Hugging Face saves tied weights once).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .._torch_compat.dispatch import metadata_access
from ..checkpoint_headers import CheckpointEntry, CheckpointHeaders, loads_into, read_headers
from ..inspection.census import take_census
from ..naming import dtype_name
from ..record.hub_open import hub_checkpoint

Problem = Literal["missing", "unexpected", "shape", "dtype", "tie"]
MISMATCH_COLUMNS = ["key", "kind", "module", "checkpoint", "file"]
TIE_COLUMNS = ["keys", "shapes", "dtypes", "files"]
FRAME_COLUMNS = ["problem", "key", "module", "checkpoint", "file"]
NOT_A_TENSOR = "not a tensor"


@dataclass(frozen=True, slots=True)
class _ModuleKey:
    """One state_dict key of the module. Both None: not a tensor (extra state), only its presence is
    checked; shape None: an uninitialized lazy parameter, which takes the checkpoint's shape."""

    shape: tuple[int, ...] | None
    dtype: str | None


@dataclass(frozen=True, repr=False)
class CheckpointCheck:
    """What stands between a checkpoint and a module, from headers only.

    - `missing`: module keys the checkpoint lacks (module order), except a tied key whose partner it
      holds — those are `filled_by_tie` (loading the partner fills the shared tensor);
    - `unexpected`: checkpoint keys the module does not have (sorted);
    - `mismatches`: one row per key and kind ("shape" or "dtype") where the checkpoint's differs from
      the module's (columns key, kind, module, checkpoint, file; shapes as tuples, dtypes as names);
    - `tie_conflicts`: one row per group of tied module keys the checkpoint stores under several of
      its names with different shapes or dtypes (columns keys, shapes, dtypes, files: tuples, one
      item per stored name), so the shared tensor cannot take them all.

    `ok` is True when nothing is missing or unexpected and there are no shape mismatches or tie
    conflicts. Dtype differences do not count: `load_state_dict` copies into the module's tensors and
    Hugging Face's `from_pretrained` casts, so a float32 checkpoint loads into a bfloat16 module
    (converted on load); they are still listed, as kind "dtype".
    """

    path: str
    headers: CheckpointHeaders = field(repr=False)  # every checkpoint key with its shape, dtype, file
    module_class: str
    module_keys: int
    missing: list[str]
    unexpected: list[str]
    mismatches: pd.DataFrame
    tie_conflicts: pd.DataFrame
    filled_by_tie: list[str] = field(default_factory=list)

    @property
    def format(self) -> str:
        """The checkpoint's format: "safetensors", "torch.save" or "dcp", with ", N shards" when sharded."""
        shards = len(self.headers.files)
        return f"{self.headers.format}, {shards} shards" if self.headers.index is not None else self.headers.format

    @property
    def ok(self) -> bool:
        """Nothing missing or unexpected, no shape mismatch, no tie conflict (dtypes may differ)."""
        return not (
            self.missing or self.unexpected or len(self.tie_conflicts) or (self.mismatches["kind"] == "shape").any()
        )

    def summary(self) -> str:
        """One line: the verdict, the problems counted, what was compared."""
        kinds = self.mismatches["kind"].value_counts()
        counts = [
            (len(self.missing), "missing", "missing"),
            (len(self.unexpected), "unexpected", "unexpected"),
            (int(kinds.get("shape", 0)), "shape mismatch", "shape mismatches"),
            (len(self.tie_conflicts), "tie conflict", "tie conflicts"),
            (
                int(kinds.get("dtype", 0)),
                "dtype difference (converted on load)",
                "dtype differences (converted on load)",
            ),
            (len(self.filled_by_tie), "tied key filled by its partner", "tied keys filled by their partners"),
        ]
        found = ", ".join(f"{n} {one if n == 1 else many}" for n, one, many in counts if n)
        return (
            f"{'ok' if self.ok else 'not ok'}: {found or 'every key matches'} — {self.module_class} "
            f"({self.module_keys} keys) vs {self.path} ({self.format}, {len(self.headers.entries)} keys)"
        )

    def to_frame(self) -> pd.DataFrame:
        """One row per problem and key, what fails the check first: missing, unexpected, shape, tie (a
        row per stored name of the group), then dtype. Columns problem, key, module, checkpoint, file,
        all text ("" where a side has nothing to say)."""
        stored = self.headers.entries
        rows: list[tuple[Problem, str, str, str, str]] = [("missing", key, "", "", "") for key in self.missing]
        rows += [
            ("unexpected", key, "", _describe(stored[key].shape, stored[key].dtype), stored[key].file)
            for key in self.unexpected
        ]
        rows += self._mismatch_rows("shape") + self._tie_rows() + self._mismatch_rows("dtype")
        return pd.DataFrame(rows, columns=FRAME_COLUMNS)

    def _mismatch_rows(self, kind: Problem) -> list[tuple[Problem, str, str, str, str]]:
        chosen = self.mismatches[self.mismatches["kind"] == kind]
        return [(kind, row.key, _text(row.module), _text(row.checkpoint), row.file) for row in chosen.itertuples()]

    def _tie_rows(self) -> list[tuple[Problem, str, str, str, str]]:
        rows: list[tuple[Problem, str, str, str, str]] = []
        for group in self.tie_conflicts.itertuples():
            for key, shape, dtype, file in zip(group.keys, group.shapes, group.dtypes, group.files):
                others = ", ".join(k for k in group.keys if k != key)
                rows.append(("tie", key, f"tied with {others}", _describe(shape, dtype), file))
        return rows

    def _repr_html_(self) -> str:
        """Rich display in notebooks (the text repr stays for terminals)."""
        from ..render.rich import checkpoint_check_html  # render reads this package: imported when displayed

        return checkpoint_check_html(self)

    def __repr__(self) -> str:
        return self.summary()


def _text(value: Any) -> str:
    return str(tuple(value)) if isinstance(value, (tuple, list)) else str(value)


def _describe(shape: tuple[int, ...] | None, dtype: str | None) -> str:
    return NOT_A_TENSOR if shape is None else f"{_text(shape)} {dtype}"


def _module_keys(module: nn.Module) -> dict[str, _ModuleKey]:
    keys: dict[str, _ModuleKey] = {}
    state = module.state_dict(keep_vars=True)  # the tensors themselves: no detach, nothing recorded
    with metadata_access():  # lazy parameters refuse metadata reads
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                keys[key] = _ModuleKey(None, None)
            else:
                keys[key] = _ModuleKey(None if is_lazy(value) else tuple(value.shape), dtype_name(value.dtype))
    return keys


def _tie_groups(module: nn.Module, keys: dict[str, _ModuleKey]) -> list[list[str]]:
    """Groups of two or more state_dict keys holding one tensor (module order)."""
    groups: dict[tuple, list[str]] = {}
    for entry in take_census(module).tensors:
        if entry.name in keys:
            groups.setdefault(entry.identity, []).append(entry.name)
    return [names for names in groups.values() if len(names) > 1]


def _compare_key(key: str, mine: _ModuleKey, stored: CheckpointEntry) -> list[dict]:
    """The mismatch rows of one key both sides hold."""
    if mine.dtype is None:
        return []
    if stored.shape is None:
        return [dict(key=key, kind="shape", module=mine.shape, checkpoint=NOT_A_TENSOR, file=stored.file)]
    rows: list[dict] = []
    if mine.shape is not None and not loads_into(stored.shape, mine.shape):
        rows.append(dict(key=key, kind="shape", module=mine.shape, checkpoint=stored.shape, file=stored.file))
    if stored.dtype != mine.dtype:
        rows.append(dict(key=key, kind="dtype", module=mine.dtype, checkpoint=stored.dtype, file=stored.file))
    return rows


def _tie_conflict(group: list[str], entries: dict[str, CheckpointEntry]) -> dict | None:
    stored = [entries[key] for key in group if key in entries]
    if len({(entry.shape, entry.dtype) for entry in stored}) < 2:
        return None
    return dict(
        keys=tuple(e.key for e in stored),
        shapes=tuple(e.shape for e in stored),
        dtypes=tuple(e.dtype for e in stored),
        files=tuple(e.file for e in stored),
    )


def check_checkpoint(module: nn.Module, path: str | os.PathLike) -> CheckpointCheck:
    """Compare the checkpoint at `path` with `module`'s state_dict, reading headers only.

    `path`: a safetensors file; a directory with `model.safetensors`, a sharded
    `model.safetensors.index.json` (or `pytorch_model.bin[.index.json]`); a `torch.save` file (read
    with `weights_only=True` onto the meta device: pickled code is refused, never run); or a
    `torch.distributed.checkpoint` directory; or a Hub repo as `hub://org/name[@revision][/subfolder]`
    (its shards' headers fetched with range requests). `module` may be deferred, partly materialized or eager;
    nothing about it changes. Returns a `CheckpointCheck` (see it for what counts against `ok`).

    Raises CheckpointError naming the file (and key) when the path is missing, holds no checkpoint,
    a header is cut short or malformed, an index names a shard that is not there, or a pickle holds
    more than tensors and plain containers; TypeError when `module` is not an nn.Module.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"explorer.check_checkpoint expects an nn.Module, got {type(module).__name__}")
    headers = read_headers(hub_checkpoint(path))
    keys = _module_keys(module)
    entries = headers.entries
    filled, conflicts = [], []
    for group in _tie_groups(module, keys):
        if any(key in entries for key in group):
            filled += [key for key in group if key not in entries]
        conflict = _tie_conflict(group, entries)
        if conflict is not None:
            conflicts.append(conflict)
    rows = [row for key, mine in keys.items() if key in entries for row in _compare_key(key, mine, entries[key])]
    return CheckpointCheck(
        path=str(path),
        headers=headers,
        module_class=type(module).__name__,
        module_keys=len(keys),
        missing=[key for key in keys if key not in entries and key not in filled],
        unexpected=sorted(key for key in entries if key not in keys),
        mismatches=pd.DataFrame(rows, columns=MISMATCH_COLUMNS),
        tie_conflicts=pd.DataFrame(conflicts, columns=TIE_COLUMNS),
        filled_by_tie=[key for key in keys if key in filled],
    )
