"""Random ops given a generator of the constructor's own (`generator=g`), recorded so replay draws
what eager drew.

Note: [A constructor's own generators]
PEFT's VeRA builds its shared projections from `torch.Generator().manual_seed(key)`, and random
feature layers do the same so that a seed in the config fixes them. Such a generator is not a
stream the recording has to follow: its state when the op runs fixes the op's values, whatever the
rest of the model draws. So the op is recorded with that state (`graph.GeneratorState`), and replay
runs it on a new generator set to it: values equal eager's for every subset materialized, in any
order, with rng="eager" or "fast", and nothing is re-run to skip it.

The fake op draws nothing, so the constructor's generator is moved on here as eager's would be, by
running the op once on stand-in tensors: the next op given it then starts where eager's did, and so
does the caller's code after `deferred_init`. The stand-ins hold ones, which is exact for the ops
whose number of draws is fixed by sizes (note [Draws fixed by sizes] in graph.py); others, such as
`poisson`'s rejection sampling or `rrelu`, may draw as many times as their inputs' values need, and
are refused.

`generator=torch.default_generator` (or a CUDA device's default generator) is the default stream
itself: the op is recorded with `generator=None`, which draws from it as eager did. A generator on
another device type than the tensor is refused, as eager refuses it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from .._torch_compat.dispatch import tree_map
from .._torch_compat.fake import FakeTensor, fake_device_of
from .._torch_compat.generators import same_generator
from ..errors import DeferredInitError
from ..graph import GeneratorState, SourceLocation, draws_fixed_by_sizes, generator_position, with_generator
from .scope import outside_recording


class GeneratorArgument(NamedTuple):
    """An op's arguments as the graph stores them, and the constructor's generator to move on once
    the op is recorded (None: the op used a default generator, or draws nothing)."""

    args: tuple
    kwargs: dict
    own_generator: torch.Generator | None


def given_generator(func: Any, args: tuple, kwargs: dict) -> torch.Generator | None:
    """The generator random op `func` was passed, None for none."""
    position = generator_position(func)
    given = kwargs.get("generator") if position is None or position >= len(args) else args[position]
    return given if isinstance(given, torch.Generator) else None


def recorded_generator(
    func: Any, args: tuple, kwargs: dict, device: torch.device | None, source: SourceLocation | None
) -> GeneratorArgument:
    """`args` and `kwargs` of random op `func` (on `device`, None when it has no tensor) with the
    generator they pass as the graph keeps it (see note [A constructor's own generators]). Raises
    DeferredInitError for a generator on another device type, or given to a rejection sampler."""
    given = given_generator(func, args, kwargs)
    if given is None:
        return GeneratorArgument(args, kwargs, None)

    def replaced(value: Any) -> tuple[tuple, dict]:  # None, not absent: `randn.generator` has no default
        return with_generator(func, args, kwargs, {"generator": value})

    if device is None or device.type == "meta":
        return GeneratorArgument(*replaced(None), None)  # nothing is drawn on meta, eager's generator included
    where = f"{func} at {source or '<unknown source>'}"
    if given.device.type != device.type:
        raise DeferredInitError(
            f"{where} was given a generator on {given.device} for a tensor on {device}, which eager "
            f"construction refuses too: pass a torch.Generator(device={device.type!r})"
        )
    if _is_default_generator(given):
        return GeneratorArgument(*replaced(None), None)
    if not draws_fixed_by_sizes(func):
        raise DeferredInitError(
            f"{where} may draw from its own torch.Generator as many times as its inputs' values need, which "
            "deferred_init cannot know without computing them; draw it from the default generator (no "
            "generator=), or build that tensor after materialization"
        )
    with outside_recording():
        state = given.get_state().clone()
    label = f"own {given.device.type} generator, seed {given.initial_seed()}"
    return GeneratorArgument(*replaced(GeneratorState(str(given.device), state, label)), given)


def _is_default_generator(generator: torch.Generator) -> bool:
    if generator.device.type == "cpu":
        return same_generator(generator, torch.default_generator)
    if generator.device.type == "cuda" and torch.cuda.is_available():
        return any(same_generator(generator, default) for default in torch.cuda.default_generators)
    return False


def move_on_like_eager(func: Any, args: tuple, kwargs: dict) -> None:
    """Advance the generator random op `func` is given in `args` or `kwargs` by the draws it takes
    in eager construction: the op run once on stand-ins of its fake arguments (ones, in their
    layout and on their device)."""

    def stand_in(value: Any) -> Any:
        if isinstance(value, FakeTensor):
            real = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=fake_device_of(value))
            return real.fill_(1)
        return value

    with outside_recording():
        func(*tree_map(stand_in, args), **tree_map(stand_in, kwargs))
