"""Steps done after construction, to the built module and around it: the same code eagerly and deferred.

A program's `after` steps run on an `AfterWorld`: the constructed module (named "model") plus the
modules the steps make ("n<i>": new modules, "s<i>": second models built from another seed), the
RNG states saved by `save_rng`, and whether this is the deferred run. Eager and deferred runs execute
the very same calls in the same order; they differ only where the user would write different code:
a second model is built by `deferred_init` (not by calling the class), and a new module made "in a
block" is made inside `with explorer.deferred():` or `with explorer.deferred(model):` (eagerly:
plainly). So the eager global RNG moves
with every draw, seed and state restore exactly as it would in the user's eager program.

Paths ("model.m3", "n5", "s7.t2") name modules and tensors through the world's modules; a tensor
path's last part is a parameter or buffer name (a parametrized tensor's path still reads it).

Step kinds (program.AFTER_OPS):
    ("cast", dtype)                       model.to(dtype)
    ("load", names, value)                model.load_state_dict of those names = value + i (strict=False)
    ("reinit", name)                      model's tensor `name`.normal_() under no_grad
    ("draw", k)                           torch.randn(k), discarded: moves the global generator
    ("seed", s)                           torch.manual_seed(s)
    ("save_rng",)                         remember torch.get_rng_state() (the i-th save)
    ("restore_rng", i)                    torch.set_rng_state(the i-th saved state)
    ("new_linear", where, name, i, o, bias)
                                          name = nn.Linear(i, o, bias); where: "outside" any deferred
                                          scope, in a "block" (explorer.deferred() when deferred) or
                                          in the "model"'s recording (explorer.deferred(model))
    ("new_from", where, name, src, how, bias)
                                          a new nn.Linear shaped as the tensor at path `src` viewed
                                          as (numel // last dim, last dim); how: "copy" weight.copy_
                                          (src), "param" weight = Parameter(src.reshape(...).float() * 2)
    ("second_model", name, seed)          torch.manual_seed(seed); the same program built again
    ("copy_slot", dst, src)               tensor dst.copy_(tensor src) under no_grad
    ("replace", parent, attr, source)     setattr(module parent, attr, module source)
    ("parametrize", module, name, kind)   register_parametrization of `name`: "double" (x * 2),
                                          "symmetric" (with a right_inverse), "weight_norm"
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize

import explorer
from tests.fuzz.interpreter import DTYPES, FuzzModule, make_externals
from tests.fuzz.program import Program, Step


class Double(nn.Module):
    """A parametrization without right_inverse: the original keeps the value it had."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Symmetric(nn.Module):
    """A parametrization with right_inverse: registering it writes triu(x) into the original."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.triu() + x.triu(1).transpose(-1, -2)

    def right_inverse(self, x: torch.Tensor) -> torch.Tensor:
        return x.triu()


@dataclass
class AfterWorld:
    """The built module and what the steps after construction made around it."""

    program: Program
    deferred: bool
    modules: dict[str, nn.Module] = field(default_factory=dict)
    saved_states: list[torch.Tensor] = field(default_factory=list)
    externals: list[torch.Tensor] = field(default_factory=list)  # of second models

    @property
    def model(self) -> nn.Module:
        return self.modules["model"]

    def module(self, path: str) -> nn.Module:
        top, _, rest = path.partition(".")
        return self.modules[top].get_submodule(rest)

    def tensor(self, path: str) -> torch.Tensor:
        owner, _, name = path.rpartition(".")
        return getattr(self.module(owner), name)

    def holder(self) -> nn.Module:
        """The module compared with eager: the model alone, or (when steps made modules) a root
        holding "model" and every module made, in order."""
        if len(self.modules) == 1:
            return self.model
        root = nn.Module()
        for name, module in self.modules.items():
            setattr(root, name, module)
        root.values_read = list(self.model.values_read)
        return root

    def scope(self, where: str) -> Any:
        """Where a new module is made in the deferred run: "block", in a new `explorer.deferred()`
        recording; "model", in `explorer.deferred(model)` (extending the model's own recording);
        "outside", plainly (as the eager run makes every module)."""
        if not self.deferred or where == "outside":
            return contextlib.nullcontext()
        return explorer.deferred(self.model) if where == "model" else explorer.deferred()


def _linear_shape(tensor: torch.Tensor) -> tuple[int, int]:
    """(out, in) of the Linear whose weight holds `tensor`'s elements: (numel // last dim, last dim)."""
    last = tensor.shape[-1] if tensor.dim() else 1
    return tensor.numel() // max(last, 1), last


def _cast(world: AfterWorld, dtype: str) -> None:
    world.model.to(DTYPES[dtype])


def _load(world: AfterWorld, names: tuple, value: int) -> None:
    state = world.model.state_dict()
    world.model.load_state_dict(
        {name: torch.full(state[name].shape, value + i, dtype=state[name].dtype) for i, name in enumerate(names)},
        strict=False,
    )


def _reinit(world: AfterWorld, name: str) -> None:
    with torch.no_grad():
        world.model.state_dict(keep_vars=True)[name].normal_()


def _draw(world: AfterWorld, k: int) -> None:
    torch.randn(k)


def _seed(world: AfterWorld, seed: int) -> None:
    torch.manual_seed(seed)


def _save_rng(world: AfterWorld) -> None:
    world.saved_states.append(torch.get_rng_state())


def _restore_rng(world: AfterWorld, index: int) -> None:
    torch.set_rng_state(world.saved_states[index])


@contextlib.contextmanager
def _own_numbers(where: str, name: str) -> Any:
    """Eager code outside any deferred scope draws from the real generator, which deferred_init does
    not advance (README "Random numbers after construction"): its numbers differ from the eager
    program's by design. So a module made "outside" draws from a private seed in both runs (the
    global generator is given back as it was), and the rest of the program is compared as usual."""
    if where != "outside":
        yield
        return
    with torch.random.fork_rng():
        torch.manual_seed(sum(map(ord, name)))
        yield


def _new_linear(world: AfterWorld, where: str, name: str, inputs: int, outputs: int, bias: bool) -> None:
    with world.scope(where), _own_numbers(where, name):
        world.modules[name] = nn.Linear(inputs, outputs, bias=bias)


def _new_from(world: AfterWorld, where: str, name: str, src: str, how: str, bias: bool) -> None:
    source = world.tensor(src)
    outputs, inputs = _linear_shape(source)
    with world.scope(where), _own_numbers(where, name):
        linear = nn.Linear(inputs, outputs, bias=bias)
        with torch.no_grad():
            if how == "copy":
                linear.weight.copy_(source.reshape(outputs, inputs))
            else:
                linear.weight = nn.Parameter(source.detach().reshape(outputs, inputs).float() * 2)
    world.modules[name] = linear


def _second_model(world: AfterWorld, name: str, seed: int) -> None:
    externals = make_externals(world.program)
    world.externals += externals
    torch.manual_seed(seed)
    if world.deferred:
        world.modules[name] = explorer.deferred_init(FuzzModule, world.program, externals)
    else:
        world.modules[name] = FuzzModule(world.program, externals)


def _copy_slot(world: AfterWorld, dst: str, src: str) -> None:
    with torch.no_grad():
        world.tensor(dst).copy_(world.tensor(src))


def _set_data(world: AfterWorld, dst: str, src: str, how: str) -> None:
    """`dst.data = src`, or a value computed from src (`src * 2`, `src[:1]`): a swap that never
    reaches the dispatcher; often nothing uses `dst` again before it is materialized."""
    source = world.tensor(src).data
    world.tensor(dst).data = {"same": lambda: source, "doubled": lambda: source * 2, "row": lambda: source[:1]}[how]()


def _replace(world: AfterWorld, parent: str, attr: str, source: str) -> None:
    setattr(world.module(parent), attr, world.module(source))


def _parametrize(world: AfterWorld, module: str, name: str, kind: str) -> None:
    owner = world.module(module)
    if kind == "weight_norm":
        parametrizations.weight_norm(owner, name)
    else:
        parametrize.register_parametrization(owner, name, Double() if kind == "double" else Symmetric())


AFTER_STEPS: dict[str, Callable[..., None]] = {
    "cast": _cast, "load": _load, "reinit": _reinit, "draw": _draw, "seed": _seed, "save_rng": _save_rng,
    "restore_rng": _restore_rng, "new_linear": _new_linear, "new_from": _new_from,
    "second_model": _second_model, "copy_slot": _copy_slot, "replace": _replace, "parametrize": _parametrize,
    "set_data": _set_data,
}


def run_after(world: AfterWorld, steps: Sequence[Step], on_step: Callable[[int], None] | None = None) -> None:
    """Run `steps` on `world` in order (`on_step(i)` before the i-th, so a caller knows which raised)."""
    for index, step in enumerate(steps):
        if on_step is not None:
            on_step(index)
        AFTER_STEPS[step[0]](world, *step[1:])


def apply_after(module: nn.Module, steps: Sequence[Step], program: Program | None = None,
                deferred: bool = False) -> AfterWorld:
    """Run a program's steps after construction on the built (eager or deferred) module."""
    world = AfterWorld(program if program is not None else Program(()), deferred, {"model": module})
    run_after(world, steps)
    return world
