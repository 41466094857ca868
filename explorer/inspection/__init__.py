"""Inspection: read-only pandas tables of a module's tensors, modules, recorded ops and storages.

census (one pass over the module) → tensors / modules / ops / storages tables → summary text.
"""

from .inspection import Inspection, inspect
from .modules import modules_table
from .ops import op_kind, op_modules, ops_table
from .reads import reads_table
from .search import SearchError, SearchResult, TextIndex
from .storages import storages_table
from .tensors import tensors_table

__all__ = [
    "Inspection",
    "SearchError",
    "SearchResult",
    "TextIndex",
    "inspect",
    "modules_table",
    "op_kind",
    "op_modules",
    "ops_table",
    "reads_table",
    "storages_table",
    "tensors_table",
]
