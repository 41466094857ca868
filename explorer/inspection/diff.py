"""What differs between two inspections: modules and tensors added, removed or changed.

Built for "the model before and after a config change" and "Hugging Face's model against a
refactor": both sides are usually deferred, so only metadata is compared (shape, stride, storage
offset, dtype, device, Parameter or buffer, tie group, module class), never values. Names are
matched exactly; a renamed tensor reads as one removal and one addition.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

# Tensor columns compared name by name; "tied_with" compares the tie group as a sorted tuple.
TENSOR_FIELDS = ["kind", "shape", "stride", "storage_offset", "dtype", "device", "tied_with"]
CHANGE_COLUMNS = ["name", "field", "before", "after"]


@dataclass(frozen=True)
class InspectionDiff:
    """Differences from `before` to `after`, as tables.

    - `modules`: one row per module path added, removed, or whose class changed
      (columns: name, change ∈ {added, removed, class}, before, after);
    - `tensors`: one row per tensor name added or removed (name, change, shape, dtype, kind), and
      one row per changed field of a tensor present in both (name, change="changed", field,
      before, after) — see `tensor_changes`.
    """

    modules: pd.DataFrame
    tensors: pd.DataFrame
    tensor_changes: pd.DataFrame

    @property
    def empty(self) -> bool:
        return self.modules.empty and self.tensors.empty and self.tensor_changes.empty

    def summary(self) -> str:
        """One line: counts of what was added, removed and changed."""
        if self.empty:
            return "no differences in modules or tensor metadata"
        counts = []

        def count(frame: pd.DataFrame, change: str) -> int:
            return int((frame["change"] == change).sum()) if not frame.empty else 0

        def plural(n: int, noun: str) -> str:
            return f"{n} {noun}{'' if n == 1 else 's'}"

        for change, verb in (("added", "added"), ("removed", "removed"), ("class", "changed class")):
            if count(self.modules, change):
                counts.append(f"{plural(count(self.modules, change), 'module')} {verb}")
        for change in ("added", "removed"):
            if count(self.tensors, change):
                counts.append(f"{plural(count(self.tensors, change), 'tensor')} {change}")
        changed = self.tensor_changes["name"].nunique() if not self.tensor_changes.empty else 0
        if changed:
            fields = ", ".join(sorted(self.tensor_changes["field"].unique()))
            counts.append(f"{plural(changed, 'tensor')} changed ({fields})")
        return "; ".join(counts)

    def __repr__(self) -> str:
        return self.summary()


def _as_key(value: object) -> object:
    return tuple(sorted(value)) if isinstance(value, list) else value


def diff_inspections(
    before_modules: pd.DataFrame, before_tensors: pd.DataFrame, after_modules: pd.DataFrame, after_tensors: pd.DataFrame
) -> InspectionDiff:
    """The differences between two inspections' modules and tensors tables (see `InspectionDiff`)."""
    old_classes = dict(zip(before_modules["name"], before_modules["class"]))
    new_classes = dict(zip(after_modules["name"], after_modules["class"]))
    module_rows = [
        {"name": n, "change": "removed", "before": old_classes[n], "after": ""}
        for n in old_classes
        if n not in new_classes
    ]
    module_rows += [
        {"name": n, "change": "added", "before": "", "after": new_classes[n]}
        for n in new_classes
        if n not in old_classes
    ]
    module_rows += [
        {"name": n, "change": "class", "before": old_classes[n], "after": new_classes[n]}
        for n in new_classes
        if n in old_classes and old_classes[n] != new_classes[n]
    ]

    old = before_tensors.set_index("name", drop=False)
    new = after_tensors.set_index("name", drop=False)
    presence = [
        {
            "name": n,
            "change": "removed",
            "shape": old.at[n, "shape"],
            "dtype": old.at[n, "dtype"],
            "kind": old.at[n, "kind"],
        }
        for n in old.index
        if n not in new.index
    ]
    presence += [
        {
            "name": n,
            "change": "added",
            "shape": new.at[n, "shape"],
            "dtype": new.at[n, "dtype"],
            "kind": new.at[n, "kind"],
        }
        for n in new.index
        if n not in old.index
    ]
    changes = []
    for name in new.index:
        if name not in old.index:
            continue
        for field in TENSOR_FIELDS:
            a, b = _as_key(old.at[name, field]), _as_key(new.at[name, field])
            if a != b:
                changes.append({"name": name, "field": field, "before": a, "after": b})
    return InspectionDiff(
        modules=pd.DataFrame(module_rows, columns=["name", "change", "before", "after"]),
        tensors=pd.DataFrame(presence, columns=["name", "change", "shape", "dtype", "kind"]),
        tensor_changes=pd.DataFrame(changes, columns=CHANGE_COLUMNS),
    )
