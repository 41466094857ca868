"""pipeline_step's fake stage ranks equal PyTorch's MemTracker on a real two-process gloo pipeline.

Two ranks are spawned (gloo on 127.0.0.1, as test_train_fsdp.py sets it up). Each builds the eager
Llama of tests/support/hf_configs.py with 4 decoder layers, splits it into 2 stages with
`pipeline_split` (stage 0: embedding and layers 0-1; stage 1: layers 2-3, norm, head), wraps its
stage in PyTorch's own `PipelineStage` (boundary shapes given, so no metadata is exchanged) and runs
`Schedule1F1B` over 4 microbatches under `PipelineMemTracker` (PyTorch's MemTracker, but that the
stage's root may run once per microbatch, note [A root that runs once per microbatch]):
`schedule.step(...)`, `optimizer.step()`, `optimizer.zero_grad(set_to_none=True)`, the step's
output kept until then. The test process runs `pipeline_step` for both ranks on the deferred model.

What is compared, per rank: the peak at the end of `schedule.step` (total) and the peak of the whole
step, total and every category, to the byte; the microbatches in flight (1F1B: stage 0 holds 2,
stage 1 holds 1); the P2P bytes, from the boundary shapes (2 × 32 × 32 float32 = 8,192 bytes a
microbatch each way).

One difference, exact and named: rank 0's real peak holds one more activation of 8,192 bytes (one
boundary output). Gloo keeps a tensor sent with `isend` alive inside the backend after the send has
completed (checked apart: a weak reference to a sent tensor stays alive after `wait()`, after the
Work is dropped, after a barrier; no Python object refers to it, and c10d's work registry is
empty). So microbatch 0's output, which its backward frees from stage 0's forward cache, is still
held at rank 0's peak. The fake backend holds nothing it sends. Gloo copies nothing: every storage
the real ranks allocate, the fake ones allocate, op for op (compared by op, phase and size). Rank 1
(the last stage, which sends only gradients, freed after the peak) is equal to the byte.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import socket
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from explorer import deferred_init
from explorer._torch_compat.memory_tracker import PipelineMemTracker
from explorer.analysis.parallel_layout import Layout, LayoutError
from explorer.analysis.pipeline_split import PipelineSplitError, split_stages
from explorer.analysis.pipeline_step import pipeline_step
from tests.support.hf_configs import HF_BY_NAME, VOCAB

LLAMA = HF_BY_NAME["llama"]
WORLD = 2
LAYERS = 4
MICROBATCHES = 4
MICRO_BATCH, SEQ = 2, 32
TIMEOUT_S = 300  # both ranks together: a guard against hangs on a loaded machine, not a timing check


def _config():
    config = LLAMA.config()
    config.num_hidden_layers = LAYERS
    return config


def _tokens(batch: int) -> torch.Tensor:
    return (torch.arange(batch * SEQ).reshape(batch, SEQ) * 7 + 3) % (VOCAB - 3) + 3


def _named(snapshot: dict) -> dict[str, int]:
    (device_snap,) = snapshot.values() or [{}]
    return {getattr(key, "value", key): value for key, value in device_snap.items()}


def _real_stage_step(rank: int) -> dict:
    """Rank `rank`'s stage of the eager model under Schedule1F1B on the gloo group, measured."""
    torch.manual_seed(0)
    model = LLAMA.cls(_config()).train()
    (stage_module,) = split_stages(model, WORLD, [rank])
    hidden = torch.zeros(MICRO_BATCH, SEQ, _config().hidden_size, requires_grad=True)
    logits = torch.zeros(MICRO_BATCH, SEQ, VOCAB, requires_grad=True)
    stage = PipelineStage(
        stage_module, rank, WORLD, torch.device("cpu"),
        input_args=(_tokens(MICRO_BATCH) if rank == 0 else hidden,),
        output_args=(hidden if rank == 0 else logits,),
    )  # fmt: skip
    vocab = model.config.vocab_size
    schedule = Schedule1F1B(stage, MICROBATCHES, loss_fn=lambda out, target: model.loss_function(out, target, vocab))
    optimizer = torch.optim.AdamW(stage_module.parameters())
    batch = _tokens(MICRO_BATCH * MICROBATCHES)
    tracker = PipelineMemTracker()
    tracker.track_external(stage_module, optimizer, batch, batch)
    with tracker:
        output = schedule.step(batch) if rank == 0 else schedule.step(target=batch)
        schedule_peak = _named(tracker.get_tracker_snapshot("peak"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del output
    return {"schedule_peak": schedule_peak, "step_peak": _named(tracker.get_tracker_snapshot("peak"))}


def _rank(rank: int, port: int, out: Path) -> None:
    result: dict = {}
    try:
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
        result = _real_stage_step(rank)
        dist.destroy_process_group()
    except BaseException:
        result["error"] = traceback.format_exc()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _real_run(tmp_path: Path) -> list[dict]:
    port = _free_port()
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
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


def test_fake_stage_ranks_equal_memtracker_on_a_real_gloo_1f1b_pipeline(tmp_path):
    real = _real_run(tmp_path)
    torch.manual_seed(0)
    layout = Layout(pp=WORLD, pp_schedule="1F1B", micro_batch_size=MICRO_BATCH, accumulation_steps=MICROBATCHES)
    fake = pipeline_step(deferred_init(LLAMA.cls, _config()), _tokens(MICRO_BATCH), layout=layout)
    hidden_bytes = MICRO_BATCH * SEQ * _config().hidden_size * 4
    for rank, (eager, step) in enumerate(zip(real, fake, strict=True)):
        assert "error" not in eager, eager["error"]
        assert step.rank == rank
        kept_by_gloo = hidden_bytes if rank == 0 else 0  # see the module docstring
        assert (
            max(step.phase_peaks["forward"], step.phase_peaks["backward"]) + kept_by_gloo
            == eager["schedule_peak"]["Total"]
        )
        assert step.peak_bytes + kept_by_gloo == eager["step_peak"]["Total"]
        ours = {
            name: step.peak[name] + (kept_by_gloo if name == "activations" else 0)
            for name in step.peak
            if step.peak[name]
        }
        theirs = {
            {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients", "Optstate": "optimizer_state",
             "Activation": "activations", "Temp": "temporaries", "Other": "inputs"}[key]: value
            for key, value in eager["step_peak"].items()
            if key != "Total" and value
        }  # fmt: skip
        assert ours == theirs, rank
    assert [step.in_flight for step in fake] == [{0: 2}, {1: 1}]
    sent = MICROBATCHES * hidden_bytes
    assert fake[0].p2p_bytes == {
        "activations_sent": sent, "activations_received": 0, "gradients_sent": 0, "gradients_received": sent,
    }  # fmt: skip
    assert fake[1].p2p_bytes == {
        "activations_sent": 0, "activations_received": sent, "gradients_sent": sent, "gradients_received": 0,
    }  # fmt: skip


# -- fast tests: one process, fake ranks only -------------------------------------------------------
TINY_HIDDEN_BYTES = 1 * 8 * 32 * 4  # a (1, 8) microbatch's hidden states, float32


def _tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return deferred_init(LLAMA.cls, _config())


@pytest.fixture(scope="module")
def one_f_one_b() -> list:
    """Both ranks of the tiny Llama (4 blocks) over 2 stages, 1F1B, 3 microbatches of (1, 8)."""
    return pipeline_step(_tiny_llama(), (1, 8), layout=Layout(pp=2, accumulation_steps=3))


def test_1f1b_stages_hold_pp_minus_their_index_microbatches_in_flight(one_f_one_b):
    assert [step.in_flight for step in one_f_one_b] == [{0: 2}, {1: 1}]
    assert [(step.stages, step.embedding, step.head) for step in one_f_one_b] == [
        ((0,), True, False),
        ((1,), False, True),
    ]


def test_gpipe_stages_hold_every_microbatch_in_flight():
    steps = pipeline_step(_tiny_llama(), (1, 8), layout=Layout(pp=2, pp_schedule="GPipe", accumulation_steps=3))
    assert [step.in_flight for step in steps] == [{0: 3}, {1: 3}]


def test_interleaved_ranks_run_looped_stages_and_pass_each_boundary_once_per_microbatch():
    layout = Layout(pp=2, pp_schedule="Interleaved1F1B", stages_per_rank=2, accumulation_steps=4)
    first, second = pipeline_step(_tiny_llama(), (1, 8), layout=layout)
    assert (first.stages, first.blocks, first.embedding, first.head) == (
        (0, 2), ("model.layers.0", "model.layers.2"), True, False,
    )  # fmt: skip
    assert (second.stages, second.embedding, second.head) == ((1, 3), False, True)
    per_boundary = 4 * TINY_HIDDEN_BYTES
    # rank 0: stage 0 sends to 1; stage 2 receives from 1 and sends to 3 (gradients the other way)
    assert first.p2p_bytes == {
        "activations_sent": 2 * per_boundary, "activations_received": per_boundary,
        "gradients_sent": per_boundary, "gradients_received": 2 * per_boundary,
    }  # fmt: skip
    assert second.p2p_total == first.p2p_total


def test_one_rank_is_measured_alone_and_equals_its_row_of_all_ranks(one_f_one_b):
    (alone,) = pipeline_step(_tiny_llama(), (1, 8), layout=Layout(pp=2, accumulation_steps=3), rank=1)
    assert alone == one_f_one_b[1]


def test_checkpointing_every_block_lowers_the_stages_forward_peak(one_f_one_b):
    layout = Layout(pp=2, accumulation_steps=3, activation_checkpointing="block")
    (checkpointed,) = pipeline_step(_tiny_llama(), (1, 8), layout=layout, rank=1)
    assert checkpointed.phase_peaks["forward"] < one_f_one_b[1].phase_peaks["forward"]


def test_fsdp_or_tp_inside_a_stage_is_refused_naming_the_degree():
    with pytest.raises(LayoutError, match=r"Layout\.dp_shard=2 is not covered"):
        pipeline_step(_tiny_llama(), (1, 8), layout=Layout(pp=2, dp_shard=2, accumulation_steps=4))


def test_inputs_of_another_micro_batch_size_are_refused_with_both_sizes():
    message = "the inputs hold a microbatch of 2 sequences, Layout.micro_batch_size is 1"
    with pytest.raises(LayoutError, match=message):
        pipeline_step(_tiny_llama(), (2, 8), layout=Layout(pp=2, accumulation_steps=4))


def test_a_model_without_a_pipeline_split_is_refused_by_name():
    with pytest.raises(PipelineSplitError, match="no pipeline split for Sequential"):
        pipeline_step(torch.nn.Sequential(torch.nn.Linear(2, 2)), (1, 2), layout=Layout(pp=2, accumulation_steps=2))


def test_a_rank_outside_the_pipeline_is_refused():
    with pytest.raises(ValueError, match=r"rank must be in 0\.\.1 for Layout\.pp=2, got 2"):
        pipeline_step(_tiny_llama(), (1, 8), layout=Layout(pp=2, accumulation_steps=4), rank=2)
