"""The fast trackers are PyTorch's, byte for byte: the same peak snapshot and the same snapshots of
every module in every state, on the same step (note [Fast memory trackers])."""

from __future__ import annotations

import torch
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch._subclasses.fake_tensor import FakeTensorMode

from explorer import deferred_init
from explorer.analysis.dry_run import tensor_leaves
from explorer.analysis.fake_fsdp import checkpoint_blocks, fake_process_group, repeated_blocks, shard_blocks
from explorer._torch_compat.memory_tracker import FastFSDPMemTracker, FastMemTracker
from explorer.analysis.train_twin import fake_twin
from tests.support.hf_configs import HF_BY_NAME, build_eager

LLAMA = HF_BY_NAME["llama"]


def eager_step(tracker_class: type, checkpointing: bool) -> tuple[dict, dict]:
    model = build_eager(LLAMA).train()
    if checkpointing:
        checkpoint_blocks(model, repeated_blocks(model))
    inputs = {"input_ids": LLAMA.inputs()["input_ids"], "labels": LLAMA.inputs()["input_ids"]}
    optimizer = torch.optim.AdamW(model.parameters())
    tracker = tracker_class()
    tracker.track_external(model, optimizer, *tensor_leaves(inputs))
    with tracker:
        model(**inputs).loss.backward()
        optimizer.step()
    modules = {path: tracker.memory_tracking[m].snapshots for path, m in model.named_modules() if m in tracker.memory_tracking}
    return tracker.get_tracker_snapshot("peak"), modules


def test_fast_memtracker_equals_memtracker_on_an_eager_llama_step():
    for checkpointing in (False, True):
        fast_peak, fast_modules = eager_step(FastMemTracker, checkpointing)
        peak, modules = eager_step(MemTracker, checkpointing)
        assert fast_peak == peak
        assert list(fast_modules) == list(modules)
        for path, snapshots in modules.items():
            assert fast_modules[path] == snapshots, path


def fsdp_step(tracker_class: type) -> tuple[dict, dict]:
    torch.manual_seed(0)
    deferred = deferred_init(LLAMA.cls, LLAMA.config())
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    twin = fake_twin(deferred, mode).train()
    ids = mode.from_tensor(LLAMA.inputs()["input_ids"])
    with fake_process_group(2) as mesh, mode:
        shard_blocks(twin, mesh)
        optimizer = torch.optim.AdamW(twin.parameters())
        tracker = tracker_class(twin, optimizer)
        tracker.track_inputs((ids,))
        with tracker:
            twin(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
        modules = {path: tracker.memory_tracking[m].snapshots for path, m in twin.named_modules() if m in tracker.memory_tracking}
        return tracker.get_tracker_snapshot("peak"), modules


def test_fast_fsdp_memtracker_equals_fsdp_memtracker_on_a_fake_two_rank_step():
    fast_peak, fast_modules = fsdp_step(FastFSDPMemTracker)
    peak, modules = fsdp_step(FSDPMemTracker)
    assert fast_peak == peak
    assert list(fast_modules) == ["", "model.layers.0", "model.layers.1"] == list(modules)
    for path, snapshots in modules.items():
        assert fast_modules[path] == snapshots, path


def test_frozen_parameters_get_no_gradient_hooks_and_no_gradients():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    model[0].requires_grad_(False)
    optimizer = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)
    tracker = FastMemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    assert {key.value: value for key, value in peak.items() if key != "Total"}["Gradient"] == (16 + 4) * 4
