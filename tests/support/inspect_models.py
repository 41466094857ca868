"""Small hand-built modules whose inspection tables the tests spell out row by row.

`Tiny` has, in 13 names on 8 storages: a parameter made a view of a buffer by `.data = base[1:]`, a
registered view (non-persistent), an embedding tied to a linear head, a submodule shared under two
names, a `torch.tensor([...])` constant, a buffer computed from a module argument, an int64 buffer
and a float16 parameter. `OnCuda` records fakes on a CUDA device (no GPU needed).

Lines that create tensors end with `# line: <marker>`; `line_of(marker)` finds them, so the tests
can assert the exact source location without hard-coding line numbers.
"""

from __future__ import annotations

import torch
from torch import nn

FILE = __file__


def line_of(marker: str) -> int:
    """The line number of the line in this file ending with `# line: <marker>`."""
    with open(FILE) as source:
        hits = [number for number, line in enumerate(source, 1) if line.rstrip().endswith(f"# line: {marker}")]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times"
    return hits[0]


def where(marker: str, function: str = "__init__") -> str:
    """How the tables spell the source of a marked line: "file:line in function"."""
    return f"{FILE}:{line_of(marker)} in {function}"


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 2)  # line: proj


class Tiny(nn.Module):
    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.embed = nn.Embedding(4, 3)  # line: embed
        self.head = nn.Linear(3, 4, bias=False)  # line: head
        self.head.weight = self.embed.weight  # tied: the head's own weight is dropped
        self.block = Block()
        self.shared = self.block  # the same submodule under a second name
        self.register_buffer("base", torch.arange(6.0))  # line: base
        self.register_buffer("window", self.base[2:], persistent=False)  # line: window
        self.shift = nn.Parameter(torch.empty(5))  # line: shift
        self.shift.data = self.base[1:]  # line: shift.data
        self.register_buffer("const", torch.tensor([1.0, 2.0]))  # line: const
        self.register_buffer("scaled", table * 2)  # line: scaled
        self.register_buffer("steps", torch.arange(3))  # line: steps
        self.gain = nn.Parameter(torch.ones(2, dtype=torch.float16))  # line: gain


def table() -> torch.Tensor:
    """The module argument `Tiny` reads (an external tensor)."""
    return torch.arange(3.0)


# Names of `Tiny` in module order: the root's parameters, then its buffers, then each submodule's.
TINY_NAMES = [
    "shift", "gain", "base", "window", "const", "scaled", "steps", "embed.weight", "head.weight",
    "block.proj.weight", "block.proj.bias", "shared.proj.weight", "shared.proj.bias",
]


class OnCuda(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 3, device="cuda")  # line: cuda.lin
        self.register_buffer("mask", torch.zeros(4, dtype=torch.float16, device="cuda"))  # line: cuda.mask
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))  # line: cuda.count


class Kinds(nn.Module):
    """One op of each kind the ops table distinguishes."""

    def __init__(self) -> None:
        super().__init__()
        w = torch.zeros(2, 3)  # line: kinds.zeros
        w.add_(1)  # line: kinds.add_
        scale = torch.linspace(0, 1, 3)[1].item()  # line: kinds.item
        self.register_buffer("w", w * scale)  # line: kinds.mul
        self.p = nn.Parameter(torch.randn(2))  # line: kinds.randn
