"""A constructor program as plain data: what the fuzzer generates, shrinks and prints.

A `Program` is a tuple of steps; each step is a tuple `(op, *arguments)` of Python literals, so a
failing program found by hypothesis can be pasted verbatim into a regression test. Tensors are
referred to by their position in the interpreter's tensor pool (the order they were made), scalars
read by `.item()` by their position in the scalar pool, modules by dotted path ("" is the root).

`("init", name, t, *args)` runs `torch.nn.init.<name>_(t, *args)`; `("inplace_view", name, t, *args)`
runs `t.<name>(*args)` (t_, transpose_, unsqueeze_, squeeze_, as_strided_, resize_); `("binary_out", op, a,
operand, out)` writes `torch.<op>(a, operand, out=out)`. `("own_randn", shape, dtype, g)`,
`("own_uniform_", t, low, high, g)` and `("own_normal_", t, mean, std, g)` draw from the
constructor's own generator g (0 or 1), made and seeded at its first use. `("reseed", s)` runs
`torch.manual_seed(s)`, `("save_rng",)` keeps `torch.get_rng_state()` and `("restore_rng", i)` sets
the i-th state kept back (a rewind).

Operands of in-place and arithmetic steps are tagged tuples:
    ("value", 2.5)    a Python number
    ("read", 0)       the scalar that the first `item` step read
    ("tensor", 3)     pool tensor 3
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Step = tuple[Any, ...]

FLOATS = ("float32", "float64", "float16", "bfloat16")  # the floating dtypes programs use
FACTORY_OPS = ("ones", "zeros", "arange", "empty_fill", "rand", "randn", "randint", "randperm", "external", "constant",
               "own_randn")
COMPUTE_OPS = ("binary", "binary_out", "clone", "to")
VIEW_OPS = ("view", "reshape", "transpose", "slice", "select", "narrow", "expand", "unbind", "diagonal",
            "as_strided", "data", "detach")
INPLACE_OPS = ("add_", "mul_", "copy_", "fill_", "zero_", "uniform_", "normal_", "index_put_", "masked_fill_",
               "set_data", "init", "inplace_view", "own_uniform_", "own_normal_")
MODULE_OPS = ("param", "submodule", "share_module", "register_parameter", "register_buffer")
OTHER_OPS = ("item", "tolist", "grad", "inference", "data_dependent", "reseed", "save_rng", "restore_rng")
ALL_OPS = FACTORY_OPS + COMPUTE_OPS + VIEW_OPS + INPLACE_OPS + MODULE_OPS + OTHER_OPS
# Done to the built module and around it, after construction (eagerly, or to the deferred module
# before it is materialized); tests/fuzz/after.py says what each does.
AFTER_MODEL_OPS = ("cast", "load", "reinit", "set_data")
AFTER_RNG_OPS = ("draw", "seed", "save_rng", "restore_rng")
AFTER_WORLD_OPS = ("new_linear", "new_from", "second_model", "copy_slot", "replace", "parametrize")
AFTER_OPS = AFTER_MODEL_OPS + AFTER_RNG_OPS + AFTER_WORLD_OPS


@dataclass(frozen=True)
class Program:
    """Steps run, in order, inside one module constructor (eagerly or under deferred_init).

    `seed` is the global RNG seed set before construction, so eager and deferred draw the same
    random numbers.
    """

    steps: tuple[Step, ...]
    seed: int = 0
    after: tuple[Step, ...] = ()

    def __post_init__(self) -> None:
        for step in self.steps:
            if not step or step[0] not in ALL_OPS:
                raise ValueError(f"unknown step {step!r}")
        for step in self.after:
            if not step or step[0] not in AFTER_OPS:
                raise ValueError(f"unknown step after construction {step!r}")

    def __repr__(self) -> str:
        lines = "".join(f"\n    {step!r}," for step in self.steps)
        after = "".join(f"\n    {step!r}," for step in self.after)
        after = f", after=({after}\n)" if self.after else ""
        return f"Program(seed={self.seed}, steps=({lines}\n){after})"

    def count(self, ops: tuple[str, ...]) -> int:
        """How many steps use one of `ops` (for hypothesis statistics)."""
        return sum(step[0] in ops for step in self.steps)


@dataclass(frozen=True)
class Plan:
    """How a deferred module is materialized piece by piece, then completed by one final call.

    Actions, in order:
        ("tensor", "a.t3")          materialize_tensor on that slot, written back into the slot
        ("subtree", "a", False)     materialize_module(module "a", buffers_only=False)
        ("own", "a")                materialize_module(root, check_fn=lambda m: m is module "a")
    """

    actions: tuple[tuple[Any, ...], ...]

    def __repr__(self) -> str:
        return f"Plan(actions={self.actions!r})"
