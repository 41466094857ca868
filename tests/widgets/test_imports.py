"""`import widgets` loads what the first paint draws, not the training step's tools.

The explorer's first paint needs the tables (pandas) and the widgets; the Memory tab's training step
needs torch.distributed's FSDP and memory tools, which load when that panel first runs. The time is
measured by benchmarks/paint_bench.py; this pins the modules it follows from.
"""

from __future__ import annotations

import subprocess
import sys

TRAINING_ONLY = ("torch.distributed.fsdp", "torch.distributed._tools", "torch._dynamo", "sympy")


def test_import_widgets_leaves_the_training_tools_unloaded() -> None:
    program = "import sys, widgets\nprint(' '.join(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=True)
    loaded = set(run.stdout.split())
    assert [name for name in TRAINING_ONLY if name in loaded] == []
    assert {"widgets.train_panel", "widgets.explorer_widget"} <= loaded
