"""`import explorer` against `import torch`, each in fresh processes (issue 33's first-paint target).

A notebook's first paint waits for its imports. torch's own import is the floor; what `import
explorer` adds beyond it is ours (the engine; fake tensors' torch._dynamo and the analyses' pandas and torch.distributed load on first use).
Each rep runs both in fresh interpreters, alternating, and the row is the median of the per-rep
ratios; `python -X importtime` of the last rep names the largest parts in the notes.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from harness import Report, Row, verdict

TOPIC = "import"
CASES: dict = {}
TARGET = 1.3  # import explorer / import torch, fresh processes
_REPS = 5


def _timed(statement: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True, capture_output=True)
    return time.perf_counter() - start


def _largest_parts(limit: int = 5) -> list[str]:
    """The costliest packages `import explorer` loads beyond `import torch` (-X importtime, cumulative,
    grouped by their first two dotted names: `torch._dynamo`, `pandas`), not counting our own modules."""
    lines = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch; import explorer"],
                           check=True, capture_output=True, text=True).stderr.splitlines()
    after_torch, parts = False, {}
    for line in lines:
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        _, cumulative, name = (field.strip() for field in line.removeprefix("import time:").split("|"))
        if name == "torch":
            after_torch = True
        elif after_torch and cumulative.isdigit() and not name.startswith("explorer"):
            group = ".".join(name.split(".")[:2])
            parts[group] = max(parts.get(group, 0), int(cumulative))
    largest = sorted(((n, m) for n, m in parts.items() if m >= 10_000), key=lambda item: -item[1])[:limit]
    return [f"{name} {micros / 1e6:.2f} s" for name, micros in largest]


def bench(report: Report, quick: bool, timeout: float) -> None:
    reps = 2 if quick else _REPS
    torch_s, explorer_s = [], []
    for _ in range(reps):
        torch_s.append(_timed("import torch"))
        explorer_s.append(_timed("import explorer"))
    ratio = statistics.median(e / t for e, t in zip(explorer_s, torch_s))
    report.add(Row("`import explorer` vs `import torch`, fresh processes", f"{statistics.median(explorer_s):.2f} s",
                   f"{statistics.median(torch_s):.2f} s", f"{ratio:.2f}×", f"≤ {TARGET}×", verdict(ratio <= TARGET)))
    parts = _largest_parts()
    report.notes.append("import explorer beyond torch, largest parts: " + ("; ".join(parts) or "none above 10 ms"))
