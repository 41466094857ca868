"""FLOP formulas: `torch.utils.flop_counter`'s registry, with scaled dot-product attention counted
the same way on every release.

`FlopCounterMode` is public; its registry (`flop_registry`) and `shape_wrapper` are not, so they are
read here only. Releases differ on attention (checked on 2.11, 2.13, 2.15):

- grouped-query attention (key/value with fewer heads than the query, as transformers passes them
  with `enable_gqa`): 2.11's `sdpa_flop_count` asserts equal heads and so refuses the call; 2.13+
  count every query head against the key/value head it shares (the kernel broadcasts them);
- CPU attention (`_scaled_dot_product_flash_attention_for_cpu` and its backward) has a registry
  entry from 2.15 on; before, `FlopCounterMode` counts 0 FLOPs for attention on CPU.

So each attention op of `SDPA_FORWARD` / `SDPA_BACKWARD` keeps torch's formula when it has one that
counts a grouped-query probe as 2.15 does (`sdpa_flops` / `sdpa_backward_flops`); otherwise ours is
used (`ATTENTION_FLOP_FORMULAS`): a feature test, not a version test. Like torch's, the formulas
count dense attention, so they are upper bounds for causal or masked attention.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry as _torch_flop_registry
from torch.utils.flop_counter import shape_wrapper as _shape_wrapper

__all__ = [
    "ATTENTION_FLOP_FORMULAS",
    "SDPA_BACKWARD",
    "SDPA_FORWARD",
    "counter_mapping",
    "flop_formulas",
    "sdpa_backward_flops",
    "sdpa_flops",
]

_aten = torch.ops.aten

# Attention ops whose arguments start (query, key, value), each (batch, heads, tokens, head size) ...
SDPA_FORWARD = (
    _aten._scaled_dot_product_efficient_attention,
    _aten._scaled_dot_product_flash_attention,
    _aten._scaled_dot_product_flash_attention_for_cpu,
    _aten._scaled_dot_product_cudnn_attention,
)
# ... and their backward ops, whose arguments start (grad_out, query, key, value).
SDPA_BACKWARD = (
    _aten._scaled_dot_product_efficient_attention_backward,
    _aten._scaled_dot_product_flash_attention_backward,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward,
    _aten._scaled_dot_product_cudnn_attention_backward,
)


def _attention_sizes(query_shape: Any, key_shape: Any, value_shape: Any) -> tuple[int, ...]:
    """(batch, query heads, query tokens, key tokens, head size, value head size), after checking
    the shapes as torch 2.15 does: key and value share batch, heads and tokens, and the query's
    heads are a whole multiple of theirs (grouped-query attention when more)."""
    b, h_q, s_q, d_q = query_shape
    b_k, h_kv, s_k, d_k = key_shape
    b_v, h_v, s_v, d_v = value_shape
    if not (b == b_k == b_v and h_kv == h_v and d_q == d_k and s_k == s_v):
        raise AssertionError(
            f"sdpa_flop_count: query/key/value shapes are incompatible: q={query_shape}, k={key_shape}, v={value_shape}"
        )
    if h_q < h_kv or h_q % h_kv != 0:
        raise AssertionError(f"sdpa_flop_count: query heads ({h_q}) must be a multiple of key/value heads ({h_kv})")
    return b, h_q, s_q, s_k, d_q, d_v


def sdpa_flops(
    query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    """FLOPs of an attention forward (torch 2.15's formula, a shape formula in
    `torch.utils.flop_counter`'s convention): Q·Kᵀ and P·V for every query head, 2 FLOPs per
    multiply-add, 2·b·h_q·s_q·s_k·(d_q + d_v). Grouped-query key/value heads count once per query head."""
    b, h_q, s_q, s_k, d_q, d_v = _attention_sizes(query_shape, key_shape, value_shape)
    return 2 * b * h_q * s_q * s_k * (d_q + d_v)


def sdpa_backward_flops(
    grad_out_shape: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    """FLOPs of an attention backward (torch 2.15's formula): the scores recomputed (Q·Kᵀ), then
    dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K, dK = Qᵀ·dS, for every query head: 2·b·h_q·s_q·s_k·(3·d_q + 2·d_v)."""
    b, h_q, s_q, s_k, d_q, d_v = _attention_sizes(query_shape, key_shape, value_shape)
    if tuple(grad_out_shape) != (b, h_q, s_q, d_v):
        raise AssertionError(
            f"sdpa_backward_flop_count: grad_out has shape {tuple(grad_out_shape)}, expected {(b, h_q, s_q, d_v)}"
        )
    return 2 * b * h_q * s_q * s_k * (3 * d_q + 2 * d_v)


# A grouped-query probe: batch 1, 4 query heads sharing 2 key/value heads, 3 queries, 5 keys,
# head sizes 2 (query/key) and 3 (value); meta tensors, as a recording would pass fakes.
_PROBE_SHAPES = ((1, 4, 3, 2), (1, 2, 5, 2), (1, 2, 5, 3))
_PROBE_GRAD_OUT = (1, 4, 3, 3)


def _counts_like_ours(op: Any, ours: Callable[..., int], shapes: tuple) -> bool:
    """True when torch has a formula for `op` and it counts the grouped-query probe as `ours` does."""
    formula = _torch_flop_registry.get(op)
    if formula is None:
        return False
    tensors = [torch.empty(shape, device="meta") for shape in shapes]
    try:
        return int(formula(*tensors)) == ours(*shapes)
    except Exception:  # a refusal (2.11: AssertionError "query/key/value shapes are incompatible")
        return False


ATTENTION_FLOP_FORMULAS: dict[Any, Callable[..., int]] = {
    **{op: sdpa_flops for op in SDPA_FORWARD if not _counts_like_ours(op, sdpa_flops, _PROBE_SHAPES)},
    **{
        op: sdpa_backward_flops
        for op in SDPA_BACKWARD
        if not _counts_like_ours(op, sdpa_backward_flops, (_PROBE_GRAD_OUT, *_PROBE_SHAPES))
    },
}
"""The attention shape formulas this release's registry lacks or counts differently (empty on 2.15)."""


def counter_mapping(extra: Mapping[Any, Callable[..., int]]) -> dict[Any, Callable[..., int]]:
    """`custom_mapping` for `FlopCounterMode`: `ATTENTION_FLOP_FORMULAS` plus `extra` (shape formulas
    keyed by op overload packet, as torch's `custom_mapping` takes them)."""
    return {**ATTENTION_FLOP_FORMULAS, **extra}


def flop_formulas(mapping: Mapping[Any, Callable[..., int]]) -> dict[Any, Callable[..., int]]:
    """Every formula `FlopCounterMode(custom_mapping=mapping)` counts with, keyed by op overload
    packet; each is called as the mode calls it: `formula(*args, **kwargs, out_val=out)`."""
    wrapped = {op: f if getattr(f, "_get_raw", False) else _shape_wrapper(f) for op, f in mapping.items()}
    return {**_torch_flop_registry, **wrapped}
