"""The meta-init check: record a re-init function as if it ran after `to_empty()`.

Meta-device init builds a model without values, then `model.to_empty(device=...)` gives every
parameter and buffer fresh uninitialized memory, and the model's own init function
(`model.apply(model._init_weights)`, `model.init_weights()`, `reset_parameters` on every submodule)
must write every byte again. A tensor whose value came from `__init__` and that the function never
writes (a non-persistent buffer like RoPE's `inv_freq`) is garbage; one it writes with another
distribution trains differently. To see both without touching the model, `record_reinit` builds a
*shell*: a shallow copy of every submodule (same classes, attributes and configs, so the init
function takes the same branches) whose parameters and buffers are new deferred tensors made by
`torch.empty_strided` (what `to_empty` does: same shape, stride, dtype, device; and, as
`to_empty` from meta in torch 2.13 does, every module slot gets its own new tensor, so tied weights
come out untied until the init function ties them again; a submodule shared by two paths stays one
module), records `fn(shell)` on them in a new recording, and hands that graph back. The module, its
recording and the RNG ledger are left as they were (the shell's draws are hypothetical: not owed).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._torch_compat.dispatch import metadata_access
from ..graph import InitGraph, TensorId
from ..record import rng_ledger
from ..record.deferred import deferred_init
from ..record.fake import handle_of

ReinitFunction = Callable[[nn.Module], object]

# Note: [Marks of an init that ran in the constructor]
# Hugging Face sets `module._is_hf_initialized = True` on each module its `initialize_weights` ran
# on, and skips marked modules later. Deferred construction runs that init (the tensors are on
# cpu); meta construction skips it (`init_weights` checks for the meta device) and leaves modules
# unmarked. The shell stands for a meta-constructed model, so it drops the mark. Mirrors
# transformers 5.x (modeling_utils.py `_initialize_weights`); re-check on upgrades.
_INIT_MARKS = ("_is_hf_initialized",)


def named_slots(root: nn.Module) -> Iterator[tuple[str, str, nn.Module, str, torch.Tensor, bool]]:
    """(name, module path, module, kind, tensor, is_parameter) for every parameter and buffer slot,
    in module order, shared modules and tied tensors under every name (as `inspect` lists them)."""
    for path, module in root.named_modules(remove_duplicate=False):
        prefix = f"{path}." if path else ""
        for key, tensor in module._parameters.items():
            if tensor is not None:
                yield prefix + key, path, module, "parameter", tensor, True
        non_persistent = module._non_persistent_buffers_set
        for key, tensor in module._buffers.items():
            if tensor is not None:
                kind = "non-persistent buffer" if key in non_persistent else "buffer"
                yield prefix + key, path, module, kind, tensor, False


@dataclass
class ReinitRecording:
    """`fn(shell)` recorded: the graph, and each name's tensor in it (None: `fn` put a real tensor there)."""

    graph: InitGraph
    tensor_ids: dict[str, TensorId | None]
    function: str  # "name (file:line)" of the function, for "never written by ..."


def _empty_like(tensor: torch.Tensor, parameter: bool) -> torch.Tensor:
    with metadata_access():
        shape, stride, dtype, device = tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.device
        requires_grad = tensor.requires_grad
    fresh = torch.empty_strided(shape, stride, dtype=dtype, device=device)
    return nn.Parameter(fresh, requires_grad=requires_grad) if parameter else fresh


def _shell(root: nn.Module) -> nn.Module:
    """A shallow copy of `root`'s module tree whose tensors are new uninitialized deferred tensors."""
    modules: dict[int, nn.Module] = {}

    def copy(module: nn.Module) -> nn.Module:
        done = modules.get(id(module))
        if done is not None:
            return done
        new = module.__class__.__new__(module.__class__)
        new.__dict__.update(module.__dict__)
        for mark in _INIT_MARKS:
            new.__dict__.pop(mark, None)
        modules[id(module)] = new
        new._parameters = {}
        new._buffers = {}
        new._non_persistent_buffers_set = set(module._non_persistent_buffers_set)
        for slots, parameter in ((module._parameters, True), (module._buffers, False)):
            target: dict[str, Any] = new._parameters if parameter else new._buffers  # Parameters, or tensors
            for key, tensor in slots.items():  # one new tensor per slot: to_empty unties (see above)
                target[key] = None if tensor is None else _empty_like(tensor, parameter)
        new._modules = {key: None if child is None else copy(child) for key, child in module._modules.items()}
        return new

    return copy(root)


def describe_function(fn: Callable) -> str:
    """`name (file:line)` of a function, a bound method or a partial (its innermost function)."""
    inner = getattr(fn, "func", fn)
    inner = getattr(inner, "__func__", inner)
    name = getattr(inner, "__qualname__", repr(inner))
    code = getattr(inner, "__code__", None)
    if code is None:
        return name
    return f"{name} ({code.co_filename}:{code.co_firstlineno})"


def record_reinit(module: nn.Module, fn: ReinitFunction) -> ReinitRecording:
    """Record `fn(shell)` on a to_empty'd shell of `module` (see the module docstring).

    Raises what `fn` raises, with a note naming `fn`; the module is unchanged either way.
    """
    if not callable(fn):
        raise TypeError(f"init_report(reinit=...) expects a function of the module, got {type(fn).__name__}")

    def build() -> nn.Module:
        shell = _shell(module)
        fn(shell)
        return shell

    try:
        shell = deferred_init(build)
    except Exception as error:
        note = f"while recording reinit={describe_function(fn)} on an empty copy of {type(module).__name__}"
        if sys.version_info >= (3, 11):
            error.add_note(note)
        else:  # add_note is new in 3.11; 3.10's traceback does not print notes, but callers can read them
            error.__notes__ = [*getattr(error, "__notes__", []), note]  # type: ignore[attr-defined]  # typeshed declares it from 3.11
        raise
    graph = None
    ids: dict[str, TensorId | None] = {}
    for name, _, _, _, tensor, _ in named_slots(shell):
        handle = handle_of(tensor)
        ids[name] = None if handle is None else handle.tensor_id
        graph = graph or (handle.graph if handle is not None else None)
    if graph is None:
        graph = InitGraph()
    rng_ledger.forget(graph)  # hypothetical draws: later recordings must not count them as owed
    return ReinitRecording(graph, ids, describe_function(fn))
