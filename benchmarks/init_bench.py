"""Init audit benchmark: `init_report` on the Llama-70B architecture (deferred), target ≤ 1 s.

The model is built (deferred_init) before the clock starts; each repetition audits it from scratch
(a fresh `init_report` call: no cache survives between calls). `--quick` uses the quick-70b shapes.
"""

from __future__ import annotations

import statistics
import time

from cases import llama_config
from harness import ChildError, Report, Row, log, run_child, seconds, verdict

TOPIC = "init"
TARGET_S = 1.0


def init_report_time(config: str = "llama-70b", reps: int = 5) -> dict:
    """Child: seconds per `init_report` call on a deferred Llama of `config` (build not timed)."""
    import torch
    from transformers import LlamaForCausalLM

    import explorer

    torch.manual_seed(0)
    model = explorer.deferred_init(LlamaForCausalLM, llama_config(config))
    times, rows, flagged = [], 0, 0
    for _ in range(reps):
        start = time.perf_counter()
        table = explorer.init_report(model)
        times.append(time.perf_counter() - start)
        rows, flagged = len(table), int(table["flags"].map(bool).sum())
    return {"times": times, "rows": rows, "flagged": flagged}


CASES = {"init_report_time": init_report_time}


def bench(report: Report, quick: bool, timeout: float) -> None:
    config = "quick-70b" if quick else "llama-70b"
    name = f"`init_report` on {config} (deferred; build not timed)"
    target = f"≤ {TARGET_S:.0f} s"
    try:
        result = run_child("init_report_time", timeout, config=config, reps=3 if quick else 5)
    except ChildError as error:
        report.error(name, target, error)
        return
    median = statistics.median(result["times"])
    report.add(Row(name, f"{median:.3f} s", "—", "—", target, verdict(median <= TARGET_S)))
    report.notes.append(f"init_report {config}: {result['rows']} rows, {result['flagged']} flagged; s: "
                        f"{seconds(result['times'])}")
    log(f"init_report {config}: median {median:.3f} s")
