"""`import explorer` loads the engine only; each analysis loads its heavy modules when first asked for.

A notebook's first paint waits for its imports (issue 33). The analyses pull in pandas, graphviz,
torch.distributed's FSDP and memory tools, and fake tensors' FakeTensorMode pulls in torch._dynamo:
together over two seconds beyond `import torch` on a laptop. The time itself is measured by
benchmarks/import_bench.py; these tests pin which modules stay unloaded, which is what the time
follows from.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import explorer

HEAVY = ("pandas", "graphviz", "torch._dynamo", "torch.distributed.fsdp", "torch.distributed._tools", "sympy")


def _loaded_after(statement: str) -> list[str]:
    program = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=True)
    return run.stdout.split()


def test_import_explorer_leaves_the_heavy_modules_unloaded() -> None:
    loaded = set(_loaded_after("import explorer"))
    assert [name for name in HEAVY if name in loaded] == []
    assert "explorer.record.deferred" in loaded and "explorer.replay.materialize" in loaded


def test_an_analysis_loads_what_it_needs_on_first_use() -> None:
    loaded = set(_loaded_after("import explorer\nexplorer.train_step"))
    assert {"pandas", "torch.distributed.fsdp", "explorer.analysis.train_step"} <= loaded


@pytest.mark.parametrize("name", explorer.__all__)
def test_every_public_name_resolves_and_is_listed(name: str) -> None:
    value = getattr(explorer, name)
    assert value is not None
    assert name in dir(explorer)
    if hasattr(value, "__module__") and not isinstance(value, str):
        assert value.__module__.startswith("explorer")


def test_an_unknown_name_raises_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="module 'explorer' has no attribute 'train_steps'"):
        explorer.train_steps  # noqa: B018
