"""Two fake ranks equal PyTorch's FSDPMemTracker on a real two-process gloo run of the eager model,
category by category; and train_step runs inside a live process group, leaving it as it was.

Two ranks are spawned (gloo on 127.0.0.1, as tests/explorer/test_distributed.py sets it up; spawned
rather than forked: a clean interpreter per rank); each shards
the eager Llama with the default wrapping (each decoder layer, then the root) and runs one AdamW
step under FSDPMemTracker; then, with its gloo group still up, the same step of the deferred model
on fake ranks (train_step's machinery, and train_step itself).

What is compared: every snapshot FSDPMemTracker takes at module boundaries (before and after
pre-forward, post-forward, pre-backward, post-backward of each sharded module), and the peak of the
forward; the step's peak within a bound. Not the step's peak exactly: gloo's CPU reduce-scatter stages a
copy of its input inside the backend (seen by the tracker, for the length of that call, when gloo
splits it), which NCCL and the fake backend do not; the real run's backward peak is that moment, the
copy on top, so it lies between the fake peak and the fake peak plus one reduce-scatter input. Gloo runs the
reduce-scatter on its own thread, so that copy may still be alive at the next backward boundary the
tracker snapshots (about one run in three): at backward boundaries, and only there, the real run may
show as Temp exactly one module's reduce-scatter input (its padded unsharded bytes) more.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import init_device_mesh

from explorer import deferred_init
from explorer.analysis.fake_fsdp import fake_process_group, shard_blocks
from explorer.analysis.train_step import default_loss, train_step
from explorer.analysis.train_twin import fake_twin
from tests.support.hf_configs import HF_BY_NAME, build_eager
from tests.support.ports import free_port

LLAMA = HF_BY_NAME["llama"]
WORLD = 2
TIMEOUT_S = 400  # for both ranks together: a guard against hangs on a loaded machine, not a timing check


def _inputs() -> dict[str, torch.Tensor]:
    ids = LLAMA.inputs()["input_ids"]
    return {"input_ids": ids, "labels": ids}


def _named(snapshot: dict) -> dict[str, int]:
    (device_snap,) = snapshot.values() or [{}]
    return {getattr(key, "value", key): value for key, value in device_snap.items()}


def _fsdp_step(model: torch.nn.Module, inputs: dict, mesh) -> dict:
    """FSDPMemTracker around one AdamW step: forward peak and every boundary snapshot per module."""
    shard_blocks(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters())
    tracker = FSDPMemTracker(model, optimizer)
    tracker.track_inputs(((), inputs))
    with tracker:
        value = default_loss(model(**inputs))
        forward_peak = _named(tracker.get_tracker_snapshot("peak"))
        value.backward()
        del value
        optimizer.step()
    step_peak = _named(tracker.get_tracker_snapshot("peak"))
    boundaries = {
        path: {
            state.value: [_named(s) for s in snaps]
            for state, snaps in tracker.memory_tracking[m].snapshots.items()
            if "Peak" not in state.value
        }
        for path, m in model.named_modules()
        if m in tracker.memory_tracking
    }
    return {
        "forward_peak": forward_peak,
        "step_peak": step_peak,
        "boundaries": boundaries,
        "reduce_scatter_bytes": _reduce_scatter_bytes(model),
    }


def _reduce_scatter_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Per sharded module, the bytes of its reduce-scatter input: its parameters padded and unsharded."""
    sizes = {}
    for path, module in model.named_modules():
        if hasattr(module, "_get_fsdp_state"):
            # one parameter group per fully_shard call here: torch 2.11 holds it as `_fsdp_param_group`;
            # later releases list groups in `_fsdp_param_groups`, `_fsdp_param_group` reading a single one
            group = module._get_fsdp_state()._fsdp_param_group
            sizes[path] = sum(
                fsdp_param.padded_sharded_param_size.numel() * WORLD * fsdp_param.sharded_param.element_size()
                for fsdp_param in (group.fsdp_params if group is not None else [])
            )
    return sizes


def _assert_equal_up_to_gloo_staging(fake: dict, eager: dict, staging: dict[str, int]) -> None:
    """Every boundary snapshot equal, but that a backward one of eager's may hold one gloo staged copy."""
    assert {p: {s: len(v) for s, v in st.items()} for p, st in fake.items()} == {
        p: {s: len(v) for s, v in st.items()} for p, st in eager.items()
    }
    for path, states in eager.items():
        for state, snapshots in states.items():
            for index, snapshot in enumerate(snapshots):
                expected = fake[path][state][index]
                extra = snapshot["Temp"] - expected["Temp"]
                if "Backward" in state and extra in staging.values():
                    snapshot = {**snapshot, "Temp": snapshot["Temp"] - extra, "Total": snapshot["Total"] - extra}
                assert snapshot == expected, (path, state, index)


def _fake_fsdp_step() -> dict:
    torch.manual_seed(0)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    twin = fake_twin(deferred_init(LLAMA.cls, LLAMA.config()), mode).train()
    ids = mode.from_tensor(_inputs()["input_ids"])
    with fake_process_group(WORLD) as mesh, mode:
        return _fsdp_step(twin, {"input_ids": ids, "labels": ids}, mesh)


def _rank(rank: int, port: int, out: Path) -> None:
    result: dict = {}
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=30))
        result["eager"] = _fsdp_step(build_eager(LLAMA).train(), _inputs(), init_device_mesh("cpu", (WORLD,)))
        result["fake"] = _fake_fsdp_step()
        torch.manual_seed(0)
        step = train_step(deferred_init(LLAMA.cls, LLAMA.config()), **_inputs(), world_size=WORLD)
        result["train_step_forward_peak"] = step.phase_peaks["forward"]
        result["after"] = [dist.get_backend(), dist.get_world_size(), dist.get_rank()]
        summed = torch.ones(1)
        dist.all_reduce(summed)  # the caller's gloo group still works
        result["all_reduce"] = summed.item()
        dist.destroy_process_group()
    except BaseException:
        result["error"] = traceback.format_exc()
    (out / f"rank{rank}.json").write_text(json.dumps(result))



def test_two_fake_ranks_equal_fsdp_memtracker_on_a_real_gloo_run(tmp_path):
    port = free_port()
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=_rank, args=(rank, port, tmp_path), daemon=True) for rank in range(WORLD)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + TIMEOUT_S
    for process in ranks:
        process.join(timeout=max(1.0, deadline - time.monotonic()))
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join()
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD)]
    for rank, result in enumerate(results):
        assert "error" not in result, result["error"]
        assert result["fake"]["forward_peak"] == result["eager"]["forward_peak"], rank
        assert list(result["fake"]["boundaries"]) == ["", "model.layers.0", "model.layers.1"]
        assert result["eager"]["reduce_scatter_bytes"] == result["fake"]["reduce_scatter_bytes"]
        staged = result["eager"]["step_peak"]["Total"] - result["fake"]["step_peak"]["Total"]
        assert 0 <= staged <= max(result["eager"]["reduce_scatter_bytes"].values()), rank
        _assert_equal_up_to_gloo_staging(
            result["fake"]["boundaries"], result["eager"]["boundaries"], result["eager"]["reduce_scatter_bytes"]
        )
        assert result["train_step_forward_peak"] == result["eager"]["forward_peak"]["Total"]
        assert result["after"] == ["gloo", WORLD, rank]
        assert result["all_reduce"] == WORLD
    assert results[0]["eager"]["forward_peak"]["All Gather"] > 0
