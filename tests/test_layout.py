"""The package layout keeps its promises, read from the code with `ast` (nothing is imported).

- no import cycle among the modules of `explorer/` and `widgets/` (imports inside functions count);
- the data flows one way: record → graph → replay; the read-only stages (inspection, render,
  analysis) are never imported by the engine; `explorer/` never imports `widgets/` or Jupyter;
- no module imports another module's underscored names: a stage that needs something from another
  uses a named entry point.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("explorer", "widgets")


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def imports_of(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) for every import statement in the file, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for base, names in imports_of(name, path):
            for candidate in [base, *(f"{base}.{n}" for n in names)]:
                if candidate in modules and candidate != name:
                    edges[name].add(candidate)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_in_explorer_or_widgets() -> None:
    edges = import_graph()
    assert len(edges) > 50  # the walk found the package
    assert cycles(edges) == []


def test_cycle_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _stage(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def test_the_engine_never_imports_the_read_only_stages_or_the_ui() -> None:
    edges = import_graph()
    engine = ("explorer.record", "explorer.replay", "explorer.graph", "explorer.naming", "explorer.errors")
    read_only = ("explorer.inspection", "explorer.render", "explorer.analysis", "explorer.distributed")
    offenders = [
        (module, target)
        for module, targets in edges.items()
        for target in targets
        if _stage(module) in engine and _stage(target) in read_only
    ]
    assert offenders == []


def test_graph_is_below_every_stage() -> None:
    # Only the compat package, a leaf, lies below it (OpOverload).
    edges = import_graph()
    assert {t for t in edges["explorer.graph"] if t.startswith("explorer") and not t.startswith(COMPAT)} == set()


def test_the_compat_package_is_a_leaf() -> None:
    edges = import_graph()
    assert {
        (module, target)
        for module, targets in edges.items()
        if module.startswith(COMPAT)
        for target in targets
        if not target.startswith(COMPAT)
    } == set()


def test_explorer_imports_no_widget_or_jupyter_code() -> None:
    modules = module_files()
    offenders = [
        (name, base)
        for name, path in modules.items()
        if name.startswith("explorer")
        for base, _ in imports_of(name, path)
        if base.split(".")[0] in {"widgets", "ipywidgets", "anywidget", "IPython", "jupyterlab", "traitlets"}
    ]
    assert offenders == []


def test_no_module_imports_another_modules_private_names() -> None:
    modules = module_files()
    offenders = [
        f"{name} imports {base}.{imported}"
        for name, path in modules.items()
        for base, names in imports_of(name, path)
        if base.split(".")[0] in PACKAGES and base != name
        for imported in names
        if imported.startswith("_") and not imported.startswith("__")
    ]
    assert offenders == []


def _synced_traits_without_help(tree: ast.AST) -> list[int]:
    """Lines of `trait(...).tag(sync=True)` calls whose trait has no `help=`."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "tag"
        and any(k.arg == "sync" for k in node.keywords)
        and isinstance(node.func.value, ast.Call)
        and not any(k.arg == "help" for k in node.func.value.keywords)
    ]


def test_the_trait_check_finds_a_synced_trait_without_help() -> None:
    tree = ast.parse(
        'a = traitlets.Unicode("").tag(sync=True)\n'
        'b = traitlets.Int(1, help="the first view\'s scale").tag(sync=True)\n'
        "c = traitlets.Int(1).tag(config=True)\n"
    )
    assert _synced_traits_without_help(tree) == [1]


def test_every_synced_widget_trait_says_what_it_is() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for name, path in module_files().items()
        if name.startswith("widgets")
        for line in _synced_traits_without_help(ast.parse(path.read_text()))
    ]
    assert offenders == []


# -- every kept suppression says why (issue 27) --------------------------------------------------------
_NOQA = re.compile(r"#\s*noqa\b(?::?\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?(?P<rest>.*)$")
_TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore(?:\[[^\]]*\])?(?P<rest>.*)$")


def unexplained_suppressions(text: str) -> list[int]:
    """Lines with a `# noqa` or `# type: ignore` and no reason after it ("- why" / "# why")."""
    return [
        number
        for number, line in enumerate(text.splitlines(), 1)
        for pattern in (_NOQA, _TYPE_IGNORE)
        if (found := pattern.search(line)) and not found["rest"].strip(" \t-—:#")
    ]


def test_the_suppression_check_reads_reasons() -> None:
    text = (
        "import a  # noqa: F401\n"
        "import b  # noqa: F401 - registers the op namespace\n"
        "x = f()  # type: ignore[arg-type]\n"
        "y = g()  # type: ignore[arg-type]  # torch's stub says int, the op takes a SymInt\n"
    )
    assert unexplained_suppressions(text) == [1, 3]


def test_every_noqa_and_type_ignore_says_why() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in module_files().values()
        for line in unexplained_suppressions(path.read_text())
    ]
    assert offenders == []


# -- no function runs past a screen and a half ----------------------------------------------------------
MAX_FUNCTION_LINES = 80  # `def` line to last line, docstring included
# Functions allowed over MAX_FUNCTION_LINES for now, each with why. An entry is a debt, not a
# licence: the test below also fails when an entry is no longer needed, so the list only shrinks.
LONG_FUNCTIONS_ALLOWED: dict[str, str] = {}  # "path::function": why it may stay longer


def long_functions(tree: ast.AST, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in `tree` longer than `limit` lines."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_the_length_check_counts_a_functions_lines() -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(80))
    tree = ast.parse(f"def short():\n    return 1\n\nclass A:\n    def long(self):\n{body}")
    assert long_functions(tree) == [("long", 81)]


def test_no_function_in_explorer_or_widgets_is_over_80_lines() -> None:
    found = {
        f"{path.relative_to(ROOT).as_posix()}::{name}": lines
        for path in module_files().values()
        for name, lines in long_functions(ast.parse(path.read_text()))
    }
    assert {key: lines for key, lines in found.items() if key not in LONG_FUNCTIONS_ALLOWED} == {}
    assert sorted(set(LONG_FUNCTIONS_ALLOWED) - set(found)) == []  # a split function leaves the list


# Note: [The compat boundary]
# explorer/_torch_compat/ is the one place that knows torch's private API (its docstring says why).
# Outside it, no module imports a private torch module (a dotted path under `torch` with a part that
# starts with one underscore), spells a private name as `torch._x...`, or reads an attribute of an
# object through `__dict__` other than the project's own `*_ATTR` attributes and dunders, unless the
# lists below name the module and say why.
COMPAT = "explorer._torch_compat"
PRIVATE_TORCH_NAMES_ALLOWED = {
    "_check": "torch._check is documented (torch.compile's 'Dealing with data-dependent shapes') and stable",
}
DICT_USES_ALLOWED = {
    # module: (uses that are not `obj.__dict__[X_ATTR]` / `.get(X_ATTR)` / dunder keys, why)
    "explorer.record.fake": (
        4,
        "DeferredTensor.__deepcopy__ copies the user's own attributes that the new fake lacks; "
        "user_attributes hands them to the real tensor at materialization",
    ),
    "explorer.record.surgery": (1, "reads a model class's own method (a transformers class), not a torch object"),
    "explorer.analysis.init_reinit": (3, "copies an nn.Module's instance dict wholesale for a shallow twin"),
    "explorer.record.redeferred": (2, "carries the attributes a user set on a real tensor over to its deferred twin"),
    "explorer.replay.materialize": (1, "finds tensors a module holds as plain attributes (its own instance dict)"),
    "explorer.record.checkpoint_reads": (1, "reads Python modules' namespaces for a `safe_open` they imported, not a torch object"),
    "explorer.record.swaps": (1, "puts a fake parameter's own attributes back after swap_tensors swapped its instance dict"),
    "explorer.replay.release": (2, "carries the attributes a user set on a real tensor back to its fake on release"),
}


def _is_private_part(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def private_torch_imports(name: str, path: Path) -> list[str]:
    """Imports of private torch modules (`torch._C`, `torch.distributed.tensor._utils`...) in the file."""
    return [
        base
        for base, names in imports_of(name, path)
        if base.split(".")[0] == "torch"
        and any(
            _is_private_part(part) for full in [base, *(f"{base}.{n}" for n in names)] for part in full.split(".")[1:]
        )
    ]


def private_torch_attributes(tree: ast.AST) -> list[str]:
    """`torch._x` chains (the module `torch` by name, then a private attribute) in the tree."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            if _is_private_part(node.attr) and node.attr not in PRIVATE_TORCH_NAMES_ALLOWED:
                found.append(f"torch.{node.attr} (line {node.lineno})")
    return found


def _own_attribute_key(node: ast.AST) -> bool:
    """A `__dict__` key the project owns: a constant named `*_ATTR`, or a dunder string."""
    if isinstance(node, ast.Name):
        return node.id.endswith("_ATTR")
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("__")


def dict_reads(tree: ast.AST) -> list[int]:
    """Lines where `obj.__dict__` is used other than with a key the project owns."""
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr == "__dict__"):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node and _own_attribute_key(parent.slice):
            continue
        if isinstance(parent, ast.Compare) and parent.comparators == [node] and _own_attribute_key(parent.left):
            continue
        call = parents.get(parent)
        if (
            isinstance(parent, ast.Attribute)
            and parent.attr in ("get", "pop", "setdefault")
            and isinstance(call, ast.Call)
            and call.args
            and _own_attribute_key(call.args[0])
        ):
            continue
        lines.append(node.lineno)
    return lines


def test_the_compat_checks_see_private_imports_attributes_and_dict_reads() -> None:
    source = (
        "import torch\nfrom torch._subclasses.fake_tensor import FakeTensor\nimport torch.distributed._tools\n"
        "from torch.distributed.tensor import _utils\nfrom torch.utils import checkpoint\n"
        "x = torch._C._storage_id\ny = torch._check\nd = t.__dict__['_fake_device']\n"
        "h = t.__dict__.get(HANDLE_ATTR)\nn = cls.__dict__['__new__']\nz = t.__dict__.get('fake_device')\n"
    )
    path = ROOT / "build" / "compat_probe.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(source)
    assert private_torch_imports("probe", path) == [
        "torch._subclasses.fake_tensor",
        "torch.distributed._tools",
        "torch.distributed.tensor",
    ]
    tree = ast.parse(source)
    assert private_torch_attributes(tree) == ["torch._C (line 6)"]
    assert dict_reads(tree) == [8, 11]


def test_only_the_compat_package_imports_private_torch_modules() -> None:
    offenders = {
        name: private_torch_imports(name, path)
        for name, path in module_files().items()
        if not name.startswith(COMPAT) and private_torch_imports(name, path)
    }
    assert offenders == {}


def test_only_the_compat_package_names_private_torch_attributes() -> None:
    offenders = {
        name: private_torch_attributes(ast.parse(path.read_text()))
        for name, path in module_files().items()
        if not name.startswith(COMPAT) and private_torch_attributes(ast.parse(path.read_text()))
    }
    assert offenders == {}


def test_only_the_compat_package_reads_attributes_through_dict() -> None:
    counts = {
        name: len(dict_reads(ast.parse(path.read_text())))
        for name, path in module_files().items()
        if not name.startswith(COMPAT)
    }
    assert {name: count for name, count in counts.items() if count} == {
        name: count for name, (count, _) in DICT_USES_ALLOWED.items()
    }
