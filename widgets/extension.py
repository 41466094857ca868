"""The notebook extension: `%load_ext widgets` registers the `%%deferred` cell magic, the
`%deferred_status` line magic and rich HTML display of deferred modules and fake tensors.

Why `widgets` and not `explorer`: the engine package imports no Jupyter code; the extension
needs IPython and shows the explorer widget, so it lives with the notebook UI.

- `%%deferred [name]` runs the cell inside `explorer.deferred()`: every module and tensor the cell
  creates is fake and recorded; modules built before or after the cell stay eager. The cell's
  value is the explorer of `name`, or of the last module the cell assigned to a name (or, failing
  that, the last module it built). When the cell raises, the failure is shown in place (a red
  banner over the explorer of what was built) instead of a traceback; the RNG, modes and patches
  are restored either way.
- `%deferred_status`: a table of the deferred modules alive in the kernel, the names they are
  bound to, their sizes and how much of each is materialized.
- Display: a module holding deferred tensors shows a one-line summary and a static tree; a fake
  tensor shows shape, stride, offset, dtype, device and that it is fake. `Inspection`,
  `MemoryPlan` and `DryRun` have their own `_repr_html_`.
"""

from __future__ import annotations

import ast
from typing import Any

import pandas as pd
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from torch import nn

import explorer
from explorer.record.fake import handle_of
from explorer.render.rich import module_html, tensor_html

from .explorer_widget import ExplorerWidget


def _was_deferred(module: nn.Module) -> bool:
    """Whether any tensor of `module` was recorded by deferred_init / deferred() (fake or not now)."""
    return any(handle_of(t) is not None or explorer.is_fake(t) for t in [*module.parameters(), *module.buffers()])


def deferred_module_html(module: nn.Module) -> str | None:
    """HTML for a module that holds deferred tensors; None (plain repr) for any other module."""
    if not explorer.is_deferred(module):
        return None
    return module_html(module, explorer.inspect(module).summary().splitlines()[0])


def fake_tensor_html(tensor: torch.Tensor) -> str | None:
    """HTML for a fake tensor; None (torch's own repr) for a real one."""
    return tensor_html(tensor) if explorer.is_fake(tensor) else None


def assigned_names(cell: str) -> list[str]:
    """Names the cell's top-level statements assign, in order (`a = b = ...`, `a: T = ...`, `a, b = ...`)."""
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return []
    names: list[str] = []

    def collect(target: ast.AST) -> None:
        if isinstance(target, ast.Name):
            names.append(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for item in target.elts:
                collect(item)

    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                collect(target)
        elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)) and statement.value is not None:
            collect(statement.target)
    return names


@magics_class
class DeferredMagics(Magics):
    """`%%deferred` and `%deferred_status`."""

    @property
    def ipython(self) -> InteractiveShell:
        """The shell these magics were registered with (`Magics.shell` is None only on an instance
        made by hand; UsageError then)."""
        if self.shell is None:
            raise UsageError("the deferred magics are used without an IPython shell: load them with %load_ext widgets")
        return self.shell

    @cell_magic
    def deferred(self, line: str, cell: str) -> Any:
        """Run the cell under deferred init and show the explorer of `line` (a name) or of the last
        module the cell assigned."""
        wanted = line.strip() or None
        source = self.ipython.transform_cell(cell)
        filename = self.ipython.compile.cache(source, self.ipython.execution_count, raw_code=cell)
        code = compile(source, filename, "exec")
        try:
            with explorer.deferred() as block:
                exec(code, self.ipython.user_global_ns, self.ipython.user_ns)  # the user's own cell
        except Exception as error:
            if getattr(error, "graph", None) is None and not hasattr(error, "deferred_graph"):
                raise
            partial = getattr(error, "partial_module", None)
            self.ipython.user_ns["_deferred_error"] = error
            return ExplorerWidget(partial if isinstance(partial, nn.Module) else nn.Module(), error=error)
        module = self._module_to_show(wanted, source, block.modules)
        return ExplorerWidget(module) if module is not None else None

    def _module_to_show(self, wanted: str | None, source: str, built: list[nn.Module]) -> nn.Module | None:
        namespace = self.ipython.user_ns
        if wanted is not None:
            value = namespace.get(wanted)
            if not isinstance(value, nn.Module):
                raise UsageError(
                    f"%%deferred {wanted}: after the cell, {wanted!r} is "
                    f"{'not defined' if wanted not in namespace else type(value).__name__}, not an nn.Module"
                )
            return value
        for name in reversed(assigned_names(source)):
            value = namespace.get(name)
            if isinstance(value, nn.Module) and _was_deferred(value):
                return value
        return built[-1] if built else None

    @line_magic
    def deferred_status(self, line: str = "") -> pd.DataFrame:
        """The deferred modules alive in the kernel: names, class, bytes, fake and materialized shares."""
        names: dict[int, list[str]] = {}
        for name, value in self.ipython.user_ns.items():
            if isinstance(value, nn.Module) and not name.startswith("_"):
                names.setdefault(id(value), []).append(name)
        rows = []
        for module in explorer.deferred_roots():
            root = explorer.inspect(module).modules.iloc[0]
            total, done = int(root["bytes"]), int(root["materialized_bytes"])
            rows.append(
                {
                    "names": ", ".join(names.get(id(module), [])) or "(unnamed)",
                    "class": type(module).__name__,
                    "parameters": int(root["total_params"]),
                    "bytes": total,
                    "materialized_bytes": done,
                    "materialized": f"{100 * done / total:.1f}%" if total else "—",
                }
            )
        columns = ["names", "class", "parameters", "bytes", "materialized_bytes", "materialized"]
        return pd.DataFrame(rows, columns=columns)


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext widgets`: register the magics and the HTML display of deferred modules and fakes."""
    ipython.register_magics(DeferredMagics)
    formatter = ipython.display_formatter.formatters["text/html"]
    formatter.for_type(nn.Module, deferred_module_html)
    formatter.for_type(torch.Tensor, fake_tensor_html)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext widgets`: drop the display formatters (IPython keeps magics once registered)."""
    formatter = ipython.display_formatter.formatters["text/html"]
    for cls in (nn.Module, torch.Tensor):
        formatter.type_printers.pop(cls, None)
