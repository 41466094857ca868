"""A module's parameters and buffers swapped for others while one forward runs, then put back.

Note: [Each slot swapped once]
The analyses run a module's forward on fakes of their own (`dry_run`, `forward_graph`).
`torch.func.functional_call` swaps by name: a submodule held at two paths (`self.again = self.a`,
ALBERT's `nn.ModuleList([layer] * n)`) is one slot under two names, which it swaps twice and then
restores from the second swap's "original", the analysis's fake. The model, deferred or eager, kept
that fake: trained weights lost, `materialize_module` with nothing left to do. Here every slot is
swapped once, by (owner, key), and each is restored to exactly the object it held.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn


@contextlib.contextmanager
def swapped_in(module: nn.Module, state: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Within the block, each parameter or buffer of `module` that `state` names holds `state`'s
    tensor (names `state` lacks keep theirs); on any exit every slot holds its own object again."""
    saved: dict[tuple[int, str], tuple[dict[str, Any], str, Any]] = {}
    try:
        for name, tensor in state.items():
            owner_path, _, key = name.rpartition(".")
            owner = module.get_submodule(owner_path)
            store: dict[str, Any] = owner._parameters if key in owner._parameters else owner._buffers
            if key not in store or (id(owner), key) in saved:
                continue
            saved[(id(owner), key)] = (store, key, store[key])
            store[key] = tensor
        yield
    finally:
        for store, key, original in saved.values():
            store[key] = original
