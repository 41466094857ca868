"""Where in the user's code an op was issued, and which module constructors were running.

Capturing this for every recorded op must be cheap (a frame walk, no `inspect.stack()`), while the
module chain is only computed when an error message needs it.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import re
import sys
import traceback
from types import CodeType, FrameType, TracebackType

import torch

from ..graph import SourceLocation


def _typing_extensions_file() -> tuple[str, ...]:
    try:
        import typing_extensions
    except ImportError:  # not installed: nothing of it on the stack
        return ()
    return (typing_extensions.__file__,)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_EXPLORER_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # all of explorer/, not only record/
# Wrappers between the user's call and torch's: `with explorer.deferred():` (contextlib), and the
# `@deprecated` of typing_extensions that torch puts on functions (`quantize_dynamic`).
_WRAPPER_FILES = frozenset({contextlib.__file__, functools.__file__, *_typing_extensions_file()})
_ASSIGNMENT = re.compile(r"self\.(\w+)\s*(?::[^=]*)?=")


# Both keyed by id(code) with the code object kept in the value: hashing a code object hashes its
# bytecode and constants afresh each time (CPython does not cache it), and these are looked up for
# every frame of every recorded op. Holding the code object keeps its id from being reused.
_library_code: dict[int, tuple[CodeType, bool]] = {}
_locations: dict[tuple[int, int], tuple[CodeType, SourceLocation]] = {}


def _is_library_code(code: CodeType) -> bool:
    known = _library_code.get(id(code))
    if known is None or known[0] is not code:
        filename = code.co_filename
        known = _library_code[id(code)] = (
            code,
            filename.startswith(_TORCH_DIR) or filename.startswith(_EXPLORER_DIR) or filename in _WRAPPER_FILES,
        )
    return known[1]


def user_location(skip: int = 1) -> SourceLocation | None:
    """The innermost calling frame that belongs to neither torch nor the explorer."""
    library = _library_code
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None:
        code = frame.f_code
        known = library.get(id(code))  # inlined `_is_library_code`: this runs for every recorded op
        if known is None or known[0] is not code:
            if not _is_library_code(code):
                break
        elif not known[1]:
            break
        frame = frame.f_back
    if frame is None:
        return None
    code, line = frame.f_code, frame.f_lineno
    seen = _locations.get((id(code), line))
    if seen is None or seen[0] is not code:  # a constructor's lines repeat layer after layer: one record each
        seen = _locations[(id(code), line)] = (code, SourceLocation(code.co_filename, line, code.co_name))
    return seen[1]


def user_location_of(tb: TracebackType | None) -> SourceLocation | None:
    """The innermost frame of traceback `tb` that belongs to neither torch nor the explorer: where
    user code called what raised."""
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _is_library_code(code):
            found = SourceLocation(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return found


def building_modules(skip: int = 1) -> str:
    """The chain of `nn.Module.__init__` calls in progress, outermost first, e.g.

    ``Net.__init__ → self.encoder = Encoder(...) → Encoder.__init__ → self.proj = Linear(...)``
    shortened to ``Net.encoder(Encoder).proj(Linear)``. Only used for error messages.
    """
    frames: list[tuple[FrameType, int]] = []
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None:
        frames.append((frame, frame.f_lineno))
        frame = frame.f_back
    frames.reverse()
    return module_chain(frames)


def traceback_frames(tb: TracebackType | None) -> list[tuple[FrameType, int]]:
    """(frame, line being run) for each entry of the traceback `tb`, outermost first."""
    return list(traceback.walk_tb(tb))


def module_chain(frames: list[tuple[FrameType, int]]) -> str:
    """`Net.encoder(Encoder).proj(Linear)` for the module constructors among `frames` (outermost first)."""
    chain: list[tuple[str, str | None]] = []  # (class name, attribute being assigned in that init)
    for frame, line in frames:
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module):
                match = _ASSIGNMENT.search(linecache.getline(frame.f_code.co_filename, line))
                chain.append((type(owner).__name__, match.group(1) if match else None))
    if not chain:
        return "<no module under construction>"
    parts = [chain[0][0]]
    for (_, attribute), (cls, _) in zip(chain, chain[1:]):
        parts.append(f".{attribute}({cls})" if attribute else f" > {cls}")
    return "".join(parts)


def innermost_user_frame(frames: list[tuple[FrameType, int]]) -> SourceLocation | None:
    """Where the user's code was when the exception of `frames` was raised (torch/explorer skipped)."""
    for frame, line in reversed(frames):
        if not _is_library_code(frame.f_code):
            return SourceLocation(frame.f_code.co_filename, line, frame.f_code.co_name)
    return None


def module_being_built(tb: TracebackType | None) -> torch.nn.Module | None:
    """The outermost module whose `__init__` was running when the exception of the traceback `tb`
    was raised: the root of what the failed constructor had built so far (its submodules assigned
    up to the failing line). None when no module constructor was on the stack."""
    for frame, _ in traceback.walk_tb(tb):
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module):
                return owner
    return None
