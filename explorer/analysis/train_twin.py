"""A fake twin of a module: the same module tree, its tensors replaced by fakes of a mode of our own.

A training step cannot run on the module itself. On a deferred module the optimizer's in-place
updates (`param.add_`, `exp_avg.lerp_`...) would be recorded into the init graph (materializing
would then replay a training step), FSDP's `fully_shard` rewrites the module in place (class,
parameters turned into DTensors), and activation checkpointing swaps blocks. So the step runs on a
`copy.deepcopy` whose memo maps every tensor of the module to a fake copy first: deepcopy never
touches a real or recorded tensor, the twin keeps the original's tying and aliasing (one fake
storage per storage, one object per tensor object), and everything else (configs, hooks, plain
attributes) is copied as usual. Parameters become `nn.Parameter`s of the fakes, with the original's
`requires_grad`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .._torch_compat.dispatch import metadata_access
from .._torch_compat.fake import FakeTensorMode
from ..inspection.census import take_census
from .dry_run import fake_state
from .fake_copies import FakeCopies, layout_extent


def _plain_tensor_attributes(module: nn.Module) -> list[torch.Tensor]:
    """Tensors held as ordinary attributes (not registered), e.g. HF rotary's `original_inv_freq`."""
    found = []
    for sub in module.modules():
        for value in vars(sub).values():
            if isinstance(value, torch.Tensor):
                found.append(value)
    return found


def fake_twin(module: nn.Module, mode: FakeTensorMode) -> nn.Module:
    """A deep copy of `module` whose parameters and buffers are fakes of `mode` (see module docstring).

    Only tensor metadata is read, so deferred, partly materialized and eager modules work alike and
    are left unchanged. Raises DryRunError for an uninitialized lazy parameter (from `fake_state`).
    """
    state = fake_state(take_census(module), mode)
    memo: dict[int, object] = {}
    named = [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]
    for name, tensor in named:
        if id(tensor) in memo:
            continue
        fake: torch.Tensor = state[name]
        if isinstance(tensor, nn.Parameter):
            fake = nn.Parameter(fake, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = fake
    extra = FakeCopies(mode)
    with metadata_access():
        for position, tensor in enumerate(_plain_tensor_attributes(module)):
            if id(tensor) not in memo:
                extent = layout_extent(
                    tensor.shape,
                    tensor.stride(),
                    int(tensor.storage_offset()),
                    tensor.element_size(),
                )
                extra.storage(position, extent)
                memo[id(tensor)] = extra.like(position, tensor)
    return copy.deepcopy(module, memo)
