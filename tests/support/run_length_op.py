"""A custom op tagged pointwise whose result depends on the length of the run it is given:
`add_length_(t)` adds `t.numel()` to every element. Applied to rows alone it gives other values than
on the whole tensor, so the pointwise probe (`explorer/replay/pointwise.py`) must refuse it."""

from __future__ import annotations

import torch

_LIBRARY = torch.library.Library("run_length_test", "DEF")
_LIBRARY.define("add_length_(Tensor(a!) self) -> Tensor(a!)", tags=(torch.Tag.pointwise,))
_LIBRARY.impl("add_length_", lambda t: t.add_(t.numel()), "CompositeExplicitAutograd")

add_length_ = torch.ops.run_length_test.add_length_.default
