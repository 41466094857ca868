"""layout_step: rank 0 of a fake FSDP2 × TP × AC layout equals PyTorch's trackers on real gloo ranks;
the tensor-parallel plan mapping; collective bytes.

Ground truth (tests/support/layout_worker.py): ranks started from this process (one launch per world
size) join a gloo group on 127.0.0.1, parallelize the eager tiny Llama by hand
(torchtitan's plan written out as DTensor styles, `checkpoint_wrapper`, `fully_shard` per layer then
root), and run the loop users write under `MemTracker` (TP only) or `FSDPMemTracker` (with FSDP).
Rank 0 then runs the same step on fakes: the deferred model's twin parallelized by layout_step's own
`parallelize_twin` under the same tracker code (every module-boundary snapshot), and `layout_step`.
Layouts: TP 2, FSDP 2 with block checkpointing and FSDP 2 with FSDP2's bf16 mixed precision policy
on 2 ranks; FSDP 2 × TP 2 and HSDP 2 × 2 on 4.

What is equal to the byte: the forward peak, the snapshot at the end of forward, every boundary
snapshot before backward, and layout_step's forward peak and end of forward. One named difference,
FSDP only: gloo's CPU reduce-scatter stages a copy of its input (the module's padded unsharded
parameters: 37,120 bytes for a decoder layer at FSDP 2 and HSDP 2 × 2, 18,688 at FSDP 2 × TP 2,
24,704 / 12,416 for the root) inside the backend, which the tracker sees for that call and which NCCL and the fake
backend do not (test_train_fsdp.py's docstring); gloo runs it on its own thread, so the copy may still
be alive at the next backward boundary. So: at backward boundaries a snapshot of eager may hold, as
Temp, exactly one module's reduce-scatter input more; the backward and step peaks of eager lie
between layout_step's and layout_step's plus the largest reduce-scatter input. TP's all-reduces and
all-gathers on gloo stage nothing the tracker sees: the TP-only layout is equal everywhere, once each
eager rank gives gloo's worker threads the CPU after every wait (tests/support/gloo_threads.py: on a
loaded machine a worker thread otherwise frees a finished all-reduce's buffer some boundaries late).

One named difference of some releases: DTensor runs each op on fakes of the *global* shapes to learn
its output's metadata, and on torch 2.11 PyTorch's MemTracker counts those fakes in eager as
allocations (they allocate nothing): 8,192 bytes for a 64 × 32 float op, measured by
`layout_worker.tracker_counts_dtensor_meta_fakes` on each run (0 on 2.13 and later). layout_step
does not count them (note [DTensor's meta propagation under our fake mode]). Where the probe is not
0, PyTorch's peaks (which fall inside an op) are only an upper bound on ours; so are its module-boundary
snapshots in ranks spawned with DTensor's sharding caches cold (the fakes a first propagation makes
can still be alive at a boundary), category by category; the end of forward stays equal to the byte.
On 2.13 and later every check is exact. Ranks are forked on CPU builds of torch and spawned on CUDA
builds, where a process forked after a backward cannot run one (earlier tests here run backwards).
"""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from explorer import deferred_init
from explorer._torch_compat.fake import FakeTensorMode
from explorer.analysis.comm_count import CollectiveCounter
from explorer.analysis.fake_fsdp import fake_process_group
from explorer.analysis.layout_step import MESH_DIMS, layout_step, parallelize_twin
from explorer.analysis.parallel_layout import Layout, LayoutError
from explorer.analysis.tp_plans import TensorParallelPlanError, parallel_style, tp_plan_of
from explorer.analysis.train_step import train_step
from explorer.analysis.train_twin import fake_twin
from tests.support import layout_worker
from tests.support.hf_configs import HF_BY_NAME
from tests.support.ports import free_port

LLAMA = HF_BY_NAME["llama"]
IDS = torch.ones(1, 8, dtype=torch.long)
TIMEOUT_S = 300  # for every rank together: a guard against hangs, not a timing check



def _run_ranks(world: int, out: Path) -> dict[str, dict]:
    """`world` ranks running every scenario of `layout_worker.SCENARIOS[world]`; rank 0's results.
    Forked on CPU builds of torch; spawned on CUDA builds, where a process forked after this one ran a
    backward cannot run one (autograd's device threads do not survive fork)."""
    context = multiprocessing.get_context("fork" if torch.version.cuda is None else "spawn")
    port = free_port()
    ranks = [context.Process(target=layout_worker.run_rank, args=(r, world, port, out)) for r in range(world)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + TIMEOUT_S
    for process in ranks:
        process.join(timeout=max(1.0, deadline - time.monotonic()))
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join()
    results = {}
    for name in layout_worker.SCENARIOS[world]:
        for rank in range(world):
            result = json.loads((out / f"{name}-rank{rank}.json").read_text())
            assert "error" not in result, (name, rank, result["error"])
        results[name] = json.loads((out / f"{name}-rank0.json").read_text())
    return results


def _ours(named: dict[str, int]) -> dict[str, int]:
    """PyTorch's category names → layout_step's, as `train_step.CATEGORY_OF` maps them (every name)."""
    from explorer.analysis.train_step import CATEGORY_OF

    mapped: dict[str, int] = {}
    for key, value in named.items():
        if key != "Total":
            mapped[CATEGORY_OF[key]] = mapped.get(CATEGORY_OF[key], 0) + value
    return mapped


def _assert_boundaries_equal_up_to_gloo_staging(
    fake: dict, eager: dict, staging: dict[str, int], meta_fakes_counted: bool = False
) -> None:
    """Every boundary snapshot equal, but that a backward one of eager's may hold one staged copy;
    where this release's tracker counts DTensor's metadata fakes, eager's bound ours from above."""
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
                if meta_fakes_counted:
                    assert snapshot.keys() == expected.keys(), (path, state, index)
                    assert all(snapshot[key] >= expected[key] for key in snapshot), (path, state, index)
                else:
                    assert snapshot == expected, (path, state, index)


def _assert_peak(eager: int, ours: int, result: dict, staged_at_most: int = 0) -> None:
    """Equal, but for gloo's staged copy (up to `staged_at_most`) and, where this release's tracker
    counts DTensor's metadata fakes, anything above ours (module docstring)."""
    if result["tracker_counts_dtensor_meta_fakes"]:
        assert eager >= ours
    else:
        assert 0 <= eager - ours <= staged_at_most


def _assert_layout_step_matches(result: dict, staged_at_most: int) -> None:
    eager, step = result["eager"], result["layout_step"]
    _assert_peak(eager["forward_peak"]["Total"], step["phase_peaks"]["forward"], result)
    assert step["end_of_forward"] == _ours(eager["end_of_forward"])
    assert step["end_of_forward_bytes"] == eager["end_of_forward"]["Total"]
    for phase, eager_peak in (("backward", eager["backward_peak"]), ("optimizer", eager["step_peak"])):
        _assert_peak(eager_peak["Total"], step["phase_peaks"][phase], result, staged_at_most)
    if staged_at_most == 0 and not result["tracker_counts_dtensor_meta_fakes"]:
        assert step["peak"] == _ours(eager["step_peak"])


def _assert_fake_matches(result: dict) -> None:
    """The fake twin under PyTorch's tracker: the end of forward equal, the forward peak equal but
    for DTensor's metadata fakes where this release's tracker counts them."""
    fake, eager = result["fake"], result["eager"]
    assert fake["end_of_forward"] == eager["end_of_forward"]
    if result["tracker_counts_dtensor_meta_fakes"]:
        assert eager["forward_peak"]["Total"] >= fake["forward_peak"]["Total"]
    else:
        assert fake["forward_peak"] == eager["forward_peak"]


@pytest.mark.slow
def test_tp_and_checkpointed_fsdp_on_two_fake_ranks_equal_pytorchs_trackers_on_two_gloo_ranks(tmp_path):
    results = _run_ranks(2, tmp_path)
    tp = results["tp2"]
    if tp["tracker_counts_dtensor_meta_fakes"]:
        _assert_boundaries_equal_up_to_gloo_staging(tp["fake"]["boundaries"], tp["eager"]["boundaries"], {}, True)
        _assert_fake_matches(tp)
    else:
        assert tp["fake"] == tp["eager"]  # every snapshot, every boundary of every module: no exception
    _assert_layout_step_matches(tp, staged_at_most=0)
    assert tp["layout_step"]["calls"] == {
        "all_gather": 1, "reduce_scatter": 0, "all_reduce": 16, "all_to_all": 0, "broadcast": 0,
    }  # fmt: skip

    checkpointed = results["fsdp2-ac-block"]
    staging = checkpointed["eager"]["reduce_scatter_bytes"]
    assert staging == checkpointed["fake"]["reduce_scatter_bytes"] == {
        "": 24704, "model.layers.0": 37120, "model.layers.1": 37120,
    }  # fmt: skip
    _assert_fake_matches(checkpointed)
    _assert_boundaries_equal_up_to_gloo_staging(
        checkpointed["fake"]["boundaries"],
        checkpointed["eager"]["boundaries"],
        staging,
        checkpointed["tracker_counts_dtensor_meta_fakes"],
    )
    _assert_layout_step_matches(checkpointed, staged_at_most=max(staging.values()))

    # FSDP2's bf16 policy: parameters gathered and computed in bf16, gradients reduced in fp32 (the
    # staged reduce-scatter input is the fp32 one, as without the policy)
    mixed = results["fsdp2-bf16"]
    assert mixed["eager"]["reduce_scatter_bytes"] == mixed["fake"]["reduce_scatter_bytes"] == staging
    _assert_fake_matches(mixed)
    _assert_boundaries_equal_up_to_gloo_staging(
        mixed["fake"]["boundaries"], mixed["eager"]["boundaries"], staging, mixed["tracker_counts_dtensor_meta_fakes"]
    )
    _assert_layout_step_matches(mixed, staged_at_most=max(staging.values()))
    gathered = [result["layout_step"]["communication"]["all_gather"] for result in (mixed, checkpointed)]
    assert gathered[0] * 2 == gathered[1]  # the same gathers, of bf16 parameters


@pytest.mark.slow
def test_fsdp_by_tp_and_hsdp_on_four_fake_ranks_equal_fsdp_memtracker_on_four_gloo_ranks(tmp_path):
    results = _run_ranks(4, tmp_path)
    for name, staged in (
        ("fsdp2-tp2", {"": 12416, "model.layers.0": 18688, "model.layers.1": 18688}),
        ("hsdp2x2", {"": 24704, "model.layers.0": 37120, "model.layers.1": 37120}),
    ):
        result = results[name]
        assert result["eager"]["reduce_scatter_bytes"] == result["fake"]["reduce_scatter_bytes"] == staged, name
        _assert_fake_matches(result)
        _assert_boundaries_equal_up_to_gloo_staging(
            result["fake"]["boundaries"],
            result["eager"]["boundaries"],
            staged,
            result["tracker_counts_dtensor_meta_fakes"],
        )
        _assert_layout_step_matches(result, staged_at_most=max(staged.values()))

    staged = results["fsdp2-tp2"]["eager"]["reduce_scatter_bytes"]
    layers = staged["model.layers.0"] + staged["model.layers.1"]
    logits = 2 * 8 * 96 * 4  # the head's output gathered over TP: batch × sequence × vocabulary floats
    assert results["fsdp2-tp2"]["layout_step"]["communication"] == {
        "all_gather": sum(staged.values()) + layers + logits,  # each layer gathered again for backward
        "reduce_scatter": sum(staged.values()),
        "all_reduce": 32768,  # TP: 5 forward + 11 backward all-reduces of 2 × 8 × 32 floats
        "all_to_all": 0,
        "broadcast": 0,
    }
    hsdp = results["hsdp2x2"]["layout_step"]["communication"]
    assert hsdp["all_reduce"] == sum(results["hsdp2x2"]["eager"]["reduce_scatter_bytes"].values()) // 2  # shards


# -- the plan -------------------------------------------------------------------------------------


def test_tp_plan_of_a_llama_is_its_base_plan_under_model_plus_its_head():
    model = deferred_init(LLAMA.cls, LLAMA.config())
    layers = "model.layers.*"
    plan = tp_plan_of(model)
    assert {path: style for path, style in plan.items() if path != "model.embed_tokens"} == {
        f"{layers}.self_attn.q_proj": "colwise",
        f"{layers}.self_attn.k_proj": "colwise",
        f"{layers}.self_attn.v_proj": "colwise",
        f"{layers}.self_attn.o_proj": "rowwise",
        f"{layers}.mlp.gate_proj": "colwise",
        f"{layers}.mlp.up_proj": "colwise",
        f"{layers}.mlp.down_proj": "rowwise",
        "lm_head": "colwise_gather_output",
    }
    # transformers composes the same plan on the model itself; 5.24 adds the embedding
    # ("embedding_rowwise"), 5.20 (the newest for Python 3.10) does not
    assert plan == dict(model._tp_plan)


def test_tp_plan_of_leaves_out_keys_that_name_nothing_as_transformers_does():
    # transformers 4 copies the base model's unprefixed keys ("layers.*...") into the head's _tp_plan,
    # where they name nothing; applying the plan, transformers skips them
    model = deferred_init(LLAMA.cls, LLAMA.config())
    model._tp_plan = {**(model._tp_plan or {}), "layers.*.self_attn.q_proj": "colwise", "nowhere": "rowwise"}
    plan = tp_plan_of(model)
    assert "layers.*.self_attn.q_proj" not in plan and "nowhere" not in plan
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise"


def test_tp_plan_of_a_plain_module_is_none():
    assert tp_plan_of(nn.Sequential(nn.Linear(2, 2))) is None


@pytest.mark.parametrize(
    ("name", "kind", "input_layouts", "output_layouts"),
    [
        ("colwise", ColwiseParallel, (Replicate(),), (Shard(-1),)),
        ("rowwise", RowwiseParallel, (Shard(-1),), (Replicate(),)),
        ("colwise_rep", ColwiseParallel, (Replicate(),), (Replicate(),)),
        ("colwise_gather_output", ColwiseParallel, (Replicate(),), (Replicate(),)),
        ("rowwise_rep", RowwiseParallel, (Replicate(),), (Replicate(),)),
        ("rowwise_split_input", RowwiseParallel, (Replicate(),), (Replicate(),)),
        ("embedding_rowwise", RowwiseParallel, (Replicate(),), (Replicate(),)),
        ("embedding_colwise", ColwiseParallel, (Replicate(),), (Replicate(),)),
    ],
)
def test_each_hugging_face_style_maps_to_the_dtensor_style_with_its_layouts(name, kind, input_layouts, output_layouts):
    style = parallel_style(name, "layers.0.proj")
    assert type(style) is kind
    assert (style.input_layouts, style.output_layouts) == (input_layouts, output_layouts)


def test_tied_embedding_and_head_stay_one_parameter_under_tp():
    qwen2 = HF_BY_NAME["qwen2"]  # tie_word_embeddings=True; embedding_rowwise and the head both shard the vocabulary
    module = deferred_init(qwen2.cls, qwen2.config())
    twin = fake_twin(module, FakeTensorMode(allow_non_fake_inputs=True))
    with fake_process_group(2, "cpu", (1, 1, 2), MESH_DIMS) as mesh:
        parallelize_twin(twin, mesh, Layout(tp=2), tp_plan_of(module))
        assert twin.lm_head.weight is twin.model.embed_tokens.weight
        assert twin.lm_head.weight.to_local().shape == (48, 32)
    assert len(list(twin.parameters())) == len(list(module.parameters())) == 26


def test_replicate_style_leaves_the_module_alone():
    assert parallel_style("replicate", "layers.0.scale") is None


def test_an_unsupported_style_is_refused_naming_it_and_the_module():
    with pytest.raises(TensorParallelPlanError) as error:
        parallel_style("packed_colwise", "model.layers.0.mlp.gate_up_proj")
    assert str(error.value) == (
        "tensor-parallel style 'packed_colwise' of 'model.layers.0.mlp.gate_up_proj' is not supported (supported: "
        "colwise, rowwise, colwise_rep, colwise_gather_output, rowwise_rep, rowwise_split_input, embedding_rowwise, "
        "embedding_colwise, replicate); pass tp_plan= with one of those for this module"
    )


def test_layout_step_refuses_a_plan_key_that_names_no_module():
    model = deferred_init(LLAMA.cls, LLAMA.config())
    message = r"^tensor-parallel plan key 'model\.layer\.\*\.mlp' \('colwise'\) names no module of LlamaForCausalLM$"
    with pytest.raises(TensorParallelPlanError, match=message):
        layout_step(model, input_ids=IDS, layout=Layout(tp=2), tp_plan={"model.layer.*.mlp": "colwise"})


def test_layout_step_refuses_a_plan_key_that_names_a_parameter():
    mixtral = HF_BY_NAME["mixtral"]
    message = (
        r"^tensor-parallel plan key 'model\.layers\.\*\.mlp\.experts\.gate_up_proj' \('packed_colwise'\) names a "
        r"parameter of MixtralForCausalLM, not a module: parameter styles \(packed or expert weights\) are not "
        r"supported; pass tp_plan= without it$"
    )
    with pytest.raises(TensorParallelPlanError, match=message):
        layout_step(deferred_init(mixtral.cls, mixtral.config()), input_ids=IDS, layout=Layout(tp=2))


def test_layout_step_refuses_tp_on_a_model_without_a_plan():
    with pytest.raises(LayoutError, match=r"^Sequential has no tensor-parallel plan for TP 2: pass tp_plan=$"):
        layout_step(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), torch.Size([2, 4]), layout=Layout(tp=2))


def test_layout_step_refuses_pipeline_stages():
    with pytest.raises(LayoutError, match=r"pp == 1\), got pp=2"):
        layout_step(nn.Linear(4, 4), torch.Size([2, 4]), layout=Layout(pp=2, accumulation_steps=2))


# -- collectives -----------------------------------------------------------------------------------


def test_fsdp_all_gather_of_a_linear_over_two_fake_ranks_counts_its_padded_parameters():
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    twin = fake_twin(nn.Linear(5, 3), mode)  # weight 3 × 5, bias 3: 3 rows padded to 4 for 2 ranks
    with fake_process_group(2) as mesh:
        fully_shard(twin, mesh=mesh)
        with mode, CollectiveCounter() as counter:
            twin(mode.from_tensor(torch.ones(1, 5))).sum().backward()
    padded = (4 * 5 + 4) * 4  # float32
    assert counter.communication.calls == {
        "all_gather": 1, "reduce_scatter": 1, "all_reduce": 0, "all_to_all": 0, "broadcast": 0,
    }  # fmt: skip
    assert counter.communication.bytes == {
        "all_gather": padded, "reduce_scatter": padded, "all_reduce": 0, "all_to_all": 0, "broadcast": 0,
    }  # fmt: skip


# -- the step ---------------------------------------------------------------------------------------


def test_layout_step_without_tp_measures_what_train_step_measures():
    model = deferred_init(LLAMA.cls, LLAMA.config())
    ids = LLAMA.inputs()["input_ids"]
    for layout, world_size in ((Layout(), 1), (Layout(dp_shard=2), 2)):
        step = layout_step(model, input_ids=ids, labels=ids, layout=layout)
        expected = train_step(model, input_ids=ids, labels=ids, world_size=world_size)
        assert (step.peak_bytes, step.peak, step.phase_peaks) == (
            expected.peak_bytes, expected.peak, expected.phase_peaks
        )  # fmt: skip
        assert step.end_of_forward == expected.end_of_forward
        assert step.modules.equals(expected.modules)


def test_selective_checkpointing_wraps_every_other_block_from_the_second():
    config = LLAMA.config()
    config.num_hidden_layers = 4
    selective = Layout(activation_checkpointing="selective")
    step = layout_step(deferred_init(LLAMA.cls, config), input_ids=IDS, layout=selective)
    assert step.blocks == ["model.layers.0", "model.layers.1", "model.layers.2", "model.layers.3"]
    assert step.checkpointed == ["model.layers.1", "model.layers.3"]


def test_accumulated_micro_batches_are_measured_as_train_step_measures_them():
    model = deferred_init(LLAMA.cls, LLAMA.config())
    ids = LLAMA.inputs()["input_ids"]
    accumulated = Layout(dp_shard=2, accumulation_steps=2)
    step = layout_step(model, input_ids=ids, labels=ids, layout=accumulated, keep_outputs=False)
    expected = train_step(model, input_ids=ids, labels=ids, world_size=2, accumulation_steps=2, keep_outputs=False)
    assert (step.peak_bytes, step.peak, step.phase_peaks) == (expected.peak_bytes, expected.peak, expected.phase_peaks)
    assert (step.accumulation_steps, step.keep_outputs, step.world_size) == (2, False, 2)
    # FSDP2 gathers and reduce-scatters for each micro-batch (no gradient-sync skipping)
    assert step.communication.calls == {
        "all_gather": 10, "reduce_scatter": 6, "all_reduce": 0, "all_to_all": 0, "broadcast": 0,
    }  # fmt: skip
