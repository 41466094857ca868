"""How the explorer spells things, in one place: module paths, dtypes and byte sizes and spans.

Module paths: "" is the root, "layers.3.attn" is three levels down. Every table, diagram and widget
reads paths, dtype names and byte counts through these helpers, so they agree with each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` → "float32": how every table spells a dtype."""
    return str(dtype).removeprefix("torch.")


def dtype_named(name: str) -> torch.dtype:
    """The dtype a table's name spells, "float32" → `torch.float32`: the inverse of `dtype_name`.
    ValueError names a string that is not a torch dtype."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype name (as `dtype_name` spells them: 'float32', 'bfloat16')")
    return dtype


def format_bytes(count: int) -> str:
    """1023 → "1023 B", 1536 → "1.5 KiB", 7 * 2**30 → "7.0 GiB" (binary units, one decimal)."""
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in _UNITS:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.1f} {unit}"


def byte_span(shape: Sequence[int], stride: Sequence[int], storage_offset: int, itemsize: int) -> tuple[int, int]:
    """The bytes `[start, end)` of its storage that a strided layout reaches: from its first element
    to the end of the last one (a view skipping elements still spans the gaps between them). A
    layout with no elements reaches nothing: `(start, start)`. Strides are in elements, as torch's."""
    start = storage_offset * itemsize
    if any(size == 0 for size in shape):
        return start, start
    last = sum((size - 1) * step for size, step in zip(shape, stride))
    return start, start + (last + 1) * itemsize


def depth_of(path: str) -> int:
    """0 for the root, 1 for its children, ..."""
    return path.count(".") + 1 if path else 0


def parent_of(path: str) -> str:
    """The parent's path: "a.b.c" → "a.b", "a" → "" (the root); the root is its own parent."""
    return path.rpartition(".")[0]


def parent_path(path: str) -> str | None:
    """The parent's path: "a.b.c" → "a.b", "a" → "" (the root), "" → None (the root has no parent)."""
    if path == "":
        return None
    return path.rpartition(".")[0]


def is_inside(path: str, module: str) -> bool:
    """`path` is `module` or below it (everything is inside the root "")."""
    return not module or path == module or path.startswith(module + ".")


def is_repeat_slot(path: str) -> bool:
    """A module registered under a number (`layers.3`): an item of a ModuleList or Sequential.

    Only these fold into "Class ×N": `q_proj` and `k_proj` of the same shape are different things
    and keep their names.
    """
    return path.rpartition(".")[2].isdigit()


def common_module(paths: list[str]) -> str:
    """The innermost module path containing all of `paths` ("" for the root)."""
    parts = paths[0].split(".") if paths[0] else []
    for path in paths[1:]:
        other = path.split(".") if path else []
        common = 0
        while common < len(parts) and common < len(other) and parts[common] == other[common]:
            common += 1
        del parts[common:]
        if not parts:
            break
    return ".".join(parts)


class ModuleGroup(NamedTuple):
    """Rows `start` to `stop` (exclusive) of a list of tensor names, all under module `prefix`."""

    prefix: str
    start: int
    stop: int


def group_prefix(name: str) -> str:
    """The module a tensor's row is grouped under: its name less the last two parts, the module
    that holds the tensor's module ("model.layers.3.self_attn.q_proj.weight" →
    "model.layers.3.self_attn"; "embed.weight" → "", the root).

    Not the tensor's own module: that usually holds one or two tensors, so its groups would be
    single rows, or rows reading only `weight` and `bias`. One level up, the rows read
    `q_proj.weight`, `k_proj.weight`: the sibling modules a person tells apart.
    """
    return parent_of(parent_of(name))


def module_groups(names: Sequence[str]) -> list[ModuleGroup]:
    """Runs of consecutive `names` with the same non-root `group_prefix`, of two rows or more, in
    order. Names sorted by module (or by name) give one run per module; rows scattered by another
    sort give few runs, and a name alone or under the root is in none."""
    groups = []
    start = 0
    for stop in range(1, len(names) + 1):
        prefix = group_prefix(names[start])
        if stop < len(names) and group_prefix(names[stop]) == prefix:
            continue
        if prefix and stop - start >= 2:
            groups.append(ModuleGroup(prefix, start, stop))
        start = stop
    return groups


ELLIPSIS = "…"


def short_path(name: str, width: int) -> str:
    """`name` in at most `width` characters, keeping what tells it from its siblings.

    The rule (widgets/short_path.js is a port of it; tests/support/short_path_cases.json is the
    spec both sides test):

    - A name that fits is returned unchanged.
    - Every numeric part (a layer index: the `17` of `model.layers.17.mlp`) and the last part are
      always kept, even when they alone do not fit: the caller's box then clips the tail. An index
      is what tells the 24 rows of 24 layers apart, so no width drops one.
    - The other parts are added back while the result fits, in this order: the second-to-last part
      (`q_proj` of `q_proj.weight`), the part naming each index's container (`layers`), right to
      left, the first part, then the rest, right to left.
    - Each run of left-out parts becomes one "…" standing for those parts and the dots after them:
      `a.b.c.d` without `b` and `c` reads `a.…d`.

    `model.layers.17.self_attn.q_proj.weight` at 30 → `model.layers.17.…q_proj.weight`, at 24 →
    `model.…17.…q_proj.weight`, at 12 → `…17.…weight`.
    """
    if len(name) <= width:
        return name
    parts = name.split(".")
    kept = {i for i, part in enumerate(parts) if _is_index(part)} | {len(parts) - 1}
    for i in _keep_order(parts):
        if i not in kept and len(_joined(parts, kept | {i})) <= width:
            kept.add(i)
    return _joined(parts, kept)


def _is_index(part: str) -> bool:
    return part.isascii() and part.isdigit()  # ASCII digits only, as the JS port's /^[0-9]+$/


def _keep_order(parts: list[str]) -> list[int]:
    # second-to-last, index containers right to left, first, the rest right to left
    last = len(parts) - 1
    containers = [i - 1 for i in range(last, 0, -1) if _is_index(parts[i]) and not _is_index(parts[i - 1])]
    order = [last - 1, *containers, 0, *range(last - 1, 0, -1)]
    return [i for n, i in enumerate(order) if 0 <= i < last and i not in order[:n]]


def _joined(parts: list[str], kept: set[int]) -> str:
    text, elided = "", False
    for i, part in enumerate(parts):
        if i not in kept:
            elided = True
            continue
        text += ("." if text else "") + (ELLIPSIS if elided else "") + part
        elided = False
    return text
