"""Runs a `Program` inside a module constructor, so one program runs eagerly and under deferred_init.

`FuzzModule(program, externals)` is the module both sides build. The interpreter keeps a pool of
tensors (every tensor a step made, in order), a pool of Python scalars read by `.item()`, and the
module tree by path. It only calls public torch API, exactly as a hand-written constructor would.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

from tests.fuzz.program import Program, Step

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "gt": torch.gt, "lt": torch.lt, "eq": torch.eq,
}


def external_tensor(position: int, shape: tuple, dtype: str) -> torch.Tensor:
    """The real tensor of the `position`-th `external` step: same values on every call.

    Made outside the constructor (like a pretrained table passed in) from a private generator, so
    it never touches the global RNG.
    """
    generator = torch.Generator().manual_seed(1000 + position)
    return (torch.randint(-8, 8, shape, generator=generator) / 4).to(DTYPES[dtype])


def make_externals(program: Program) -> list[torch.Tensor]:
    """Fresh real tensors for the program's `external` steps (a new set for every run)."""
    externals = [s for s in program.steps if s[0] == "external"]
    return [external_tensor(position, shape, dtype) for position, (_, shape, dtype) in enumerate(externals)]


class Interpreter:
    """Executes steps one at a time against a root module (the constructor's `self`)."""

    def __init__(self, root: nn.Module, externals: Sequence[torch.Tensor]) -> None:
        self.root = root
        self.externals = list(externals)
        self.used_externals = 0
        self.pool: list[torch.Tensor] = []
        self.generators: dict[int, torch.Generator] = {}  # the constructor's own, by index
        self.saved_states: list[torch.Tensor] = []  # torch.get_rng_state() results, by save_rng
        self.scalars: list[Any] = []
        self.modules: dict[str, nn.Module] = {"": root}
        self.grad = torch.is_grad_enabled()
        self.inference = torch.is_inference_mode_enabled()

    def run(self, steps: Sequence[Step]) -> None:
        for step in steps:
            self.step(step)

    def step(self, step: Step) -> None:
        """Run one step in this program's grad and inference modes; the caller's modes are kept."""
        handler: Callable[..., Any] = getattr(self, "op_" + step[0])
        with torch.inference_mode(self.inference), torch.set_grad_enabled(self.grad):
            handler(*step[1:])

    # -- operands ----------------------------------------------------------------------------
    def operand(self, operand: tuple) -> Any:
        kind, value = operand
        if kind == "value":
            return value
        if kind == "read":
            return self.scalars[value]
        if kind == "tensor":
            return self.pool[value]
        raise ValueError(f"unknown operand {operand!r}")

    def add(self, tensor: torch.Tensor) -> None:
        self.pool.append(tensor)

    # -- factories ---------------------------------------------------------------------------
    def op_ones(self, shape: tuple, dtype: str) -> None:
        self.add(torch.ones(shape, dtype=DTYPES[dtype]))

    def op_zeros(self, shape: tuple, dtype: str) -> None:
        self.add(torch.zeros(shape, dtype=DTYPES[dtype]))

    def op_arange(self, n: int, dtype: str) -> None:
        self.add(torch.arange(n, dtype=DTYPES[dtype]))

    def op_empty_fill(self, shape: tuple, dtype: str, value: tuple) -> None:
        self.add(torch.empty(shape, dtype=DTYPES[dtype]).fill_(self.operand(value)))

    def op_rand(self, shape: tuple, dtype: str) -> None:
        self.add(torch.rand(shape, dtype=DTYPES[dtype]))

    def op_randn(self, shape: tuple, dtype: str) -> None:
        self.add(torch.randn(shape, dtype=DTYPES[dtype]))

    def op_randint(self, low: int, high: int, shape: tuple, dtype: str) -> None:
        self.add(torch.randint(low, high, shape, dtype=DTYPES[dtype]))

    def op_randperm(self, n: int, dtype: str) -> None:
        self.add(torch.randperm(n, dtype=DTYPES[dtype]))

    def op_external(self, shape: tuple, dtype: str) -> None:
        tensor = self.externals[self.used_externals]
        self.used_externals += 1
        self.add(tensor)

    def op_constant(self, values: Any, dtype: str) -> None:
        self.add(torch.tensor(values, dtype=DTYPES[dtype]))

    # -- compute -----------------------------------------------------------------------------
    def op_binary(self, name: str, a: int, operand: tuple) -> None:
        self.add(BINARY[name](self.pool[a], self.operand(operand)))

    def op_binary_out(self, name: str, a: int, operand: tuple, out: int) -> None:
        BINARY[name](self.pool[a], self.operand(operand), out=self.pool[out])

    def op_clone(self, a: int) -> None:
        self.add(self.pool[a].clone())

    def op_to(self, a: int, dtype: str) -> None:
        self.add(self.pool[a].to(DTYPES[dtype]))

    # -- views -------------------------------------------------------------------------------
    def op_view(self, a: int, shape: tuple) -> None:
        self.add(self.pool[a].view(shape))

    def op_reshape(self, a: int, shape: tuple) -> None:
        self.add(self.pool[a].reshape(shape))

    def op_transpose(self, a: int, dim0: int, dim1: int) -> None:
        self.add(self.pool[a].transpose(dim0, dim1))

    def op_slice(self, a: int, dim: int, start: int, stop: int, step: int) -> None:
        index = (slice(None),) * dim + (slice(start, stop, step),)
        self.add(self.pool[a][index])

    def op_select(self, a: int, dim: int, index: int) -> None:
        self.add(self.pool[a].select(dim, index))

    def op_narrow(self, a: int, dim: int, start: int, length: int) -> None:
        self.add(self.pool[a].narrow(dim, start, length))

    def op_expand(self, a: int, shape: tuple) -> None:
        self.add(self.pool[a].expand(shape))

    def op_unbind(self, a: int, dim: int) -> None:
        for part in self.pool[a].unbind(dim):
            self.add(part)

    def op_diagonal(self, a: int, offset: int, dim1: int, dim2: int) -> None:
        self.add(self.pool[a].diagonal(offset, dim1, dim2))

    def op_as_strided(self, a: int, size: tuple, stride: tuple, offset: int) -> None:
        self.add(self.pool[a].as_strided(size, stride, offset))

    def op_data(self, a: int) -> None:
        self.add(self.pool[a].data)

    def op_detach(self, a: int) -> None:
        self.add(self.pool[a].detach())

    # -- in place ----------------------------------------------------------------------------
    def op_add_(self, a: int, operand: tuple) -> None:
        self.pool[a].add_(self.operand(operand))

    def op_mul_(self, a: int, operand: tuple) -> None:
        self.pool[a].mul_(self.operand(operand))

    def op_copy_(self, a: int, source: int) -> None:
        self.pool[a].copy_(self.pool[source])

    def op_fill_(self, a: int, operand: tuple) -> None:
        self.pool[a].fill_(self.operand(operand))

    def op_zero_(self, a: int) -> None:
        self.pool[a].zero_()

    def op_uniform_(self, a: int, low: float, high: float) -> None:
        self.pool[a].uniform_(low, high)

    def op_normal_(self, a: int, mean: float, std: float) -> None:
        self.pool[a].normal_(mean, std)

    def own_generator(self, index: int) -> torch.Generator:
        """The constructor's own generator `index`, made and seeded at its first use."""
        if index not in self.generators:
            self.generators[index] = torch.Generator().manual_seed(500 + index)
        return self.generators[index]

    def op_own_randn(self, shape: tuple, dtype: str, generator: int) -> None:
        self.add(torch.randn(shape, dtype=DTYPES[dtype], generator=self.own_generator(generator)))

    def op_own_uniform_(self, a: int, low: float, high: float, generator: int) -> None:
        self.pool[a].uniform_(low, high, generator=self.own_generator(generator))

    def op_own_normal_(self, a: int, mean: float, std: float, generator: int) -> None:
        self.pool[a].normal_(mean, std, generator=self.own_generator(generator))

    def op_index_put_(self, a: int, indices: tuple, operand: tuple, accumulate: bool) -> None:
        target = self.pool[a]
        values = self.operand(operand)
        if not isinstance(values, torch.Tensor):
            values = torch.tensor(values, dtype=target.dtype)
        target.index_put_(tuple(torch.tensor(list(i), dtype=torch.int64) for i in indices), values, accumulate)

    def op_masked_fill_(self, a: int, mask: tuple, operand: tuple) -> None:
        kind, value = mask
        mask_tensor = self.pool[value] if kind == "tensor" else torch.tensor(value, dtype=torch.bool)
        self.pool[a].masked_fill_(mask_tensor, self.operand(operand))

    def op_set_data(self, a: int, source: int) -> None:
        self.pool[a].data = self.pool[source]

    def op_init(self, name: str, a: int, *args: Any) -> None:
        getattr(nn.init, name + "_")(self.pool[a], *args)

    def op_inplace_view(self, name: str, a: int, *args: Any) -> None:
        getattr(self.pool[a], name)(*args)

    # -- modules -----------------------------------------------------------------------------
    def op_param(self, a: int, requires_grad: bool) -> None:
        self.add(nn.Parameter(self.pool[a], requires_grad=requires_grad))

    def op_submodule(self, parent: str, name: str) -> None:
        child = nn.Module()
        setattr(self.modules[parent], name, child)
        self.modules[_join(parent, name)] = child

    def op_share_module(self, source: str, parent: str, name: str) -> None:
        setattr(self.modules[parent], name, self.modules[source])
        self.modules[_join(parent, name)] = self.modules[source]

    def op_register_parameter(self, path: str, name: str, a: int) -> None:
        self.modules[path].register_parameter(name, self.pool[a])

    def op_register_buffer(self, path: str, name: str, a: int, persistent: bool) -> None:
        self.modules[path].register_buffer(name, self.pool[a], persistent=persistent)

    # -- other -------------------------------------------------------------------------------
    def op_item(self, a: int, flat_index: int) -> None:
        value = self.pool[a].reshape(-1)[flat_index].item()
        self.scalars.append(value)
        self.root.values_read.append(value)

    def op_tolist(self, a: int) -> None:
        self.root.values_read.append(self.pool[a].tolist())

    def op_data_dependent(self, name: str, a: int) -> None:
        """An op whose output shape depends on the values (computed for real under deferred_init)."""
        tensor = self.pool[a]
        if name == "nonzero":
            self.add(tensor.nonzero())
        elif name == "unique":
            self.add(torch.unique(tensor))
        else:  # "positive": boolean-mask indexing
            self.add(tensor[tensor > 0])

    def op_reseed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def op_save_rng(self) -> None:
        self.saved_states.append(torch.get_rng_state())

    def op_restore_rng(self, index: int) -> None:
        torch.set_rng_state(self.saved_states[index])

    def op_grad(self, enabled: bool) -> None:
        self.grad = enabled

    def op_inference(self, enabled: bool) -> None:
        self.inference = enabled


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


class FuzzModule(nn.Module):
    """The module whose constructor is the program. `values_read` lists what `.item()` returned."""

    def __init__(self, program: Program, externals: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.values_read: list[Any] = []
        Interpreter(self, externals).run(program.steps)
