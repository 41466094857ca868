"""Module paths as the diagrams read them: "" is the root, "layers.3.attn" is three levels down."""

from __future__ import annotations


def depth_of(path: str) -> int:
    """0 for the root, 1 for its children, ..."""
    return path.count(".") + 1 if path else 0


def parent_of(path: str) -> str:
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
