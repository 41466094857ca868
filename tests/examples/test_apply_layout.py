"""examples/apply_layout.py applies a layout for real: gloo ranks on 127.0.0.1, one training step.

The script runs as a subprocess (its ranks fork from it) with this checkout on PYTHONPATH. Every
rank feeds the same batch, so every rank's loss must equal one unsharded process's, computed here
from the example's own config and batch; and each layout's measured peak (PyTorch's MemTracker)
must be under half the unsharded step's. FSDP 2 × TP 2 with block checkpointing is the layout run
(4 ranks, the most parallelisms at once that fit the test's time); the script's other layouts
(HSDP, TP alone, selective checkpointing) run the same code path.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import transformers
from torch.distributed._tools.mem_tracker import MemTracker

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "apply_layout.py"
RUN_TIMEOUT_S = 180  # a guard against a hung rank, not a timing check
RANK_LINE = re.compile(r"^rank (\d+): loss (\S+) peak_bytes (\d+)$", re.MULTILINE)

pytestmark = pytest.mark.slow


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("apply_layout_example", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> dict[int, tuple[float, int]]:
    """rank → (loss, peak bytes) as the script printed them; fails with its output if it failed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {int(rank): (float(loss), int(peak)) for rank, loss, peak in RANK_LINE.findall(done.stdout)}


@pytest.fixture(scope="module")
def unsharded() -> tuple[float, int]:
    """(loss, peak bytes) of the example's step in one process, no parallelism."""
    example = _example()
    torch.manual_seed(example.SEED)
    model = transformers.LlamaForCausalLM(example.config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        loss = example.train_step(model, optimizer, example.batch(example.Layout(micro_batch_size=2)))
    return loss, tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.fixture(scope="module")
def fsdp2_tp2() -> dict[int, tuple[float, int]]:
    return _run("--dp-shard", "2", "--tp", "2", "--ac", "block")


def test_fsdp_tp_checkpointed_layout_on_four_ranks_keeps_the_unsharded_loss(fsdp2_tp2, unsharded) -> None:
    assert sorted(fsdp2_tp2) == [0, 1, 2, 3]
    losses = {loss for loss, _ in fsdp2_tp2.values()}
    assert len(losses) == 1  # TP's all-reduce leaves every rank the same loss, bit for bit
    assert math.isfinite(unsharded[0])
    assert losses.pop() == pytest.approx(unsharded[0], rel=1e-6)


def test_each_rank_needs_under_half_the_unsharded_peak(fsdp2_tp2, unsharded) -> None:
    peaks = {peak for _, peak in fsdp2_tp2.values()}
    assert len(peaks) == 1  # even shards: every rank alike
    assert 0 < peaks.pop() < unsharded[1] / 2  # parameters, gradients and Adam state split 4 ways
