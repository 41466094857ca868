"""What every benchmark topic shares: the result table, the child-process runner and verdicts.

A topic module (benchmarks/*_bench.py, listed in run.TOPICS) imports these, defines `TOPIC` (its
`--only` name), `CASES` (child workloads by name) and `bench(report, quick, timeout)`; run.py runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUNNER = Path(__file__).resolve().parent / "run.py"
ROOT = RUNNER.parent.parent

MARKER = "@@BENCH-RESULT@@ "
MB = 1024 * 1024


# -- child processes ------------------------------------------------------------------------------
class ChildError(RuntimeError):
    """A child case failed: carries its traceback / output tail for the report."""


def run_child(case: str, timeout: float, **kwargs: Any) -> dict:
    spec = json.dumps({"case": case, "kwargs": kwargs})
    command = [sys.executable, str(RUNNER), "--child", spec]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as error:
        raise ChildError(f"{case}({kwargs}) timed out after {timeout:.0f} s") from error
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    raise ChildError(f"{case}({kwargs}) exited with {done.returncode}:\n{tail}")



# -- table ----------------------------------------------------------------------------------------
@dataclass
class Row:
    name: str
    measured: str
    baseline: str
    ratio: str
    target: str
    result: str  # PASS / FAIL / INFO / ERROR


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        log(f"  {row.name}: {row.measured} vs {row.baseline} → {row.ratio} ({row.target}) {row.result}")

    def error(self, name: str, target: str, error: BaseException) -> None:
        self.add(Row(name, "error", "—", "—", target, "ERROR"))
        self.errors.append(f"### {name}\n\n```\n{error}\n```")

    def markdown(self, header: str) -> str:
        lines = [header, "", "| benchmark | measured | baseline | ratio | target | result |",
                 "|---|---:|---:|---:|---|---|"]
        for r in self.rows:
            lines.append(f"| {r.name} | {r.measured} | {r.baseline} | {r.ratio} | {r.target} | {r.result} |")
        if self.notes:
            lines += ["", "Notes:", ""] + [f"- {n}" for n in self.notes]
        if self.errors:
            lines += ["", "## Errors", ""] + self.errors
        return "\n".join(lines) + "\n"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)
