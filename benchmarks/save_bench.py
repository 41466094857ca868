"""save_checkpoint benchmark: the Llama-2-7B architecture (27 GB in float32, more than this machine's
RAM) written from a deferred model.

Three child workloads, each in a fresh process, writing into a temporary directory under build/ on
the same disk (deleted afterwards):
- `save_time_rss`: `save_checkpoint(model, dir)` (safetensors, 5 GB shards) on the deferred model
  built before the clock starts; peak RSS sampled on a thread (target ≤ 3 GiB, absolute);
- `raw_fill_write`: the baseline, on the same tensors: `torch.empty(shape).normal_()` on all threads,
  then the same bytes written to one file, one tensor at a time; the save's time must be ≤ 1.3 × the
  sum of the two, measured in the same run (cases interleaved, rotated each round, medians);
- `two_rank_dcp`: 2 gloo ranks (forked), each `save_checkpoint(model, dir, format="dcp")` on the
  deferred model: each writes its Shard(0) rows; target: each rank's peak RSS growth during the save
  (as tests/explorer/test_distributed.py measures ranks) ≤ its own shards (the bytes it wrote) + the
  largest tensor + 300 MB. The absolute peaks are in the notes.

`--quick` uses the quick-7b shapes. `dtype` stays float32 (the disk must hold 27 GB; the children
refuse to start otherwise, saying how much is free).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path

from cases import RssSampler, llama_config, rss_bytes
from harness import ROOT, ChildError, Report, Row, log, run_child, seconds, verdict

TOPIC = "save"
RSS_TARGET = 3 * 2**30
TIME_RATIO_TARGET = 1.3
RANK_OVERHEAD = 300 * 10**6
SCRATCH = ROOT / "build"


def _scratch(prefix: str, needed: int) -> Path:
    SCRATCH.mkdir(exist_ok=True)
    free = shutil.disk_usage(SCRATCH).free
    if free < needed * 1.05:
        raise RuntimeError(f"{SCRATCH} has {free / 1e9:.1f} GB free; this case writes {needed / 1e9:.1f} GB")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=SCRATCH))


def _deferred_llama(config: str):
    import torch
    from transformers import LlamaForCausalLM

    import explorer

    torch.manual_seed(0)
    return explorer.deferred_init(LlamaForCausalLM, llama_config(config))


def _stored_shapes(config: str) -> list[tuple[list[int], str]]:
    """Shapes and dtypes of the tensors a save writes (ties once), from meta-device construction."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(config))
    seen, shapes = set(), []
    for tensor in model.state_dict(keep_vars=True).values():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            shapes.append((list(tensor.shape), str(tensor.dtype).removeprefix("torch.")))
    return shapes


def _bytes_of(shapes: list[tuple[list[int], str]]) -> int:
    import math

    import torch

    return sum(math.prod(shape) * getattr(torch, dtype).itemsize for shape, dtype in shapes)


def _warm_up() -> None:
    """Pay lazy imports and first-call costs (replay, generator calibration) on a tiny model."""
    from explorer import save_checkpoint

    directory = Path(tempfile.mkdtemp(prefix="save-bench-warm-", dir=SCRATCH))
    try:
        save_checkpoint(_deferred_llama("tiny"), directory, progress=False)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def save_time_rss(config: str = "llama-7b") -> dict:
    """Child: seconds and peak RSS of save_checkpoint (safetensors) on the deferred model."""
    from explorer import save_checkpoint

    SCRATCH.mkdir(exist_ok=True)
    _warm_up()
    model = _deferred_llama(config)
    directory = _scratch("save-bench-", _bytes_of(_stored_shapes(config)))
    try:
        gc.collect()
        before = rss_bytes()
        with RssSampler() as sampler:
            started = time.perf_counter()
            written = save_checkpoint(model, directory, progress=False)
            elapsed = time.perf_counter() - started
        size = sum(path.stat().st_size for path in written)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"seconds": elapsed, "peak_rss": sampler.peak, "rss_before": before, "bytes": size, "files": len(written)}


def raw_fill_write(config: str = "llama-7b") -> dict:
    """Child: the baseline: normal_ on all threads, then a plain write of the same bytes, per tensor."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    torch.empty(1024).normal_()  # first-call costs, as the save's warm-up pays them
    shapes = _stored_shapes(config)
    directory = _scratch("save-bench-raw-", _bytes_of(shapes))
    fill = write = 0.0
    try:
        with open(directory / "raw.bin", "wb") as stream:
            for shape, dtype in shapes:
                tensor = torch.empty(shape, dtype=getattr(torch, dtype))
                started = time.perf_counter()
                tensor.normal_()
                fill += time.perf_counter() - started
                started = time.perf_counter()
                stream.write(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
                write += time.perf_counter() - started
                del tensor
            started = time.perf_counter()
            stream.flush()
            write += time.perf_counter() - started
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"fill": fill, "write": write, "seconds": fill + write}


def _rank(rank: int, world: int, port: int, config: str, directory: Path, out: Path) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from explorer import save_checkpoint

    torch.set_num_threads(1)  # OpenMP pools do not survive fork; one core per rank on this machine
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=1800))
    try:
        model = _deferred_llama(config)
        largest = max(t.numel() * t.element_size() for t in model.state_dict().values())
        totals = [0, 0]

        def progress(done: int, total: int, done_bytes: int, total_bytes: int) -> None:
            totals[:] = [total, total_bytes]

        gc.collect()
        before = rss_bytes()
        with RssSampler() as sampler:
            started = time.perf_counter()
            save_checkpoint(model, directory, format="dcp", progress=progress)
            elapsed = time.perf_counter() - started
        (out / f"rank{rank}.json").write_text(json.dumps({
            "seconds": elapsed, "peak_rss": sampler.peak, "rss_before": before, "own_bytes": totals[1],
            "tensors": totals[0], "largest": largest}))
    finally:
        dist.destroy_process_group()


def two_rank_dcp(config: str = "llama-7b", world: int = 2) -> dict:
    """Child: `world` forked gloo ranks save the deferred model as DCP; per-rank peak RSS and bytes."""
    import torch  # noqa: F401 - imported before forking, so ranks start with it

    import explorer  # noqa: F401

    directory = _scratch("save-bench-dcp-", _bytes_of(_stored_shapes(config)))
    out = Path(tempfile.mkdtemp(prefix="save-bench-ranks-", dir=SCRATCH))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=_rank, args=(r, world, port, config, directory, out)) for r in range(world)]
    try:
        for process in ranks:
            process.start()
        for process in ranks:
            process.join(3000)
        failed = [p.exitcode for p in ranks if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"ranks exited with {[p.exitcode for p in ranks]}")
        size = sum(path.stat().st_size for path in directory.iterdir())
        return {"ranks": [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)], "bytes": size}
    finally:
        for process in ranks:
            if process.is_alive():
                process.kill()
                process.join()
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


CASES = {"save_time_rss": save_time_rss, "raw_fill_write": raw_fill_write, "two_rank_dcp": two_rank_dcp}


def bench(report: Report, quick: bool, timeout: float) -> None:
    config = "quick-7b" if quick else "llama-7b"
    reps = 3 if quick else 1
    runs: dict[str, list[dict]] = {"save_time_rss": [], "raw_fill_write": []}
    try:
        for round_ in range(reps):  # interleaved, rotated each round
            order = list(runs) if round_ % 2 == 0 else list(reversed(runs))
            for case in order:
                runs[case].append(run_child(case, max(timeout, 1800), config=config))
    except ChildError as error:
        report.error(f"save_checkpoint {config} (time, RSS)", "≤ 1.3×, ≤ 3 GiB", error)
    else:
        _report_single(report, config, runs)
    name = f"save_checkpoint {config} as DCP on 2 gloo ranks: peak RSS growth per rank"
    try:
        ranks = run_child("two_rank_dcp", max(timeout, 3600), config=config)
    except ChildError as error:
        report.error(name, "≤ own shards + largest + 300 MB", error)
        return
    _report_ranks(report, name, config, ranks)


def _report_single(report: Report, config: str, runs: dict[str, list[dict]]) -> None:
    save = statistics.median(r["seconds"] for r in runs["save_time_rss"])
    raw = statistics.median(r["seconds"] for r in runs["raw_fill_write"])
    peak = max(r["peak_rss"] for r in runs["save_time_rss"])
    size = runs["save_time_rss"][0]["bytes"]
    report.add(Row(f"save_checkpoint {config} float32 safetensors ({size / 1e9:.1f} GB): time vs raw fill + write",
                   f"{save:.1f} s", f"{raw:.1f} s", f"{save / raw:.2f}×", f"≤ {TIME_RATIO_TARGET}×",
                   verdict(save <= TIME_RATIO_TARGET * raw)))
    report.add(Row(f"save_checkpoint {config} float32 safetensors: peak RSS (absolute)", f"{peak / 2**30:.2f} GiB",
                   "—", "—", "≤ 3 GiB", verdict(peak <= RSS_TARGET)))
    fills = [r["fill"] for r in runs["raw_fill_write"]]
    writes = [r["write"] for r in runs["raw_fill_write"]]
    report.notes.append(f"save {config}: save s: {seconds([r['seconds'] for r in runs['save_time_rss']])}; raw fill s: "
                        f"{seconds(fills)}; raw write s: {seconds(writes)}; RSS before save "
                        f"{runs['save_time_rss'][0]['rss_before'] / 2**20:.0f} MiB; "
                        f"{runs['save_time_rss'][0]['files']} files")
    log(f"save {config}: {save:.1f} s vs raw {raw:.1f} s; peak RSS {peak / 2**30:.2f} GiB")


def _report_ranks(report: Report, name: str, config: str, ranks: dict) -> None:
    worst, texts = True, []
    for rank, info in enumerate(ranks["ranks"]):
        bound = info["own_bytes"] + info["largest"] + RANK_OVERHEAD
        worst = worst and info["peak_rss"] - info["rss_before"] <= bound
        texts.append(f"rank {rank}: peak {info['peak_rss'] / 2**30:.2f} GiB (growth "
                     f"{(info['peak_rss'] - info['rss_before']) / 2**20:.0f} MiB), bound {bound / 2**30:.2f} GiB, "
                     f"wrote {info['own_bytes'] / 1e9:.2f} GB in {info['seconds']:.0f} s")
    growth = max(info["peak_rss"] - info["rss_before"] for info in ranks["ranks"])
    bound = min(info["own_bytes"] + info["largest"] + RANK_OVERHEAD for info in ranks["ranks"])
    report.add(Row(name, f"{growth / 2**30:.2f} GiB", f"{bound / 2**30:.2f} GiB", f"{growth / bound:.2f}×",
                   "growth ≤ own shards + largest + 300 MB", verdict(worst)))
    report.notes.append(f"save {config} DCP 2 ranks ({ranks['bytes'] / 1e9:.1f} GB): " + "; ".join(texts))
