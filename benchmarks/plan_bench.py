"""Issue 35's bench: `plan_parallel` over a whole search space, for Llama-3-70B and Llama-3-405B.

Each case runs in a fresh child: the deferred model is built before the clock starts, then
`plan_parallel(model, ids, labels=ids, gpus=N, gpu_memory="80GB", fsdp=(8, 16, 32, 64),
tp=(1, 2, 4, 8), pp=(1, 2, 4), activation_checkpointing=("none", "block"), workers=2)` on one
micro-batch of (1, 8192) tokens evaluates every layout of those degrees that divides N (the rest are HSDP replicas).
Targets: 70B on 64 GPUs ≤ 60 s with RSS growth ≤ 500 MB; 405B on 512 GPUs ≤ 120 s.

    .venv/bin/python benchmarks/plan_bench.py [--quick]   # alone; `benchmarks/run.py` runs it as a topic
"""

from __future__ import annotations

import gc
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from cases import RssSampler, rss_bytes  # noqa: E402  (after the path setup)
from harness import ChildError, Report, Row, log, run_child, verdict  # noqa: E402

TOPIC = "plan"
SEQ = 8192
LLAMA3 = {
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192),
    "405b": dict(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
                 num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192),
    "quick": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=8, vocab_size=4000, max_position_embeddings=8192),
}
TARGETS = {"70b": (64, 60.0), "405b": (512, 120.0)}
RSS_TARGET = 500 * 10**6
WORKERS = 2  # forked measuring processes: the bench machine's (and CI's) two cores


def plan_time(config: str, gpus: int, seq: int = SEQ) -> dict:
    """Child: seconds and RSS growth of one `plan_parallel` over the bench's search space."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import explorer
    from explorer.analysis.parallel_plan import plan_parallel

    torch.manual_seed(0)
    model = explorer.deferred_init(LlamaForCausalLM, LlamaConfig(**LLAMA3[config]))
    ids = torch.zeros(1, seq, dtype=torch.long)
    gc.collect()
    before = rss_bytes()
    with RssSampler() as sampler:
        started = time.perf_counter()
        plan = plan_parallel(
            model,
            ids,
            labels=ids,
            gpus=gpus,
            gpu_memory="80GB",
            fsdp=(8, 16, 32, 64),
            tp=(1, 2, 4, 8),
            pp=(1, 2, 4),
            workers=WORKERS,
        )
        elapsed = time.perf_counter() - started
    table = plan.table()
    # each forked worker starts at the parent's RSS: its peak beyond that is its growth
    workers_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {
        "seconds": elapsed,
        "rss_growth": max(sampler.peak - before, workers_peak - before),
        "layouts": len(plan.results),
        "valid": int(sum(r.valid for r in plan.results)),
        "fit": int(table["fits"].sum()),
        "best": plan.best().layout.label() if plan.best() else None,
        "problems": sorted({p.partition(": ")[2] or p for r in plan.results for p in r.problems}),
        "rows": [
            (r.layout.label(), r.peak_bytes, r.ranks[0].at if r.ranks else "", "; ".join(r.problems))
            for r in plan.ordered()
        ],
    }


CASES = {"plan_time": plan_time}


def bench(report: Report, quick: bool, timeout: float) -> None:
    for config, (gpus, target) in TARGETS.items():
        name = f"plan_parallel Llama-3-{config.upper()} on {gpus} × 80GB, every layout of the search space"
        try:
            run = run_child("plan_time", max(timeout, 3600), config="quick" if quick else config, gpus=gpus)
        except ChildError as error:
            report.error(name, f"≤ {target:.0f} s", error)
            continue
        seconds = run["seconds"]
        report.add(Row(name, f"{seconds:.1f} s", "—", "—", f"≤ {target:.0f} s", verdict(seconds <= target)))
        if config == "70b":
            growth = run["rss_growth"]
            passed = verdict(growth <= RSS_TARGET)
            report.add(Row(f"{name}: RSS growth", f"{growth / 1e6:.0f} MB", "—", "—", "≤ 500 MB", passed))
        report.notes.append(
            f"{name}: {run['layouts']} layouts, {run['valid']} valid, {run['fit']} fit; fastest by the proxy: "
            f"{run['best']}; reasons given: {run['problems']}"
        )
        log(f"{name}: {run['seconds']:.1f} s, {run['layouts']} layouts")


if __name__ == "__main__":
    result = Report()
    bench(result, quick="--quick" in sys.argv, timeout=900)
    for row in result.rows:
        print(f"{row.result}: {row.name}: {row.measured} (target {row.target}; {row.baseline}, {row.ratio})")
    for note in result.notes + result.errors:
        print(note)
