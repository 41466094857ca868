"""Hypothesis strategy for the steps after construction (tests/fuzz/after.py runs them).

Each candidate step is drawn from the eager world as the accepted steps left it (its modules,
tensor names and shapes, saved RNG states) and kept only if eager construction followed by the
steps so far accepts it, as the constructor steps are. Steps that the deferred run must refuse
(a write into a caller's tensor, an op over two recordings) are generated too, less often: the
fuzzer checks that their refusal is the promised one (tests/fuzz/refusals.py).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from hypothesis import strategies as st
from torch import nn

from tests.fuzz.after import AfterWorld, run_after
from tests.fuzz.interpreter import FuzzModule, make_externals
from tests.fuzz.program import FLOATS, Program, Step

Draw = Callable[[st.SearchStrategy], Any]
MAX_AFTER_STEPS = 5
WHERE = ("outside", "block", "model")  # where new modules are made (AfterWorld.scope)
# How often each kind is tried (RNG steps and re-inits interleave most: that is where eager's
# generator position matters).
AFTER_WEIGHTS: dict[str, int] = {
    "cast": 1, "load": 2, "reinit": 3, "draw": 3, "seed": 1, "save_rng": 1, "restore_rng": 2,
    "new_linear": 1, "new_from": 2, "second_model": 1, "copy_slot": 2, "replace": 1, "parametrize": 2,
    "set_data": 2,
}
_WEIGHTED_AFTER = tuple(kind for kind, weight in AFTER_WEIGHTS.items() for _ in range(weight))


def after_construction(draw: Draw, program: Program) -> tuple[Step, ...]:
    """Up to MAX_AFTER_STEPS steps done to and around the built module, each kept only if eager
    construction followed by the steps so far accepts it."""
    accepted: list[Step] = []
    built = _eager_world(program, [])
    # Tensors that alias a real tensor passed in are real in the deferred module too (and so is what
    # a cast makes of them): writes into them are refused, their random draws are not recorded.
    real = _real_names(built, set())
    for _ in range(draw(st.integers(0, MAX_AFTER_STEPS))):
        kind = draw(st.sampled_from(_WEIGHTED_AFTER))
        step = AFTER_DRAWERS[kind](draw, built, real, len(accepted))
        if step is None:
            continue
        if _try_step(built, step) and tensor_paths(built):  # something left to compare
            accepted.append(step)
            real = _real_names(built, real)
        else:  # a refused step may have changed the world before raising: rebuild it
            built = _eager_world(program, accepted)
    return tuple(accepted)


def _real_names(world: "EagerWorld", known: set[str]) -> set[str]:
    """`known` plus the model's state names over a caller's storage now, and the parametrized
    originals of real names (`t3` -> `parametrizations.t3.original`)."""
    state = world.model.state_dict(keep_vars=True)
    real = known | {name for name, t in state.items() if t.untyped_storage()._cdata in world.external_storages}
    for name in list(real):
        owner, _, key = name.rpartition(".")
        prefix = f"{owner}.parametrizations.{key}.original" if owner else f"parametrizations.{key}.original"
        real |= {other for other in state if other.startswith(prefix)}
    return real


# -- one drawer per kind: (draw, the eager world now, real model tensor names, step index) -> step
def _cast(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    if _views_a_parameter(world.model):
        return None  # a known limit: Module._apply swaps fake parameters (README Limitations)
    return ("cast", draw(st.sampled_from(FLOATS)))


def _model_state(world: AfterWorld, real: set[str]) -> dict[str, torch.Tensor]:
    return {name: t for name, t in world.model.state_dict(keep_vars=True).items() if name not in real}


def _load(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    state = _model_state(world, real)
    if not state:
        return None
    names = draw(st.lists(st.sampled_from(sorted(state)), min_size=1, max_size=3, unique=True))
    return ("load", tuple(names), draw(st.sampled_from((0, 1, -2))))


def _reinit(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    floating = sorted(name for name, t in _model_state(world, real).items() if t.is_floating_point())
    return ("reinit", draw(st.sampled_from(floating))) if floating else None


def _draw(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    return ("draw", draw(st.sampled_from((1, 3, 16, 100))))


def _seed(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    return ("seed", draw(st.integers(0, 2**16)))


def _save_rng(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    return ("save_rng",)


def _restore_rng(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    saved = len(world.saved_states)
    return ("restore_rng", draw(st.integers(0, saved - 1))) if saved else None


def _new_linear(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    return ("new_linear", draw(st.sampled_from(WHERE)), f"n{index}",
            draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.booleans()))


def _new_from(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    sources = [path for path, t in tensor_paths(world).items() if t.numel()]
    if not sources:
        return None
    return ("new_from", draw(st.sampled_from(WHERE)), f"n{index}", draw(st.sampled_from(sources)),
            draw(st.sampled_from(("copy", "param"))), draw(st.booleans()))


def _second_model(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    if any(name.startswith("s") for name in world.modules):
        return None  # one is enough to mix two recordings, and each costs a whole construction
    return ("second_model", f"s{index}", draw(st.integers(0, 2**16)))


def _copy_slot(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    paths = tensor_paths(world)
    dst = draw(st.sampled_from(sorted(paths)))
    sources = []
    for path, tensor in paths.items():
        try:
            if torch.broadcast_shapes(tensor.shape, paths[dst].shape) == paths[dst].shape:
                sources.append(path)
        except RuntimeError:
            pass
    return ("copy_slot", dst, draw(st.sampled_from(sorted(sources)))) if sources else None


def _set_data(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    # within the model's own deferred tensors: `.data` set to a real tensor is a promised refusal
    # tested by name (tests/explorer/record/test_after_construction.py)
    state = {f"model.{name}": t for name, t in _model_state(world, real).items()}
    if not state:
        return None
    dst = draw(st.sampled_from(sorted(state)))
    src = draw(st.sampled_from(sorted(state)))
    how = draw(st.sampled_from(("same", "doubled", "row") if state[src].dim() else ("same", "doubled")))
    if how == "doubled" and state[src].dtype == torch.bool:
        return None
    return ("set_data", dst, src, how)


def _replace(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    parents = module_paths(world)
    parent = draw(st.sampled_from(parents))
    sources = [path for path in parents if path != "model"
               and not any(m is world.module(parent) for m in world.module(path).modules())]
    if not sources:
        return None
    children = [name for name in world.module(parent)._modules]
    attr = draw(st.sampled_from(children)) if children and draw(st.booleans()) else f"r{index}"
    return ("replace", parent, attr, draw(st.sampled_from(sources)))


def _parametrize(draw: Draw, world: AfterWorld, real: set[str], index: int) -> Step | None:
    owners = [(path, name) for path in module_paths(world)
              for name in [*world.module(path)._parameters, *world.module(path)._buffers]
              if getattr(world.module(path), name, None) is not None]
    if not owners:
        return None
    path, name = draw(st.sampled_from(owners))
    return ("parametrize", path, name, draw(st.sampled_from(("double", "symmetric", "weight_norm"))))


AFTER_DRAWERS: dict[str, Callable[[Draw, AfterWorld, set[str], int], Step | None]] = {
    "cast": _cast, "load": _load, "reinit": _reinit, "draw": _draw, "seed": _seed, "save_rng": _save_rng,
    "restore_rng": _restore_rng, "new_linear": _new_linear, "new_from": _new_from,
    "second_model": _second_model, "copy_slot": _copy_slot, "replace": _replace, "parametrize": _parametrize,
    "set_data": _set_data,
}


def tensor_paths(world: AfterWorld) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the world by path ("model.t3", "n4.weight"), in order."""
    return {f"{top}.{name}": tensor for top, module in world.modules.items()
            for name, tensor in module.state_dict(keep_vars=True).items()}


def module_paths(world: AfterWorld) -> list[str]:
    return [f"{top}.{name}" if name else top for top, module in world.modules.items()
            for name, _ in module.named_modules()]


def _views_a_parameter(module: nn.Module) -> bool:
    """Whether a parameter shares its storage with another tensor of the module (not a tie)."""
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}.values()
    parameters = {t.untyped_storage()._cdata for t in module.parameters()}
    storages = [t.untyped_storage()._cdata for t in tensors]
    return any(storages.count(s) > 1 for s in parameters)


class EagerWorld(AfterWorld):
    """An eager world that also knows the storages of the tensors passed in, and the global RNG
    state its steps left (each step runs under `fork_rng` from there)."""

    external_storages: set[int]
    rng: torch.Tensor


def _try_step(world: EagerWorld, step: Step) -> bool:
    """Run `step` on the eager world; False when eager refuses it."""
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_rng_state(world.rng)
        try:
            run_after(world, [step])
        except Exception:
            return False
        world.rng = torch.get_rng_state()
    return True


def _eager_world(program: Program, after: list[Step]) -> EagerWorld:
    """The eager world after the (accepted) steps `after`."""
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(program.seed)
        externals = make_externals(program)
        world = EagerWorld(program, False, {"model": FuzzModule(program, externals)})
        world.rng = torch.get_rng_state()
    world.external_storages = {e.untyped_storage()._cdata for e in externals}  # by storage, empty ones too
    for step in after:
        if not _try_step(world, step):
            raise AssertionError(f"accepted step {step!r} failed on replay")
    return world
