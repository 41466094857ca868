"""`inspect(module)`: the four tables and the summary, built from one census of the module."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pandas as pd
from torch import nn

from .census import take_census
from .modules import modules_table
from .ops import ops_table
from .search import SearchResult, TextIndex
from .storages import storages_table
from .summary import summary_text
from .tensors import tensors_table


@dataclass(frozen=True, repr=False)
class Inspection:
    """What a module holds and how it was built, as four pandas tables taken at one moment.

    `tensors`: one row per parameter/buffer name; `modules`: one row per module path; `ops`: one
    row per recorded op; `storages`: one row per piece of memory. Each table's builder documents
    its columns (`explorer.inspection.tensors_table`, ...). The tables are snapshots: materializing
    later does not update them.
    """

    root_class: str
    tensors: pd.DataFrame
    modules: pd.DataFrame
    ops: pd.DataFrame
    storages: pd.DataFrame

    def summary(self) -> str:
        """A few lines for the terminal: sizes, fake/materialized/real bytes, dtypes, devices, ops."""
        return summary_text(self.root_class, self.tensors, self.modules, self.ops, self.storages)

    def __repr__(self) -> str:
        return self.summary()

    @functools.cached_property
    def text_index(self) -> TextIndex:
        """The tables as searchable text, built on the first search."""
        return TextIndex(self.tensors, self.modules, self.ops)

    def search(self, pattern: str, *, regex: bool = False) -> SearchResult:
        """Modules (path, class), tensors (name, shape, stride, dtype, device) and ops (name) matching
        `pattern`: a case-insensitive substring, or a regular expression with `regex=True`
        (SearchError when it does not compile). A module's tensors and ops match with it."""
        return self.text_index.search(pattern, regex=regex)


def inspect(module: nn.Module) -> Inspection:
    """Tables describing `module`: deferred (fake), partly materialized, or ordinary eager.

    Read-only: records nothing, materializes nothing, and leaves every tensor, module and recorded
    graph as it was. Raises TypeError when `module` is not an `nn.Module`.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"explorer.inspect expects an nn.Module, got {type(module).__name__}")
    census = take_census(module)
    return Inspection(
        root_class=type(module).__name__,
        tensors=tensors_table(census),
        modules=modules_table(census),
        ops=ops_table(census),
        storages=storages_table(census),
    )
