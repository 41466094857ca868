"""DTensor's layout arithmetic: which rows of a global tensor a rank holds.

`compute_local_shape_and_global_offset` lives in `torch.distributed.tensor._utils` on every release
2.11 to 2.15; it is the rule DTensor itself applies, so sharded materialization and DCP saving use it
rather than a copy of its rounding. `is_strided_shard` names FSDP2's placement for a shard of a
tensor-parallel shard (`_StridedShard`, private on every release 2.11 to 2.15), so the rule's answer
can be trusted for it where this rank's part is one block.
"""

from __future__ import annotations

from torch.distributed.tensor import Placement
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

__all__ = ["compute_local_shape_and_global_offset", "is_strided_shard"]


def is_strided_shard(placement: Placement) -> bool:
    """Whether `placement` is FSDP2's `_StridedShard` (what `fully_shard` gives a parameter that
    `parallelize_module` sharded on the same dim): not a `Shard` to `is_shard()`."""
    return isinstance(placement, _StridedShard)
