"""The two scripts a lent GPU runs (benchmarks/gpu_bench.py, benchmarks/cuda_parity.py) work end to
end here, on the CPU, in their smoke modes: a session that is lent a GPU has minutes of device time
and no network, so they must run first time. Their numbers here mean nothing; their parity checks do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_script(script: str, env: dict[str, str], out: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=ROOT,
        env={**os.environ, **env, "OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_gpu_bench_smoke_run_gives_its_four_rows_with_parity(tmp_path):
    printed = run_script("gpu_bench.py", {"GPU_BENCH_DEVICE": "cpu"}, tmp_path, "--smoke", "--reps", "1")
    rows = [line for line in printed.splitlines() if line.startswith("| Llama")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| Llama-3-70B `layers[79]`, rng=\"eager\", vs raw GPU fill of the same tensors",
        "| Llama-3.2-3B shapes, whole model on CUDA: deferred_init + materialize vs eager construction",
        "| Llama-2-7B `layers[31]`, rng=\"eager\", vs raw GPU fill of the same tensors",
        "| Llama-3-70B embedding, one FSDP2 rank's rows (1 of 8) drawn alone, vs raw GPU fill of those rows",
    ]
    parity = [row.split(" | ")[-1] for row in rows]
    assert parity[0].startswith("parity with the general path: bitwise"), parity[0]
    assert all(cell.startswith("bitwise equal to") for cell in parity[1:]), parity
    assert (tmp_path / "gpu_bench.md").read_text().count("| Llama") == 4


def test_cuda_parity_smoke_run_passes_every_check(tmp_path):
    printed = run_script("cuda_parity.py", {"PARITY_DEVICE": "cpu"}, tmp_path)
    summary = re.search(r"^(\d+) passed, (\d+) failed$", printed, re.MULTILINE)
    assert summary is not None, printed[-2000:]
    assert int(summary.group(1)) >= 15 and summary.group(2) == "0", printed[-2000:]
