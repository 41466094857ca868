"""Hypothesis strategies: random constructor programs and random materialization plans.

A program is grown one step at a time against a `Simulator`, an eager run of the program so far
from the same seed. Each candidate step is drawn from what the pool holds now (shapes, dtypes,
which tensors are parameters or alias an external tensor), run eagerly, and kept only if eager
construction accepts it. So every generated program is a valid eager constructor, and eager and
deferred can be compared on all of it.

Writes into external tensors (or their views) are never generated in the constructor: deferred_init
refuses them by design (tests/explorer/test_bad_input.py pins that error), so tests/fuzz/refusals.py
counts that refusal at construction as a failure. The steps after construction are drawn by
generate_after.py.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from hypothesis import strategies as st
from torch import nn

from tests.fuzz.generate_after import after_construction
from tests.fuzz.interpreter import Interpreter, external_tensor
from tests.fuzz.program import (
    COMPUTE_OPS,
    FACTORY_OPS,
    FLOATS,
    INPLACE_OPS,
    MODULE_OPS,
    OTHER_OPS,
    VIEW_OPS,
    Plan,
    Program,
    Step,
)

ALL_DTYPES = FLOATS + ("int64", "int32", "bool")
SIZES = (1, 2, 3, 4, 2, 3, 0)
LITERALS = (1, 0, -1, 2, 3, 0.5, -1.5, 2.25)
INITS = ("kaiming_uniform", "trunc_normal", "xavier_normal", "orthogonal", "constant", "eye", "dirac", "ones")

Draw = Callable[[st.SearchStrategy], Any]


class Simulator:
    """The eager state of a program being generated: its pool, modules, RNG and accepted steps."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.steps: list[Step] = []
        self._start()

    def _start(self) -> None:
        self.root = nn.Module()
        self.root.values_read = []
        self.interp = Interpreter(self.root, [])
        self.external_storages: set[int] = set()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.rng = torch.get_rng_state()

    @property
    def pool(self) -> list[torch.Tensor]:
        return self.interp.pool

    def aliases_external(self, index: int) -> bool:
        return self.pool[index].untyped_storage()._cdata in self.external_storages

    def writable(self) -> list[int]:
        return [i for i in range(len(self.pool)) if not self.aliases_external(i)]

    def _layouts(self) -> list[tuple]:
        return [(t.shape, t.stride(), t.storage_offset(), t.untyped_storage().nbytes()) for t in self.pool]

    def try_step(self, step: Step) -> bool:
        """Run `step` eagerly; keep it if it succeeds, otherwise undo it and report False."""
        if self._run(step):
            self.steps.append(step)
            return True
        return False

    def _run(self, step: Step) -> bool:
        interp = self.interp
        before = (len(interp.pool), len(interp.scalars), len(self.root.values_read), dict(interp.modules),
                  len(interp.saved_states))
        own_states = {index: generator.get_state() for index, generator in interp.generators.items()}
        layouts = self._layouts()
        if step[0] == "external":
            interp.externals.append(external_tensor(len(interp.externals), step[1], step[2]))
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.set_rng_state(self.rng)
            try:
                interp.step(step)
            except Exception:
                del interp.pool[before[0]:], interp.scalars[before[1]:], self.root.values_read[before[2]:]
                interp.modules = before[3]
                del interp.saved_states[before[4]:]
                interp.generators = {i: g for i, g in interp.generators.items() if i in own_states}
                for index, state in own_states.items():
                    interp.generators[index].set_state(state)
                if step[0] == "external":
                    interp.externals.pop()
                if self._layouts() != layouts:
                    self._replay()  # the failing op changed a layout before raising (resize_ does)
                return False
            self.rng = torch.get_rng_state()
        if step[0] == "external":
            interp.used_externals = len(interp.externals)
            self.external_storages.add(interp.pool[-1].untyped_storage()._cdata)
        return True

    def _replay(self) -> None:
        """Rebuild the eager state from the accepted steps."""
        self._start()
        for step in self.steps:
            if not self._run(step):
                raise AssertionError(f"accepted step {step!r} failed on replay")


# -- pieces ----------------------------------------------------------------------------------
def shapes(max_dims: int = 3) -> st.SearchStrategy:
    return st.lists(st.sampled_from(SIZES), max_size=max_dims).map(tuple)


def _prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


def reshape_target(draw: Draw, numel: int) -> tuple:
    """A shape with `numel` elements, sometimes with one -1."""
    if numel == 0:
        return draw(st.sampled_from([(0,), (-1,), (0, 2), (2, 0, 1)]))
    factors = _prime_factors(numel)
    ndim = draw(st.integers(1 if factors else 0, 3))
    dims = [1] * ndim
    for factor in factors:
        dims[draw(st.integers(0, ndim - 1))] *= factor
    if ndim and draw(st.booleans()):
        dims[draw(st.integers(0, ndim - 1))] = -1
    return tuple(dims)


def scalar_operand(draw: Draw, sim: Simulator) -> tuple:
    if sim.interp.scalars and draw(st.integers(0, 3)) == 0:
        return ("read", draw(st.integers(0, len(sim.interp.scalars) - 1)))
    return ("value", draw(st.sampled_from(LITERALS)))


def broadcastable_to(sim: Simulator, shape: torch.Size) -> list[int]:
    """Pool tensors whose shape broadcasts to `shape` (so they can be a right-hand side)."""
    found = []
    for index, tensor in enumerate(sim.pool):
        try:
            if torch.broadcast_shapes(tensor.shape, shape) == shape:
                found.append(index)
        except RuntimeError:
            pass
    return found


def tensor_or_scalar(draw: Draw, sim: Simulator, shape: torch.Size) -> tuple:
    candidates = broadcastable_to(sim, shape)
    if candidates and draw(st.booleans()):
        return ("tensor", draw(st.sampled_from(candidates)))
    return scalar_operand(draw, sim)


def pick(draw: Draw, sim: Simulator) -> int:
    return draw(st.integers(0, len(sim.pool) - 1))


def constant_values(draw: Draw, shape: tuple, dtype: str) -> Any:
    numel = 1
    for size in shape:
        numel *= size
    if dtype == "bool":
        element = st.booleans()
    elif dtype.startswith("int"):
        element = st.integers(-3, 5)
    else:
        element = st.sampled_from(LITERALS)
    flat = draw(st.lists(element, min_size=numel, max_size=numel))
    dtype_ = torch.bool if dtype == "bool" else (torch.int64 if dtype.startswith("int") else torch.float64)
    return torch.tensor(flat, dtype=dtype_).reshape(shape).tolist()


# -- one drawer per step kind: returns a step, or None when the pool cannot feed it ------------
def _factory(draw: Draw, sim: Simulator, op: str) -> Step:
    if op in ("ones", "zeros"):
        return (op, draw(shapes()), draw(st.sampled_from(ALL_DTYPES)))
    if op == "arange":
        return (op, draw(st.integers(0, 8)), draw(st.sampled_from(("int64", "float32", "float64"))))
    if op == "empty_fill":
        return (op, draw(shapes()), draw(st.sampled_from(ALL_DTYPES)), scalar_operand(draw, sim))
    if op in ("rand", "randn"):
        return (op, draw(shapes()), draw(st.sampled_from(FLOATS)))
    if op == "own_randn":
        return (op, draw(shapes()), draw(st.sampled_from(FLOATS)), draw(st.integers(0, 1)))
    if op == "randint":
        low = draw(st.integers(-3, 2))
        return (op, low, low + draw(st.integers(1, 6)), draw(shapes()),
                draw(st.sampled_from(("int64", "int32", "float32"))))
    if op == "randperm":
        return (op, draw(st.integers(0, 6)), draw(st.sampled_from(("int64", "float32"))))
    if op == "external":
        return (op, draw(shapes()), draw(st.sampled_from(("float32", "float64", "int64"))))
    shape, dtype = draw(shapes(2)), draw(st.sampled_from(ALL_DTYPES))
    return ("constant", constant_values(draw, shape, dtype), dtype)


def _compute(draw: Draw, sim: Simulator, op: str) -> Step | None:
    a = pick(draw, sim)
    if op in ("binary", "binary_out"):
        step = (op, draw(st.sampled_from(("add", "sub", "mul", "gt", "lt", "eq"))), a,
                tensor_or_scalar(draw, sim, sim.pool[a].shape))
        if op == "binary":
            return step
        # Only outputs of the result's shape or empty ones: resizing a non-empty output is deprecated.
        kind, value = step[3]
        shape = torch.broadcast_shapes(sim.pool[a].shape, sim.pool[value].shape if kind == "tensor" else ())
        outs = [i for i in sim.writable() if sim.pool[i].shape == shape or sim.pool[i].numel() == 0]
        return (*step, draw(st.sampled_from(outs))) if outs else None
    if op == "clone":
        return (op, a)
    return (op, a, draw(st.sampled_from(ALL_DTYPES)))


def _view(draw: Draw, sim: Simulator, op: str, a: int | None = None) -> Step | None:
    a = pick(draw, sim) if a is None else a
    tensor = sim.pool[a]
    shape, ndim = tuple(tensor.shape), tensor.dim()
    if op in ("view", "reshape"):
        return (op, a, reshape_target(draw, tensor.numel()))
    if op in ("data", "detach"):
        return (op, a)
    if op == "expand":
        target = [draw(st.sampled_from((1, 2, 3))) if size == 1 else draw(st.sampled_from((size, -1)))
                  for size in shape]
        if draw(st.booleans()):
            target.insert(0, draw(st.integers(1, 3)))
        return (op, a, tuple(target))
    if op == "as_strided":
        numel = tensor.untyped_storage().nbytes() // tensor.element_size()
        size = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
        stride = tuple(draw(st.lists(st.integers(0, 4), min_size=len(size), max_size=len(size))))
        extent = sum((s - 1) * d for s, d in zip(size, stride))
        if extent >= numel:
            return None
        return (op, a, size, stride, draw(st.integers(0, numel - 1 - extent)))
    if ndim == 0:
        return None
    dim = draw(st.integers(0, ndim - 1))
    size = shape[dim]
    if op == "transpose":
        return (op, a, dim, draw(st.integers(-ndim, ndim - 1)))
    if op == "slice":
        start = draw(st.integers(0, size))
        return (op, a, dim, start, draw(st.integers(start, size)), draw(st.sampled_from((1, 2))))
    if op == "select":
        return (op, a, dim, draw(st.integers(-size, size - 1))) if size else None
    if op == "narrow":
        start = draw(st.integers(0, size))
        return (op, a, dim, start, draw(st.integers(0, size - start)))
    if op == "unbind":
        return (op, a, dim) if size <= 4 else None
    if ndim < 2:
        return None  # diagonal
    other = (dim + draw(st.integers(1, ndim - 1))) % ndim
    return (op, a, draw(st.integers(-2, 2)), dim, other)


def _inplace(draw: Draw, sim: Simulator, op: str) -> Step | None:
    writable = sim.writable()
    if not writable:
        return None
    a = draw(st.sampled_from(writable))
    target = sim.pool[a]
    if op in ("add_", "mul_"):
        return (op, a, tensor_or_scalar(draw, sim, target.shape))
    if op == "copy_":
        sources = broadcastable_to(sim, target.shape)
        return (op, a, draw(st.sampled_from(sources))) if sources else None
    if op == "fill_":
        zero_dim = [i for i, t in enumerate(sim.pool) if t.dim() == 0]
        if zero_dim and draw(st.integers(0, 3)) == 0:
            return (op, a, ("tensor", draw(st.sampled_from(zero_dim))))
        return (op, a, scalar_operand(draw, sim))
    if op == "zero_":
        return (op, a)
    if op == "uniform_":
        low = draw(st.sampled_from((-1.0, 0.0, 0.5)))
        return (op, a, low, low + draw(st.sampled_from((0.5, 1.0, 2.0))))
    if op == "normal_":
        return (op, a, draw(st.sampled_from((0.0, 1.0, -2.0))), draw(st.sampled_from((0.02, 1.0, 3.0))))
    if op == "own_uniform_":
        return (op, a, draw(st.sampled_from((-1.0, 0.0))), 1.0, draw(st.integers(0, 1)))
    if op == "own_normal_":
        return (op, a, 0.0, draw(st.sampled_from((0.02, 1.0))), draw(st.integers(0, 1)))
    if op == "index_put_":
        shape = tuple(target.shape)
        if not shape or shape[0] == 0:
            return None
        count = draw(st.integers(1, 3))
        dims = 2 if len(shape) >= 2 and shape[1] > 0 and draw(st.booleans()) else 1
        indices = tuple(
            tuple(draw(st.lists(st.integers(-shape[d], shape[d] - 1), min_size=count, max_size=count)))
            for d in range(dims)
        )
        values = tensor_or_scalar(draw, sim, torch.Size((count, *shape[dims:])))
        return (op, a, indices, values, draw(st.booleans()))
    if op == "masked_fill_":
        masks = [i for i in broadcastable_to(sim, target.shape) if sim.pool[i].dtype == torch.bool]
        if masks and draw(st.booleans()):
            mask: tuple = ("tensor", draw(st.sampled_from(masks)))
        else:
            mask = ("const", constant_values(draw, tuple(target.shape), "bool"))
        return (op, a, mask, scalar_operand(draw, sim))
    if op == "init":
        name = draw(st.sampled_from(INITS))
        args = {"kaiming_uniform_": (draw(st.sampled_from((0.0, 5 ** 0.5))),),
                "trunc_normal_": (0.0, draw(st.sampled_from((0.02, 1.0)))),
                "xavier_normal_": (draw(st.sampled_from((1.0, 0.5))),),
                "orthogonal_": (draw(st.sampled_from((1.0, 2.0))),),
                "constant_": (draw(st.sampled_from(LITERALS)),)}.get(name + "_", ())
        return (op, name, a, *args)
    if op == "inplace_view":
        ndim = target.dim()
        name = draw(st.sampled_from(("t_", "transpose_", "unsqueeze_", "squeeze_", "as_strided_", "resize_")))
        if name == "resize_":
            # Within the storage: growing it would expose uninitialized memory (different each run).
            room = target.untyped_storage().nbytes() // target.element_size() - target.storage_offset()
            return (op, name, a, reshape_target(draw, draw(st.integers(0, max(room, 0)))))
        if name == "transpose_":
            return (op, name, a, draw(st.integers(-max(ndim, 1), max(ndim, 1) - 1)),
                    draw(st.integers(-max(ndim, 1), max(ndim, 1) - 1)))
        if name == "unsqueeze_":
            return (op, name, a, draw(st.integers(-ndim - 1, ndim)))
        if name == "as_strided_":
            step = _view(draw, sim, "as_strided", a)
            return None if step is None else (op, name, a, *step[2:])
        return (op, name, a)
    source = draw(st.sampled_from(writable))  # set_data
    return (op, a, source)


def _module(draw: Draw, sim: Simulator, op: str) -> Step | None:
    paths = list(sim.interp.modules)
    name = f"{'m' if op in ('submodule', 'share_module') else 't'}{len(sim.steps)}"
    if op == "param":
        return (op, pick(draw, sim), draw(st.booleans()))
    if op == "submodule":
        return (op, draw(st.sampled_from(paths)), name)
    if op == "share_module":
        modules = sim.interp.modules
        source = draw(st.sampled_from(paths))
        parent = draw(st.sampled_from(paths))
        if not source or any(m is modules[parent] for m in modules[source].modules()):
            return None  # the root, or a cycle
        return (op, source, parent, name)
    if op == "register_parameter":
        params = [i for i, t in enumerate(sim.pool) if isinstance(t, nn.Parameter)]
        return (op, draw(st.sampled_from(paths)), name, draw(st.sampled_from(params))) if params else None
    return (op, draw(st.sampled_from(paths)), name, pick(draw, sim), draw(st.booleans()))


def _other(draw: Draw, sim: Simulator, op: str) -> Step | None:
    if op in ("grad", "inference"):
        return (op, draw(st.booleans()))
    if op == "reseed":
        return (op, draw(st.integers(0, 2**16)))
    if op == "save_rng":
        return (op,)
    if op == "restore_rng":
        saved = len(sim.interp.saved_states)
        return (op, draw(st.integers(0, saved - 1))) if saved else None
    a = pick(draw, sim)
    if op == "data_dependent":
        return (op, draw(st.sampled_from(("nonzero", "unique", "positive"))), a)
    if op == "tolist":
        return (op, a) if sim.pool[a].numel() <= 16 else None
    numel = sim.pool[a].numel()
    return (op, a, draw(st.integers(0, numel - 1))) if numel else None


# Which drawer makes each kind of step, and how often it is tried (in-place, module and value-read
# steps are where the engine keeps state, so they come up most).
DRAWERS: dict[str, Callable[[Draw, Simulator, str], Step | None]] = {
    **dict.fromkeys(FACTORY_OPS, _factory), **dict.fromkeys(COMPUTE_OPS, _compute),
    **dict.fromkeys(VIEW_OPS, _view), **dict.fromkeys(INPLACE_OPS, _inplace),
    **dict.fromkeys(MODULE_OPS, _module), **dict.fromkeys(OTHER_OPS, _other),
}
WEIGHTS: dict[str, int] = {
    **dict.fromkeys(FACTORY_OPS, 2), **dict.fromkeys(COMPUTE_OPS, 1), **dict.fromkeys(VIEW_OPS, 2),
    **dict.fromkeys(INPLACE_OPS, 3), **dict.fromkeys(MODULE_OPS, 3), "share_module": 1,
    "item": 3, "tolist": 1, "grad": 1, "inference": 1, "data_dependent": 2, "reseed": 1, "save_rng": 1,
    "restore_rng": 1,
}
_WEIGHTED = tuple(op for op, weight in WEIGHTS.items() for _ in range(weight))


@st.composite
def programs(draw: Draw, max_steps: int = 32) -> Program:
    """A valid eager constructor program of up to `max_steps` steps (plus final registrations)."""
    seed = draw(st.integers(0, 2**16))
    sim = Simulator(seed)
    # A "go on" draw before each step (not a drawn length) lets the shrinker end a program early.
    while len(sim.steps) < max_steps and draw(st.integers(0, 30)) > 0:
        op = draw(st.sampled_from(_WEIGHTED if sim.pool else FACTORY_OPS))
        step = DRAWERS[op](draw, sim, op)
        if step is not None:
            sim.try_step(step)
    # Register a few tensors at the end, so every program leaves state to compare.
    if not sim.pool:
        sim.try_step(("ones", (2,), "float32"))
    for _ in range(draw(st.integers(1, 3))):
        a = pick(draw, sim)
        path = draw(st.sampled_from(list(sim.interp.modules)))
        if isinstance(sim.pool[a], nn.Parameter):
            sim.try_step(("register_parameter", path, f"t{len(sim.steps)}", a))
        else:
            sim.try_step(("register_buffer", path, f"t{len(sim.steps)}", a, True))
    return Program(tuple(sim.steps), seed, after_construction(draw, Program(tuple(sim.steps), seed)))


def plans(names: list[str], paths: list[str]) -> st.SearchStrategy:
    """Random partial materializations over a module's slot names and module paths."""
    action = st.one_of(
        st.sampled_from(names).map(lambda name: ("tensor", name)),
        st.tuples(st.just("subtree"), st.sampled_from(paths), st.booleans()),
        st.tuples(st.just("own"), st.sampled_from(paths)),
    )
    return st.lists(action, max_size=len(names) + 2).map(lambda actions: Plan(tuple(actions)))
