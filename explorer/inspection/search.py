"""Search one inspection: module paths and classes, tensor names, shapes and dtypes, op names.

`TextIndex` turns the tables into text once (shapes as "(4096, 4096)"), one column per field so a
regular expression's anchors apply to each field, and each query is a handful of vectorised
case-insensitive `str.contains` calls: a 70B architecture (about 900 modules, 720
tensors, 3,000 ops) answers in milliseconds. A tensor also matches through its module, and a
module through the tensors it holds, so "layers.17.mlp" finds the module, its three weights and
their ops at once.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import pandas as pd

from ..naming import parent_path


class SearchError(ValueError):
    """The pattern is not a valid regular expression (the message says where)."""


@dataclass(frozen=True)
class SearchResult:
    """What matched `pattern`, each list in table order.

    `modules`: module paths whose path or class matched; `tensors`: tensor names whose name,
    shape, stride, dtype or device matched, or whose module matched; `ops`: "<graph>:<index>" keys
    of ops whose name matched, or that ran for a matched module. `reveal`: every module on the way
    down to a match (what a tree expands to show them).
    """

    pattern: str
    regex: bool
    modules: list[str] = field(default_factory=list)
    tensors: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    reveal: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.modules or self.tensors or self.ops)

    def counts_text(self) -> str:
        """The counts line: "3 modules · 12 tensors · 40 ops" (or "no match")."""
        if self.empty:
            return "no match"
        parts = [(len(self.modules), "module"), (len(self.tensors), "tensor"), (len(self.ops), "op")]
        return " · ".join(f"{count:,} {noun}{'' if count == 1 else 's'}" for count, noun in parts)

    def targets(self) -> list[tuple[str, str]]:
        """(kind, key) in the order Enter walks them: modules, then tensors, then ops."""
        return (
            [("module", m) for m in self.modules]
            + [("tensor", t) for t in self.tensors]
            + [("op", o) for o in self.ops]
        )


def _shape_text(values: pd.Series) -> pd.Series:
    return values.map(
        lambda shape: (
            "(" + ", ".join(str(v) for v in shape) + ("," if len(shape) == 1 else "") + ")"
            if isinstance(shape, tuple)
            else ""
        )
    )


class TextIndex:
    """The searchable text of one inspection's tables, built once."""

    def __init__(self, tensors: pd.DataFrame, modules: pd.DataFrame, ops: pd.DataFrame) -> None:
        self.module_paths = modules["name"].tolist()
        self.module_fields = [modules["name"].astype(str), modules["class"].astype(str)]
        self.tensor_names = tensors["name"].tolist()
        self.tensor_modules = tensors["module"].tolist()
        self.tensor_fields = [
            tensors["name"].astype(str),
            _shape_text(tensors["shape"]),
            _shape_text(tensors["stride"]),
            tensors["dtype"].astype(str),
            tensors["device"].astype(str),
        ]
        self.op_keys = (ops["graph"].astype(str) + ":" + ops["index"].astype(str)).tolist()
        self.op_fields = [ops["op"].astype(str)]
        self.op_modules = ops["modules"].tolist()

    def search(self, pattern: str, *, regex: bool = False) -> SearchResult:
        """Case-insensitive substring (or `regex`) match; an empty pattern matches nothing.

        Raises SearchError for a regular expression that does not compile.
        """
        query = pattern.strip()
        if not query:
            return SearchResult(pattern, regex)
        if regex:
            try:
                re.compile(query)
            except re.error as error:
                raise SearchError(f"invalid regular expression {query!r}: {error}") from None

        def hits(fields: list[pd.Series]) -> list[bool]:
            if not len(fields[0]):
                return []
            with warnings.catch_warnings():  # pandas warns about capture groups, which are fine here
                warnings.simplefilter("ignore", UserWarning)
                found = [field.str.contains(query, case=False, regex=regex) for field in fields]
            return pd.concat(found, axis=1).any(axis=1).tolist()

        modules = [path for path, hit in zip(self.module_paths, hits(self.module_fields)) if hit]
        matched_modules = set(modules)
        tensors = [
            name
            for name, owner, hit in zip(self.tensor_names, self.tensor_modules, hits(self.tensor_fields))
            if hit or owner in matched_modules
        ]
        ops = [
            key
            for key, hit, owners in zip(self.op_keys, hits(self.op_fields), self.op_modules)
            if hit or (matched_modules and not matched_modules.isdisjoint(owners))
        ]
        found = set(tensors)
        owners = matched_modules | {
            owner for name, owner in zip(self.tensor_names, self.tensor_modules) if name in found
        }
        return SearchResult(pattern, regex, modules, tensors, ops, _ancestors_of(owners, self.module_paths))


def _ancestors_of(paths: set[str], order: list[str]) -> list[str]:
    """Every strict ancestor of `paths`, in tree order: what a tree expands to show them."""
    wanted: set[str] = set()
    for path in paths:
        parent = parent_path(path)
        while parent is not None and parent not in wanted:
            wanted.add(parent)
            parent = parent_path(parent)
    return [path for path in order if path in wanted]
