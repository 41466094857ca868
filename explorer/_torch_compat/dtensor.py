"""DTensor's layout arithmetic: which rows of a global tensor a rank holds.

`compute_local_shape_and_global_offset` lives in `torch.distributed.tensor._utils` on every release
2.11 to 2.15; it is the rule DTensor itself applies, so sharded materialization and DCP saving use it
rather than a copy of its rounding.
"""

from __future__ import annotations

from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

__all__ = ["compute_local_shape_and_global_offset"]
