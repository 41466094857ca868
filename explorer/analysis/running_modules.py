"""Which module's forward was running when a Python exception left it.

An error raised by a module's own Python code (BatchNorm's "expected more than 1 value per channel",
an argument check, an `assert`) passes through no op, so a dispatch mode never sees it, and
ModTracker's forward hooks run even on an exception (`always_call`), so its module stack is empty by
the time the error reaches the caller. Forward hooks that are *not* always called are: the modules
whose post-hook did not run are the ones the exception left, innermost last.
"""

from __future__ import annotations

from types import TracebackType

from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.hooks import RemovableHandle


class RunningModules:
    """While active, the forwards of `root`'s submodules that have begun and not returned."""

    def __init__(self, root: nn.Module) -> None:
        self.paths = {id(module): path for path, module in root.named_modules(remove_duplicate=False)}
        self.stack: list[nn.Module] = []
        self.handles: list[RemovableHandle] = []

    def __enter__(self) -> RunningModules:
        self.handles = [register_module_forward_pre_hook(self._began), register_module_forward_hook(self._returned)]
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        for handle in self.handles:
            handle.remove()

    def _began(self, module: nn.Module, args: object) -> None:
        if id(module) in self.paths:
            self.stack.append(module)

    def _returned(self, module: nn.Module, args: object, output: object) -> None:
        if id(module) not in self.paths or not any(entry is module for entry in self.stack):
            return
        while self.stack.pop() is not module:  # also past modules an exception left, caught by a caller
            pass

    def innermost(self) -> tuple[str, nn.Module] | None:
        """(path, module) of the innermost forward an exception left (path "" for the root), or None."""
        if not self.stack:
            return None
        module = self.stack[-1]
        return self.paths[id(module)], module
