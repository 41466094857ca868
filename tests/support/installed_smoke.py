"""A user's first session with the installed product, run by tests/test_packaging.py in a fresh venv.

The venv holds the built wheel and nothing of the source tree; argv[1] is its site-packages. Every
check prints nothing and raises on failure, so the test reads the exit status and the last line.
"""

import importlib.metadata
import pathlib
import sys

import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

import explorer
import widgets
from widgets.explorer_widget import ExplorerWidget

site = pathlib.Path(sys.argv[1]).resolve()

ours = {name: module for name, module in sys.modules.items() if name.split(".")[0] in ("explorer", "widgets")}
outside = sorted(name for name, module in ours.items()
                 if not pathlib.Path(module.__file__).resolve().is_relative_to(site))
assert not outside, f"imported from outside the installed wheel: {outside}"
distribution = importlib.metadata.distribution("deferred-explorer")
assert pathlib.Path(distribution.locate_file("")).resolve() == site, distribution.locate_file("")
assert explorer.__version__ == distribution.version, (explorer.__version__, distribution.version)


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))


torch.manual_seed(0)
eager = build()
torch.manual_seed(0)
model = explorer.deferred_init(build)
assert explorer.is_deferred(model)
assert sorted(explorer.inspect(model).tensors["name"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]
explorer.materialize_module(model)
for (name, value), (_, expected) in zip(model.state_dict().items(), eager.state_dict().items()):
    assert torch.equal(value, expected), name

torch.manual_seed(0)
ui = ExplorerWidget(explorer.deferred_init(build))


def descendants(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from descendants(child)


front_ends = {type(child).__name__: child for child in descendants(ui) if hasattr(child, "_esm")}
assert {"ModuleTree", "DataTable", "GraphView", "SearchBox", "ExportBar"} <= set(front_ends), sorted(front_ends)
for child in front_ends.values():
    assert "export default" in child._esm and ".de-" in child._css, type(child).__name__

shell = InteractiveShell.instance()
shell.run_cell("%load_ext widgets", store_history=False).raise_error()
shell.run_cell("import torch", store_history=False).raise_error()
cell = shell.run_cell("%%deferred\nm = torch.nn.Linear(3, 3)\n", store_history=False)
cell.raise_error()
assert isinstance(cell.result, widgets.ExplorerWidget) and explorer.is_deferred(shell.user_ns["m"])
print("installed product works")
