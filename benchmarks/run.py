"""deferred-explorer benchmarks: every target is a ratio measured side by side in this run.

    .venv/bin/python benchmarks/run.py            # full run (`make bench`), table → build/bench.md
    .venv/bin/python benchmarks/run.py --quick    # small configs, smoke run (seconds, not minutes)
    .venv/bin/python benchmarks/run.py --profile  # cProfile of deferred_init / materialize → build/profile.md

Each measurement runs in a fresh child process (this script with --child), so lazy imports, the
allocator and RSS of one case never leak into another; repetitions of competing cases are
interleaved (rotated order each round) and medians reported. The exit code is 0 even when a target
fails: the table says FAIL.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Children import the engine from a snapshot the parent took when it started (BENCH_ENGINE_DIR), so
# every case of one run measures the same code even while explorer/ is being edited.
ENGINE_ENV = "BENCH_ENGINE_DIR"
sys.path[:0] = [p for p in (os.environ.get(ENGINE_ENV), str(ROOT), str(HERE)) if p]

import cases  # noqa: E402  (after the path setup; light: no torch at import)
import fill_bench  # noqa: E402  (the recording rows: issue 25's topic)
from harness import MARKER, MB, ChildError, Report, Row, log, run_child, seconds, verdict  # noqa: E402

# Topic modules (benchmarks/<name>.py): each has TOPIC, CASES and bench(report, quick, timeout).
TOPICS = ("save_bench", "init_bench", "forward_bench", "fill_bench", "train_bench", "import_bench", "paint_bench", "hub_bench", "plan_bench")


def topic_modules() -> list[Any]:
    """The topic modules present (a missing one is skipped: topics land one by one)."""
    import importlib

    found = []
    for module in TOPICS:
        try:
            found.append(importlib.import_module(module))
        except ModuleNotFoundError as error:
            if error.name != module:
                raise
    return found


def snapshot_engine() -> tuple[str, str]:
    """Copy explorer/ to a temporary directory for the children; returns (its parent, a description)."""
    target = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    shutil.copytree(ROOT / "explorer", target / "explorer", ignore=shutil.ignore_patterns("__pycache__"))
    os.environ[ENGINE_ENV] = str(target)

    def git(*arguments: str) -> str:
        try:
            return subprocess.run(["git", *arguments], cwd=ROOT, capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = " + uncommitted changes in explorer/" if git("status", "--porcelain", "--", "explorer") else ""
    return str(target), f"engine: explorer/ at {commit}{dirty} (snapshot taken when the run started)"


def all_cases() -> dict[str, Callable[..., dict]]:
    """Every workload by name: the engine's (cases.py) and the inspection / UI ones beside it."""
    import importlib

    found = dict(cases.CASES)
    for module in ("table_cases", "inspection_cases", "widget_cases", "browser_cases"):
        try:
            found.update(importlib.import_module(module).CASES)
        except ModuleNotFoundError as error:
            if error.name != module:
                raise
    for topic in topic_modules():
        found.update(topic.CASES)
    return found


def child_main(spec: str) -> None:
    request = json.loads(spec)
    result = all_cases()[request["case"]](**request["kwargs"])
    sys.stdout.flush()
    print(MARKER + json.dumps(result), flush=True)


# -- benchmarks -----------------------------------------------------------------------------------
MATERIALIZE_MODES = ("eager", "materialize-eager", "materialize-fast", "meta-to-empty-init")


def bench_materialize(report: Report, config: str, reps: int) -> None:
    times: dict[str, list[float]] = {mode: [] for mode in MATERIALIZE_MODES}
    digests: dict[str, dict[str, str]] = {}
    peaks: dict[str, list[float]] = {mode: [] for mode in MATERIALIZE_MODES}
    errors: dict[str, BaseException] = {}
    for rep in range(reps):
        shift = rep % len(MATERIALIZE_MODES)
        for mode in MATERIALIZE_MODES[shift:] + MATERIALIZE_MODES[:shift]:
            if mode in errors:
                continue
            verify = rep == 0 and mode in ("eager", "materialize-eager")
            log(f"  [{rep + 1}/{reps}] {mode} {config}")
            try:
                result = run_child("materialize_time", 900, config=config, mode=mode, verify=verify)
            except ChildError as error:
                errors[mode] = error
                continue
            times[mode].append(result["time"])
            peaks[mode].append(result["peak_rss"] / MB)
            if verify:
                digests[mode] = result["digests"]
    median = {mode: statistics.median(v) for mode, v in times.items() if v}

    def ratio_row(mode: str, label: str, limit: float | None, expect: str = "") -> None:
        if mode in errors:
            report.error(label, f"≤ {limit:.2f}×" if limit else "info", errors[mode])
            return
        if "eager" in errors or mode not in median:
            report.add(Row(label, "—", "—", "—", "—", "ERROR"))
            return
        ratio = median[mode] / median["eager"]
        target = f"≤ {limit:.2f}×" if limit is not None else f"info{expect}"
        result = verdict(ratio <= limit) if limit is not None else "INFO"
        report.add(Row(label, f"{median[mode]:.2f} s", f"{median['eager']:.2f} s", f"{ratio:.2f}×", target, result))

    ratio_row("materialize-eager", f"materialize_module {config} rng=eager vs eager construction", 1.1)
    ratio_row("materialize-fast", f"materialize_module {config} rng=fast vs eager construction", 0.6)
    ratio_row("meta-to-empty-init", f"meta + to_empty + init_weights {config} vs eager construction", None,
              " (~0.5× expected)")
    if "eager" in errors:
        report.error(f"eager construction {config}", "baseline", errors["eager"])

    name = f"materialize_module {config} rng=eager values == eager construction"
    if "eager" in digests and "materialize-eager" in digests:
        reference, ours = digests["eager"], digests["materialize-eager"]
        equal = [key for key in reference if reference[key] == ours.get(key)]
        report.add(Row(name, f"{len(equal)}/{len(reference)} tensors bit-identical", "—", "—", "all equal",
                       verdict(len(equal) == len(reference))))
        for key in reference:
            if reference[key] != ours.get(key):
                report.notes.append(f"MISMATCH {key}: eager {reference[key]} vs materialized {ours.get(key)}")
        report.notes.append("parity checked by blake2b of the bytes of: " + ", ".join(reference))
    else:
        report.add(Row(name, "not checked", "—", "—", "all equal", "ERROR"))
    for mode in MATERIALIZE_MODES:
        if times[mode]:
            report.notes.append(f"{config} {mode} s: {seconds(times[mode])} (child peak RSS "
                                f"{statistics.median(peaks[mode]):.0f} MB)")


def bench_layer(report: Report, config: str, layer: int, rngs: list[str], timeout: float,
                time_target: tuple[float, float] | None, rss: bool) -> None:
    """materialize_module(layers[layer]) of `config` once per rng mode, each in a fresh process.

    `time_target` (k, c): rng="eager" must take ≤ k × rng="fast" + c seconds (both measured here);
    `rss`: peak RSS growth rows (≤ 1.25 × layer bytes + 300 MB).
    """
    took: dict[str, float] = {}
    label = f"{config} layers[{layer}]"
    for rng in rngs:
        name = f"{label} materialize (rng={rng}) peak RSS growth"
        try:
            log(f"  {label}, rng={rng} (timeout {timeout:.0f} s)")
            r = run_child("layer_peak_rss", timeout, config=config, rng=rng, layer=layer)
        except ChildError as error:
            report.error(name if rss else f"{label} materialize (rng={rng})", "see below", error)
            continue
        label = f"{config} layers[{r['layer']}]"
        name = f"{label} materialize (rng={rng}) peak RSS growth"
        layer_mb, growth = r["layer_bytes"] / MB, r["growth"] / MB
        limit = 1.25 * layer_mb + 300
        if rss:
            report.add(Row(name, f"{growth:.0f} MB", f"{layer_mb:.0f} MB (layer)", f"{growth / layer_mb:.2f}×",
                           f"≤ {limit:.0f} MB (1.25× layer + 300 MB)", verdict(growth <= limit)))
        took[rng] = r["time"]
        report.notes.append(
            f"{label} rng={rng}: materialize took {r['time']:.2f} s; RSS before "
            f"{r['before'] / MB:.0f} MB; growth by ru_maxrss {r['growth_maxrss'] / MB:.0f} MB "
            f"({'exact' if r['maxrss_valid'] else 'upper bound, not used'}), by 5 ms sampling "
            f"{r['growth_sampled'] / MB:.0f} MB; peak during deferred_init {r['deferred_peak'] / MB:.0f} MB")
    if "eager" in took and "fast" in took:
        eager, fast = took["eager"], took["fast"]
        if time_target is None:
            target, result = "info", "INFO"
        else:
            k, c = time_target
            limit = k * fast + c
            target, result = f"≤ {k:g}× fast + {c:g} s = {limit:.1f} s", verdict(eager <= limit)
        report.add(Row(f"{label} materialize time, rng=eager vs rng=fast", f"{eager:.2f} s", f"{fast:.2f} s",
                       f"{eager / fast:.2f}×", target, result))


def bench_rng_jump(report: Report, reps: int) -> None:
    """The CPU generator jump: ≤ 250 ms for any distance up to 10^12 draws, first call included."""
    name = "CPU generator jump by n draws (n ≤ 10^12)"
    try:
        r = run_child("rng_jump_time", 300, reps=reps)
    except ChildError as error:
        report.error(name, "≤ 0.25 s", error)
        return
    slowest = max([r["first"], *r["warm"].values()])
    warm = ", ".join(f"10^{len(k) - 1}: {v * 1e3:.1f} ms" for k, v in r["warm"].items())
    report.add(Row(f"{name}, slowest (first call incl. setup: {r['first'] * 1e3:.0f} ms)",
                   f"{slowest:.3f} s", "—", "—", "≤ 0.25 s", verdict(slowest <= 0.25)))
    report.notes.append(f"generator jump, median of {reps} per distance: {warm}")


def bench_trunc_normal(report: Report) -> None:
    """deferred_init of a model whose weights go through nn.init.trunc_normal_: RSS ≤ 150 MB."""
    name = "deferred_init RSS growth, 16 × Linear(8192, 8192) initialised by nn.init.trunc_normal_"
    try:
        r = run_child("trunc_normal_rss", 600, layers=16, width=8192)
    except ChildError as error:
        report.error(name, "≤ 150 MB", error)
        return
    growth, size = r["growth"] / MB, r["model_bytes"] / MB
    report.add(Row(name, f"{growth:.1f} MB", f"{size:.0f} MB (model)", f"{growth / size:.4f}×", "≤ 150 MB",
                   verdict(growth <= 150)))


def bench_checkpoint(report: Report, config: str, timeout: float) -> None:
    """A bf16 sharded checkpoint loaded as float32 under deferred_init: recording ≤ 150 MB; one
    decoder layer ≤ 1.25 × its bytes + 100 MB and equal to eager from_pretrained; release ≤ 100 MB left."""
    directory = str(ROOT / "build" / "bench-checkpoints" / config)
    name = f"{config} bf16 sharded checkpoint, from_pretrained(dtype=float32) under deferred_init"
    try:
        run_child("make_checkpoint", timeout, config=config, directory=directory)
        r = run_child("checkpoint_rss", timeout, directory=directory, layer=0)
    except ChildError as error:
        report.error(name, "≤ 150 MB", error)
        return
    growth = r["record_growth"] / MB
    report.add(Row(f"{name}: RSS growth while recording", f"{growth:.1f} MB", "—", "—", "≤ 150 MB",
                   verdict(growth <= 150)))
    layer, size = r["layer_growth"] / MB, r["layer_bytes"] / MB
    limit = 1.25 * size + 100
    report.add(Row(f"{config} `model.layers[0]` from that checkpoint: RSS growth, equal to eager loading: "
                   f"{'yes' if r['equal'] else 'NO'}", f"{layer:.0f} MB", f"{size:.0f} MB layer",
                   f"{layer / size:.2f}×", f"≤ 1.25× layer + 100 MB = {limit:.0f} MB",
                   verdict(layer <= limit and r["equal"])))
    if r["released_left"] is not None:
        left = r["released_left"] / MB
        report.add(Row(f"{config} `model.layers[0]` after release_module: RSS left", f"{left:.0f} MB", "—", "—",
                       "≤ 100 MB", verdict(left <= 100)))


def bench_shards(report: Report, config: str, timeout: float) -> None:
    """fully_shard_deferred of `config` by 1 and by 2 gloo ranks: each of 2 ranks ≤ 0.65× one rank."""
    name = f"{config} fully_shard_deferred, slowest of 2 gloo ranks vs 1 rank (rng=eager, 1 thread/rank)"
    try:
        one = run_child("shard_time", timeout, config=config, world=1)["times"][0]
        two = max(run_child("shard_time", timeout, config=config, world=2)["times"])
    except ChildError as error:
        report.error(name, "≤ 0.65×", error)
        return
    report.add(Row(name, f"{two:.2f} s", f"{one:.2f} s", f"{two / one:.2f}×", "≤ 0.65×", verdict(two <= 0.65 * one)))


def bench_inspection(report: Report, reps: int) -> None:
    """Absolute targets of the inspection and UI issues (seconds on this machine, median of reps)."""

    def row(name: str, case: str, limit: float, pick: Callable[[dict], float], **kwargs: Any) -> None:
        if case not in all_cases():
            return
        try:
            result = run_child(case, 900, **kwargs)
        except ChildError as error:
            report.error(name, f"≤ {limit:g} s", error)
            return
        value = pick(result)
        report.add(Row(name, f"{value:.3f} s", "—", "—", f"≤ {limit:g} s", verdict(value <= limit)))

    row("inspect(llama-7b): four tables", "inspect_time", 0.5, lambda r: r["median"], config="llama-7b", reps=reps)
    row("op_graph(llama-7b, depth=2) → SVG", "llama_7b_depth2_svg", 1.0, lambda r: r["median_s"], reps=reps)
    row("op_graph focused view of a 10,000-op graph → SVG", "synthetic_focus_view", 2.0,
        lambda r: r["median_s"], reps=reps)
    row("ExplorerWidget(llama-7b) first paint", "widget_timings", 1.5,
        lambda r: statistics.median(r["first_paint"]), reps=reps)
    row("ExplorerWidget(llama-7b) tree click re-render", "widget_timings", 0.5,
        lambda r: statistics.median(r["select"]), reps=reps)
    scale_reps = max(3, reps // 3)
    row("explorer search on llama-70b (kernel, first search: index built)", "scale_timings", 0.3,
        lambda r: statistics.median(r["first_search"]), reps=scale_reps)
    row("explorer search on llama-70b (kernel, later searches)", "scale_timings", 0.3,
        lambda r: statistics.median(r["search"]), reps=scale_reps)
    row("explorer overlay switch on llama-70b (kernel)", "scale_timings", 0.3,
        lambda r: statistics.median(r["overlay"]), reps=scale_reps)
    row("explorer first paint in Chromium, Run → tree visible (llama-7b)", "browser_first_paint", 3.0,
        lambda r: r["median"], reps=3)


# -- profiles -------------------------------------------------------------------------------------
def run_profiles(quick: bool, top: int) -> str:
    parts = ["# deferred-explorer profiles", ""]
    seven = "quick-7b" if quick else "llama-7b"
    one = "quick-1b" if quick else "llama-1.1b"
    seventy = "quick-70b" if quick else "llama-70b-4l"
    jobs: list[tuple[str, Callable[[], dict], Callable[[dict], str]]] = [
        (f"deferred_init {seven} (cProfile)",
         lambda: run_child("profile_deferred_init", 900, config=seven, top=top),
         lambda r: f"wall {r['time']:.3f} s under cProfile; {r['ops']} ops, {r['tensors']} tensors recorded"),
        (f"materialize_module {one} rng=eager (cProfile)",
         lambda: run_child("profile_materialize", 900, config=one, rng="eager", target="", top=top),
         lambda r: summary(r)),
        (f"materialize_module {seventy} layers[0] rng=eager (cProfile)",
         lambda: run_child("profile_materialize", 900, config=seventy, rng="eager", target="model.layers.0",
                           top=top),
         lambda r: summary(r)),
    ]
    for title, job, describe in jobs:
        log(f"profiling {title}")
        try:
            result = job()
        except ChildError as error:
            parts += [f"## {title}", "", "```", str(error), "```", ""]
            continue
        parts += [f"## {title}", "", describe(result), "", "```", result["text"].rstrip(), "```", ""]
    return "\n".join(parts)


def summary(r: dict) -> str:
    return (f"wall {r['time']:.2f} s. Timed breakdown (aten = kernel + dispatch of each op the replay calls; "
            f"RNG catch-up = random ops re-run on scratch tensors to reach the generator state):\n\n```\n"
            f"{r['breakdown']}\n```\n\ncProfile of a second, identical materialization (tottime of C calls "
            "is misattributed by cProfile; read it for the Python functions):")


BUILT_IN = ("deferred", "materialize", "layer", "jump", "checkpoint", "shards", "inspection")


# -- main -----------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small configs: a smoke run")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of the deferred_init and inspection timings (15)")
    parser.add_argument("--mat-reps", type=int, default=None, help="repetitions of the materialize cases (3)")
    parser.add_argument("--layer-rng", choices=["eager", "fast", "both"], default="both",
                        help="rng mode(s) for the one-layer cases")
    parser.add_argument("--layer-timeout", type=float, default=900.0, help="seconds allowed per layer case")
    topics = {topic.TOPIC: topic for topic in topic_modules()}
    parser.add_argument("--only", choices=[*BUILT_IN, *topics],
                        action="append",
                        help="run only these benchmarks (repeatable)")
    parser.add_argument("--profile", action="store_true", help="write cProfile reports to build/profile.md instead")
    parser.add_argument("--top", type=int, default=25, help="lines per profile table")
    parser.add_argument("--output", type=Path, default=ROOT / "build" / "bench.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child)
        return 0

    started = time.perf_counter()
    engine_dir, engine = snapshot_engine()
    try:
        return run(args, started, engine)
    finally:
        shutil.rmtree(engine_dir, ignore_errors=True)


def run(args: argparse.Namespace, started: float, engine: str) -> int:
    if args.profile:
        text = run_profiles(args.quick, args.top) + f"\n{engine}\n"
        out = args.output.with_name("profile.md") if args.output.name == "bench.md" else args.output
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(text)
        log(f"profiles written to {out} in {time.perf_counter() - started:.0f} s")
        return 0

    reps = args.reps or (3 if args.quick else 15)
    mat_reps = args.mat_reps or (1 if args.quick else 3)
    seven, one, seventy = ("quick-7b", "quick-1b", "quick-70b") if args.quick else ("llama-7b", "llama-1.1b", "llama-70b")
    topics = {topic.TOPIC: topic for topic in topic_modules()}
    only = set(args.only or [*BUILT_IN, *topics])
    report = Report()
    if "deferred" in only:
        log(f"1. deferred_init {seven} ({reps} interleaved reps)")
        fill_bench.bench_recording(report, seven, reps)
    if "materialize" in only:
        log(f"2. materialize {one} ({mat_reps} rounds of {len(MATERIALIZE_MODES)} fresh processes)")
        bench_materialize(report, one, mat_reps)
    if "layer" in only:
        rngs = ["eager", "fast"] if args.layer_rng == "both" else [args.layer_rng]
        log(f"3. the last layer of {seven} and of {seventy}, rng=eager vs rng=fast")
        bench_layer(report, seven, -1, rngs, args.layer_timeout, (1.5, 1.0), rss=False)
        bench_layer(report, seventy, -1, rngs, args.layer_timeout, (2.0, 2.0), rss=True)
        bench_layer(report, seventy, 0, rngs, args.layer_timeout, None, rss=True)
    if "jump" in only:
        log("4. the CPU generator jump")
        bench_rng_jump(report, reps)
        bench_trunc_normal(report)

    if "checkpoint" in only:
        checkpoint = "quick-1b" if args.quick else "llama-0.9b"
        log(f"4c. a bf16 sharded checkpoint of {checkpoint} under deferred_init")
        bench_checkpoint(report, checkpoint, args.layer_timeout)

    if "shards" in only:
        log(f"5. sharded materialization of {one}: 1 rank, then 2 ranks")
        bench_shards(report, one, args.layer_timeout)

    if "inspection" in only:
        log("6. inspection and notebook UI on llama-7b")
        bench_inspection(report, reps)

    for name, topic in topics.items():
        if name in only:
            log(f"7. {name}")
            topic.bench(report, args.quick, args.layer_timeout)

    import platform

    import torch
    import transformers

    elapsed = time.perf_counter() - started
    report.notes.append(engine)
    report.notes.append(
        f"total runtime {elapsed:.0f} s; {'quick' if args.quick else 'full'} configs; python "
        f"{platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}")
    header = "# deferred-explorer benchmarks" + (" (--quick)" if args.quick else "")
    text = report.markdown(header)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    log(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
