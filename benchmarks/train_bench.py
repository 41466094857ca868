"""Training-step benchmark (issue 26): `train_step` on the Llama-2-7B and Llama-70B architectures.

The deferred model is built before the clock starts. Cases, each in a fresh child:
- 7B: `train_step(model, (1, 512), labels=...)` with AdamW on one device; target ≤ 20 s;
- 70B on 64 fake ranks: the same under FSDP2 (`world_size=64`, each decoder layer then the root
  sharded); target ≤ 60 s.
RSS growth (peak while the step runs minus RSS after the build) ≤ 300 MB each. Baseline, for
scale (INFO row): the same fake step with no tracker at all on the 7B (the cost of tracking is the
ratio), interleaved with the 7B case. `--quick` uses the quick-7b / quick-70b shapes.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

from cases import RssSampler, llama_config, rss_bytes
from harness import ChildError, Report, Row, log, run_child, seconds, verdict

TOPIC = "train"
TARGETS_S = {"7b": 20.0, "70b-64": 60.0}
RSS_TARGET = 300 * 10**6
SEQ = 512


def _deferred_llama(config: str):
    import torch
    from transformers import LlamaForCausalLM

    import explorer

    torch.manual_seed(0)
    return explorer.deferred_init(LlamaForCausalLM, llama_config(config))


def train_step_time(config: str, world_size: int = 1) -> dict:
    """Child: seconds of one `train_step` (AdamW, input (1, 512), labels) and the RSS it grows by."""
    import torch

    import explorer

    model = _deferred_llama(config)
    ids = torch.zeros(1, SEQ, dtype=torch.long)
    gc.collect()
    before = rss_bytes()
    with RssSampler() as sampler:
        started = time.perf_counter()
        step = explorer.train_step(model, ids, labels=ids, world_size=world_size)
        elapsed = time.perf_counter() - started
    return {
        "seconds": elapsed,
        "rss_growth": sampler.peak - before,
        "peak_bytes": step.peak_bytes,
        "peak": step.peak,
        "phase": step.phase,
    }


def bare_step_time(config: str) -> dict:
    """Child: the same fake step (twin, AdamW) with no memory tracker (the baseline for scale)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from explorer.analysis.train_twin import fake_twin

    model = _deferred_llama(config)
    ids = torch.zeros(1, SEQ, dtype=torch.long)
    started = time.perf_counter()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    twin = fake_twin(model, mode).train()
    with mode:
        fake_ids = mode.from_tensor(ids)
        optimizer = torch.optim.AdamW(twin.parameters())
        twin(fake_ids, labels=fake_ids).loss.backward()
        optimizer.step()
    return {"seconds": time.perf_counter() - started}


CASES = {"train_step_time": train_step_time, "bare_step_time": bare_step_time}


def _gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB"


def bench(report: Report, quick: bool, timeout: float) -> None:
    small, big = ("quick-7b", "quick-70b") if quick else ("llama-7b", "llama-70b")
    runs: dict[str, list[dict]] = {"7b": [], "bare": [], "70b-64": []}
    calls: dict[str, tuple[str, dict[str, Any]]] = {
        "7b": ("train_step_time", {"config": small}),
        "bare": ("bare_step_time", {"config": small}),
        "70b-64": ("train_step_time", {"config": big, "world_size": 64}),
    }
    try:
        for round_ in range(1 if quick else 2):  # fresh children, interleaved, rotated
            order = list(calls) if round_ % 2 == 0 else list(reversed(calls))
            for key in order:
                case, kwargs = calls[key]
                runs[key].append(run_child(case, max(timeout, 600), **kwargs))
    except ChildError as error:
        report.error(f"train_step on {small} / {big}", "≤ 20 s / ≤ 60 s, RSS growth ≤ 300 MB", error)
        return
    bare = statistics.median(run["seconds"] for run in runs["bare"])
    for key, name in (
        ("7b", f"train_step {small} (1, {SEQ}) AdamW"),
        ("70b-64", f"train_step {big} (1, {SEQ}) AdamW, 64 fake ranks (FSDP2)"),
    ):
        times = [run["seconds"] for run in runs[key]]
        median, growth, last = statistics.median(times), max(run["rss_growth"] for run in runs[key]), runs[key][-1]
        baseline, ratio = (f"untracked step {bare:.2f} s", f"{median / bare:.2f}×") if key == "7b" else ("—", "—")
        report.add(
            Row(
                name, f"{median:.2f} s", baseline, ratio, f"≤ {TARGETS_S[key]:.0f} s", verdict(median <= TARGETS_S[key])
            )
        )
        report.add(
            Row(f"{name}: RSS growth", f"{growth / 1e6:.0f} MB", "—", "—", "≤ 300 MB", verdict(growth <= RSS_TARGET))
        )
        categories = ", ".join(f"{k} {_gib(v)}" for k, v in last["peak"].items() if v)
        report.notes.append(
            f"{name}: peak {_gib(last['peak_bytes'])} in the {last['phase']} ({categories}); s: {seconds(times)}"
        )
        log(f"{name}: median {median:.2f} s, RSS growth {growth / 1e6:.0f} MB")
