"""Initializers that read the values they draw, recorded as one op each.

PyTorch 2.13's `nn.init.trunc_normal_` is rejection sampling: it draws, then loops on `mask.any()`
over the values it drew. Under fake tensors every such read would compute the real tensor during
recording (a 14 GB RSS for Hugging Face's BltModel inside `deferred_init`), and the number of draws
depends on the values. So inside `deferred_init` (only there; undone on every exit) its
implementation, `torch.nn.init._no_grad_trunc_normal_` — which `nn.init.trunc_normal_` and every
alias of it captured elsewhere (transformers' `TORCH_INIT_FUNCTIONS`) call — records a single op
`explorer::trunc_normal_` on a fake tensor instead. Replay runs that op's real kernel: the original
function on the real tensor, so the draws and values are eager's. Its draw count is known only after
running it: `rng="eager"` runs it on scratch when it skips over it, once, and caches the state after.

Other initializers were checked: `torch/nn/init.py` reads values only in `trunc_normal_` (2.13);
`orthogonal_` and `sparse_` draw a fixed amount; timm's `trunc_normal_` is inverse-CDF sampling
(`uniform_`, `erfinv_`), transformers' init helpers wrap the torch functions.

Note: [Patched private initializer] `_no_grad_trunc_normal_` is private to torch.nn.init and
mirrored here; re-check its name and signature on upgrades (tests/explorer/record/test_initializers.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.init as init

from .._torch_compat.fake import FakeTensor
from .scope import recording_graph

_ORIGINAL_TRUNC_NORMAL = init._no_grad_trunc_normal_

_LIBRARY = torch.library.Library("explorer", "DEF")
_LIBRARY.define(
    "trunc_normal_(Tensor(a!) self, float mean, float std, float a, float b) -> Tensor(a!)",
    tags=(torch.Tag.nondeterministic_seeded,),
)


def _trunc_normal_kernel(tensor: torch.Tensor, mean: float, std: float, a: float, b: float) -> torch.Tensor:
    with torch.no_grad():
        _ORIGINAL_TRUNC_NORMAL(tensor, mean, std, a, b)
    return tensor


_LIBRARY.impl("trunc_normal_", _trunc_normal_kernel, "CompositeExplicitAutograd")
_LIBRARY.impl("trunc_normal_", lambda tensor, mean, std, a, b: tensor, "Meta")

TRUNC_NORMAL = torch.ops.explorer.trunc_normal_.default
# Ops that overwrite every element of `self` without reading it (see graph.OVERWRITING_OPS).
INITIALIZER_OPS = frozenset({TRUNC_NORMAL})


def _recorded_trunc_normal(
    tensor: torch.Tensor, mean: float, std: float, a: float, b: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """`_no_grad_trunc_normal_` as deferred_init sees it: one recorded op on a fake tensor."""
    if generator is None and isinstance(tensor, FakeTensor) and recording_graph() is not None:
        return TRUNC_NORMAL(tensor, float(mean), float(std), float(a), float(b))
    return _ORIGINAL_TRUNC_NORMAL(tensor, mean, std, a, b, generator=generator)


@contextlib.contextmanager
def recorded_initializers() -> Iterator[None]:
    """Value-reading initializers record one op each while the block runs (undone on any exit)."""
    previous = init._no_grad_trunc_normal_
    init._no_grad_trunc_normal_ = _recorded_trunc_normal
    try:
        yield
    finally:
        init._no_grad_trunc_normal_ = previous
