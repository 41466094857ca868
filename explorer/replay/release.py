"""Giving materialized tensors back: a module's real parameters and buffers become deferred again.

`release_module` is `materialize_module` run backwards: every slot holding a tensor that
materialization handed out gets back the fake it replaced (replay/deferred_forms.py), the replay
forgets the result, and once nothing else holds the real tensor its memory is returned. Materializing
again replays the same recording, so it gives the same bytes (with rng="eager", the bytes of eager
construction), in any order of partial materializations and releases.

Limitations: memory comes back only when nothing else holds the real tensor (an optimizer, a user
variable, a tensor `.grad` points into); a released parameter's `.grad` is not kept (its
`requires_grad` and the attributes set on it are); a change made through a view outside the module
is not seen (the version check reads the released tensors' own counters).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import cast

import torch
from torch import nn

from ..errors import ReleaseError
from ..graph import InitGraph
from ..record.fake import DeferredHandle, carry_gradient_hooks, handle_of
from .deferred_forms import DeferredForm, deferred_form_of, forget_deferred_form
from .materialize import TensorSlot, module_slots, roots_of
from .replay import ReplayState

_KINDS = {
    "_parameters": "parameter",
    "_buffers": "buffer",
    "__dict__": "attribute",
}  # note [Tensors held as attributes]
_NAMED_CHANGES = 5  # the refusal names this many changed tensors, then counts the rest


def release_module(
    module: nn.Module, check_fn: Callable[[nn.Module], bool] | None = None, *, force: bool = False
) -> nn.Module:
    """Put the deferred (fake) tensors back in every parameter/buffer slot of `module` and its
    submodules that holds a tensor materialization handed out, and return `module`.

    The fake is the very object the slot held before (ties stay ties, parameters stay parameters);
    the real tensor's memory is returned once nothing else holds it. Eager tensors, and tensors the
    user assigned, are left alone. `check_fn(submodule)` chooses whose own tensors are released, as
    for `materialize_module`. A tensor changed since it was materialized (in place, or `.data`
    replaced) would lose that change: ReleaseError names it, unless `force=True`. All or nothing:
    everything is checked before any slot changes; on an error the module is left as it was.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"explorer.release_module expects an nn.Module, got {type(module).__name__} {module!r:.80}")
    if check_fn is not None and not callable(check_fn):
        raise TypeError(f"check_fn must be a function of a submodule returning bool, got {type(check_fn).__name__}")
    slots = module_slots(module, tuple(_KINDS), check_fn, lambda t: deferred_form_of(t) is not None, "released")
    if not force:
        _refuse_changed(slots)
    reals = {id(real): real for _, real in slots}
    for real in reals.values():
        _carry_user_state(real, _form(real).fake)
    for (owner, kind, key, _), real in slots:
        getattr(owner, kind)[key] = _form(real).fake
    _release_tied_slots_elsewhere(module, reals)
    _forget(module, reals.values())
    return module


def _release_tied_slots_elsewhere(module: nn.Module, reals: dict[int, torch.Tensor]) -> None:
    """The other side of note [Ties across a partial materialization] (replay/materialize.py): a
    released tensor the recording's root also holds outside `module` is released there too, so the
    tie stays one tensor and its memory can go."""
    roots = {id(module): module, **{id(root): root for real in reals.values() for root in roots_of(_form(real).fake)}}
    for root in roots.values():  # `module` too: the other side may be in a part `check_fn` did not choose
        for (owner, kind, key, _), real in module_slots(
            root, tuple(_KINDS), None, lambda t: id(t) in reals, "released"
        ):
            getattr(owner, kind)[key] = _form(real).fake


def _carry_user_state(real: torch.Tensor, fake: torch.Tensor) -> None:
    """What was set on the real tensor since it was handed out (a freeze with `requires_grad_(False)`,
    `p._no_weight_decay = True`) goes back onto its fake, so materializing again hands it out as the
    eager tensor keeps it. Values are not state: a changed value is refused (`_refuse_changed`)."""
    if fake.requires_grad != real.requires_grad and fake.is_leaf:
        fake.requires_grad_(real.requires_grad)
    fake.__dict__.update(real.__dict__)
    carry_gradient_hooks(real, fake)


def _form(real: torch.Tensor) -> DeferredForm:
    """`deferred_form_of` a tensor known to have one: the slots released were chosen by
    `deferred_form_of(t) is not None`."""
    return cast(DeferredForm, deferred_form_of(real))


def _refuse_changed(slots: list[tuple[TensorSlot, torch.Tensor]]) -> None:
    changes: dict[int, str] = {}  # per real tensor, its first name and what changed
    for (_, kind, _, name), real in slots:
        if id(real) not in changes and (change := _form(real).changed_since(real)) is not None:
            changes[id(real)] = f"{_KINDS[kind]} {name!r}: {change}"
    if not changes:
        return
    listed = list(changes.values())
    named = "; ".join(listed[:_NAMED_CHANGES])
    more = f"; and {len(listed) - _NAMED_CHANGES} more" if len(listed) > _NAMED_CHANGES else ""
    raise ReleaseError(
        f"release_module refused: {len(listed)} tensor{'s' * (len(listed) != 1)} changed since "
        f"materialization, and materializing again would not reproduce the change: {named}{more}. Save "
        "what you need first (state_dict), or pass force=True to release anyway and lose the change; "
        "nothing was released"
    )


def _forget(module: nn.Module, released: Iterable[torch.Tensor]) -> None:
    """Let the replay forget the released tensors the module no longer holds anywhere (a tied name
    that check_fn kept still holds its tensor: materializing the released name again returns it)."""
    held = {id(t) for sub in module.modules() for t in (*sub._parameters.values(), *sub._buffers.values())}
    by_graph: dict[int, tuple[InitGraph, list[torch.Tensor]]] = {}
    for real in released:
        if id(real) in held:
            continue
        graph = cast(DeferredHandle, handle_of(_form(real).fake)).graph  # a deferred form holds its fake
        by_graph.setdefault(id(graph), (graph, []))[1].append(real)
        forget_deferred_form(real)
    for graph, reals in by_graph.values():
        ReplayState.of(graph).forget_results(graph, reals)
