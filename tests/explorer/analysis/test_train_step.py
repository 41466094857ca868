"""train_step: one training step on fake tensors costs, category by category, what PyTorch's
`MemTracker` measures on the same step of the eager model, and changes nothing about the module.

The reference is PyTorch's own tracker, unmodified, around an eager step written out here as users
write it (`eager_loop`): the eager model built from the same seed, AdamW, the same loss,
`out = model(...)`, backward, `step()`, `zero_grad(set_to_none=True)`, the outputs kept or dropped.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import transformers
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker

from explorer import deferred_init, is_deferred, materialize_module
from explorer.analysis.dry_run import tensor_leaves
from explorer.analysis.fake_fsdp import checkpoint_blocks, fake_process_group, repeated_blocks, shard_blocks
from explorer.analysis.train_modules import OUTSIDE_MODULES
from explorer.analysis.train_step import CATEGORY_OF, TrainStepError, default_loss, train_step
from explorer.analysis.train_twin import fake_twin
from explorer.naming import format_bytes
from explorer.record.fake import handle_of
from tests.support.hf_configs import HF_BY_NAME, build_eager

LLAMA = HF_BY_NAME["llama"]


class Block(nn.Module):
    """A residual conv block with BatchNorm (running-stat buffers)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def llama_inputs() -> dict[str, torch.Tensor]:
    ids = LLAMA.inputs()["input_ids"]
    return {"input_ids": ids, "labels": ids}


def eager_loop(
    model: nn.Module,
    inputs: dict,
    optimizer: torch.optim.Optimizer,
    tracker: MemTracker,
    keep_outputs: bool = True,
    accumulation_steps: int = 1,
) -> None:
    """The training loop as users write it, under `tracker`."""
    with tracker:
        for micro_batch in range(accumulation_steps):
            if micro_batch:
                tracker.reset_mod_stats()  # MemTracker refuses a second forward of the root otherwise
            out = model(**inputs)
            loss = default_loss(out) / accumulation_steps if accumulation_steps > 1 else default_loss(out)
            loss.backward()
            if not keep_outputs:
                del out, loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def memtracker_step(
    model: nn.Module, inputs: dict, checkpointing: bool = False, keep_outputs: bool = True, accumulation_steps: int = 1
) -> tuple[int, dict[str, int], MemTracker]:
    """PyTorch's MemTracker around one eager AdamW step: (peak total, peak bytes by category, tracker)."""
    model.train()
    if checkpointing:
        checkpoint_blocks(model, repeated_blocks(model))
    optimizer = torch.optim.AdamW(model.parameters())
    tracker = MemTracker()
    tracker.track_external(model, optimizer, *tensor_leaves(inputs))
    eager_loop(model, inputs, optimizer, tracker, keep_outputs, accumulation_steps)
    (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    by_category = {CATEGORY_OF[key.value]: value for key, value in snapshot.items() if key != "Total"}
    return snapshot["Total"], by_category, tracker


def nonzero(peak: dict[str, int]) -> dict[str, int]:
    return {category: value for category, value in peak.items() if value}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("keep_outputs", [True, False], ids=["kept", "dropped"])
@pytest.mark.parametrize("accumulation_steps", [1, 3], ids=["one", "accumulated"])
def test_llama_step_equals_memtracker_on_eager_by_category(checkpointing, keep_outputs, accumulation_steps):
    torch.manual_seed(0)
    deferred = deferred_init(LLAMA.cls, LLAMA.config())
    loop = {"keep_outputs": keep_outputs, "accumulation_steps": accumulation_steps}
    step = train_step(deferred, **llama_inputs(), activation_checkpointing=checkpointing, **loop)
    total, expected, _ = memtracker_step(build_eager(LLAMA), llama_inputs(), checkpointing, **loop)
    assert step.peak_bytes == total
    assert step.peak == expected  # every category, zeros included
    assert sum(step.peak.values()) == total
    assert (step.keep_outputs, step.accumulation_steps) == (keep_outputs, accumulation_steps)


# The issue's small Llama: 256 hidden, 4 layers, 8 heads (8 KV heads), MLP 688, vocabulary 1000.
ISSUE_LLAMA = dict(hidden_size=256, num_hidden_layers=4, intermediate_size=688, num_attention_heads=8, vocab_size=1000)


@pytest.mark.parametrize(
    ("keep_outputs", "expected_total"), [(True, 62_498_080), (False, 60_937_500)], ids=["kept", "dropped"]
)
def test_small_llama_loop_equals_memtracker_on_the_eager_loop_to_the_byte(keep_outputs, expected_total):
    config = transformers.LlamaConfig(**ISSUE_LLAMA)
    ids = torch.zeros(2, 64, dtype=torch.long)
    inputs = {"input_ids": ids, "labels": ids}
    torch.manual_seed(0)
    step = train_step(deferred_init(transformers.LlamaForCausalLM, config), **inputs, keep_outputs=keep_outputs)
    torch.manual_seed(0)
    total, expected, _ = memtracker_step(transformers.LlamaForCausalLM(config), inputs, keep_outputs=keep_outputs)
    assert step.peak_bytes == total == expected_total
    assert step.peak == expected
    assert step.phase == "optimizer"
    # kept through the optimizer step: the logits, the KV cache the output returns, the loss
    logits, kv_cache, loss = 2 * 64 * 1000 * 4, 4 * 2 * (2 * 8 * 64 * 32 * 4), 4
    assert step.peak["activations"] == (logits + kv_cache + loss if keep_outputs else 0)


@pytest.mark.parametrize("keep_outputs", [True, False], ids=["kept", "dropped"])
def test_sharded_accumulated_step_equals_fsdp_memtracker_on_fake_ranks(keep_outputs):
    torch.manual_seed(0)
    deferred = deferred_init(LLAMA.cls, LLAMA.config())
    loop = {"keep_outputs": keep_outputs, "accumulation_steps": 2}
    step = train_step(deferred, **llama_inputs(), world_size=2, **loop)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    twin = fake_twin(deferred, mode).train()
    ids = mode.from_tensor(llama_inputs()["input_ids"])
    inputs = {"input_ids": ids, "labels": ids}
    with fake_process_group(2) as mesh, mode:
        shard_blocks(twin, mesh)
        optimizer = torch.optim.AdamW(twin.parameters())
        tracker = FSDPMemTracker(twin, optimizer)
        tracker.track_inputs(((), inputs))
        eager_loop(twin, inputs, optimizer, tracker, **loop)
    (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    assert step.peak_bytes == snapshot["Total"]
    assert nonzero(step.peak) == {CATEGORY_OF[k.value]: v for k, v in snapshot.items() if k != "Total" and v}


def test_kept_outputs_raise_the_peak_by_the_output_and_the_loss_alone():
    model = deferred_init(nn.Sequential, nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    kept, dropped = (train_step(model, (3, 4), keep_outputs=keep) for keep in (True, False))
    assert kept.phase == dropped.phase == "optimizer"
    assert kept.peak_bytes - dropped.peak_bytes == kept.peak["activations"] == 3 * 2 * 4 + 4
    assert dropped.peak["activations"] == 0


def test_bad_loop_options_are_refused():
    model = deferred_init(nn.Linear, 4, 4)
    with pytest.raises(
        ValueError, match=r"^accumulation_steps must be a positive int \(micro-batches per optimizer step\), got 0$"
    ):
        train_step(model, (2, 4), accumulation_steps=0)
    with pytest.raises(ValueError, match=r"got True$"):
        train_step(model, (2, 4), accumulation_steps=True)
    with pytest.raises(TypeError, match=r"^keep_outputs must be True or False, got 'no'$"):
        train_step(model, (2, 4), keep_outputs="no")


def test_summary_names_the_loop_when_it_is_not_the_default():
    model = deferred_init(nn.Linear, 4, 4)
    step = train_step(model, (2, 4), accumulation_steps=4, keep_outputs=False)
    assert repr(step).startswith("Linear training step (AdamW, 4 micro-batches, outputs dropped after backward): peak ")
    assert repr(train_step(model, (2, 4))).startswith("Linear training step (AdamW): peak ")


def memtracker_end_of_forward(model: nn.Module, inputs: dict, checkpointing: bool = False) -> dict[str, int]:
    """PyTorch's MemTracker around one eager AdamW step, read when the loss is computed, the output
    still referenced, just before backward: bytes by category, and "Total"."""
    model.train()
    if checkpointing:
        checkpoint_blocks(model, repeated_blocks(model))
    optimizer = torch.optim.AdamW(model.parameters())
    tracker = MemTracker()
    tracker.track_external(model, optimizer, *tensor_leaves(inputs))
    with tracker:
        out = model(**inputs)
        loss = default_loss(out)
        (snapshot,) = tracker.get_tracker_snapshot("current").values()
        loss.backward()
        optimizer.step()
    return {"Total" if key == "Total" else CATEGORY_OF[key.value]: value for key, value in snapshot.items()}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_llama_end_of_forward_equals_memtracker_on_eager_when_backward_starts(checkpointing):
    torch.manual_seed(0)
    deferred = deferred_init(LLAMA.cls, LLAMA.config())
    step = train_step(deferred, **llama_inputs(), activation_checkpointing=checkpointing)
    expected = memtracker_end_of_forward(build_eager(LLAMA), llama_inputs(), checkpointing)
    assert step.end_of_forward_bytes == expected.pop("Total")
    assert step.end_of_forward == expected  # every category, zeros included
    assert step.end_of_forward["activations"] > 0 and step.end_of_forward["gradients"] == 0
    assert step.end_of_forward_bytes == sum(step.end_of_forward.values()) < step.peak_bytes


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_llama_activations_at_end_of_forward_by_module_add_up_to_the_category(checkpointing):
    torch.manual_seed(0)
    deferred = deferred_init(LLAMA.cls, LLAMA.config())
    step = train_step(deferred, **llama_inputs(), activation_checkpointing=checkpointing)
    rows = step.end_of_forward_activations.set_index("name")
    assert list(step.end_of_forward_activations.columns) == ["name", "class", "activation_bytes"]
    assert rows["activation_bytes"].sum() == step.end_of_forward["activations"]
    assert (rows["activation_bytes"] > 0).all()
    # the embedding's output (2 × 8 tokens × 32 float32), kept by layer 0's first norm for backward
    assert rows.loc["model.embed_tokens", "activation_bytes"] == 2 * 8 * 32 * 4
    assert rows.loc["model.embed_tokens", "class"] == "Embedding"
    # the two decoder layers keep the same activations, module by module
    layer, other = (
        {name.removeprefix(prefix): v for name, v in rows["activation_bytes"].items() if name.startswith(prefix)}
        for prefix in ("model.layers.0", "model.layers.1")
    )
    assert layer == other
    if checkpointing:  # a checkpointed layer keeps its output (the next layer's input) and one attention tensor
        assert layer == {"": 2 * 8 * 32 * 4, ".self_attn": 2 * 8 * 32 * 4}
    else:
        assert layer[".mlp.gate_proj"] == 2 * 8 * 64 * 4


def test_sharding_leaves_the_activations_at_end_of_forward_as_they_were_module_by_module():
    torch.manual_seed(0)
    deferred = deferred_init(LLAMA.cls, LLAMA.config())
    single = train_step(deferred, **llama_inputs())
    sharded = train_step(deferred, **llama_inputs(), world_size=2)
    assert sharded.end_of_forward["activations"] == single.end_of_forward["activations"] > 0
    assert sharded.end_of_forward_activations.equals(single.end_of_forward_activations)
    assert sharded.end_of_forward["sharded_parameters"] == single.end_of_forward["parameters"] // 2


def test_cnn_activations_at_end_of_forward_name_the_loss_outside_modules():
    step = train_step(deferred_init(nn.Sequential, nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), (3, 4))
    table = step.end_of_forward_activations
    # the ReLU's output (kept by ReLU and the last Linear for backward), the output (still referenced,
    # as `out = model(x)` keeps it) and the float32 loss of `default_loss`
    assert table.to_dict("records") == [
        {"name": "1", "class": "ReLU", "activation_bytes": 3 * 8 * 4},
        {"name": "2", "class": "Linear", "activation_bytes": 3 * 2 * 4},
        {"name": OUTSIDE_MODULES, "class": "", "activation_bytes": 4},
    ]
    assert step.end_of_forward == {
        "parameters": (4 * 8 + 8 + 8 * 2 + 2) * 4,
        "buffers": 0,
        "gradients": 0,
        "optimizer_state": 0,
        "activations": 3 * 8 * 4 + 3 * 2 * 4 + 4,
        "temporaries": 0,
        "inputs": 3 * 4 * 4,
    }


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_cnn_step_equals_memtracker_on_eager_by_category(checkpointing):
    deferred = deferred_init(SmallCNN)
    step = train_step(deferred, (2, 3, 16, 16), activation_checkpointing=checkpointing)
    torch.manual_seed(0)
    eager = SmallCNN()
    model_input = torch.zeros(2, 3, 16, 16)
    eager.train()
    if checkpointing:
        checkpoint_blocks(eager, repeated_blocks(eager))
    optimizer = torch.optim.AdamW(eager.parameters())
    tracker = MemTracker()
    tracker.track_external(eager, optimizer, model_input)
    eager_loop(eager, {"x": model_input}, optimizer, tracker)
    (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    assert step.peak_bytes == snapshot["Total"]
    assert step.peak == {CATEGORY_OF[k.value]: v for k, v in snapshot.items() if k != "Total"}
    assert step.peak["buffers"] == 4 * (8 * 4 + 8 * 4 + 8)  # 4 BatchNorms: mean, var (float32), count (int64)


def test_fused_moe_step_equals_memtracker_on_eager_by_category():
    # transformers 5 runs fused experts through aten._grouped_mm, whose fake kernel refuses float32
    mixtral = HF_BY_NAME["mixtral"]
    ids = mixtral.inputs()["input_ids"]
    torch.manual_seed(0)
    step = train_step(deferred_init(mixtral.cls, mixtral.config()), input_ids=ids, labels=ids)
    total, expected, _ = memtracker_step(build_eager(mixtral), {"input_ids": ids, "labels": ids})
    assert step.peak_bytes == total
    assert step.peak == expected


def test_a_failing_step_names_the_module_that_was_running():
    class Shift(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x  # branches on a value: fakes have none

    model = deferred_init(nn.Sequential, nn.Linear(4, 4), Shift())
    with pytest.raises(TrainStepError) as error:
        train_step(model, (2, 4))
    assert str(error.value) == (
        "the forward of Sequential cannot run on fake tensors, in 1 (Shift): "
        "DataDependentOutputException: aten._local_scalar_dense.default"
    )


class _ChecksItsInput(nn.Module):
    """Raises from its own Python code, as BatchNorm does for a batch of one in training."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < 2:
            raise ValueError(f"expected a batch of at least 2, got {x.shape[0]}")
        return x


class _Guarded(nn.Module):
    """Calls a submodule that raises and catches it, then runs on: the caught error is no failure."""

    def __init__(self) -> None:
        super().__init__()
        self.check = _ChecksItsInput()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            self.check(x)
        except ValueError:
            pass
        return x


def test_a_step_failing_in_a_modules_python_code_names_that_module():
    model = deferred_init(nn.Sequential, nn.Linear(4, 4), _Guarded(), nn.Linear(4, 4), _ChecksItsInput())
    with pytest.raises(TrainStepError) as error:
        train_step(model, (1, 4))
    assert str(error.value) == (
        "the forward of Sequential cannot run on fake tensors, in 3 (_ChecksItsInput): "
        "ValueError: expected a batch of at least 2, got 1"
    )


class _GrowingCacheBlock(nn.Module):
    """Attends over every input it has seen, as a decoder layer with a KV cache does (transformers 4
    keeps `use_cache=True` in training): a recompute sees one more key than the forward did."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.keys: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.keys.append(x)
        scores = x @ torch.cat(self.keys).t()  # saves the keys for backward
        return self.proj(x) * scores.sum(-1, keepdim=True)


def test_a_checkpointed_block_whose_recompute_differs_is_named_with_the_cache_advice():
    model = deferred_init(nn.Sequential, _GrowingCacheBlock(), _GrowingCacheBlock())
    with pytest.raises(TrainStepError) as error:
        train_step(model, (2, 4), activation_checkpointing=True)
    assert str(error.value).startswith(
        "the backward of Sequential recomputed a checkpointed block with other shapes than its forward, in 1"
    )
    assert "pass use_cache=False, as training with activation checkpointing needs): CheckpointError: " in str(error.value)
    eager = nn.Sequential(_GrowingCacheBlock(), _GrowingCacheBlock())
    for i, block in enumerate(eager):
        eager[i] = torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper(block)
    with pytest.raises(torch.utils.checkpoint.CheckpointError):  # eager training fails the same way
        eager(torch.ones(2, 4)).sum().backward()


@pytest.mark.parametrize("accumulation_steps", [1, 2], ids=["one", "accumulated"])
def test_llama_module_table_equals_memtracker_module_peaks(accumulation_steps):
    torch.manual_seed(0)
    deferred = deferred_init(LLAMA.cls, LLAMA.config())
    step = train_step(deferred, **llama_inputs(), accumulation_steps=accumulation_steps)
    eager = build_eager(LLAMA)
    _, _, tracker = memtracker_step(eager, llama_inputs(), accumulation_steps=accumulation_steps)
    rows = step.modules.set_index("name")
    ran = [(path, module) for path, module in eager.named_modules() if module in tracker.memory_tracking]
    assert list(rows.index) == [path for path, _ in ran]  # model.layers (a ModuleList) is never called
    for path, module in ran:
        stats = tracker.memory_tracking[module]
        snapshots = {state.value: snaps for state, snaps in stats.snapshots.items()}
        for column, state in (("forward_peak_bytes", "Peak-Forward"), ("backward_peak_bytes", "Peak-Backward")):
            expected = max((s[torch.device("cpu")]["Total"] for s in snapshots.get(state, [])), default=0)
            assert rows.loc[path, column] == expected, (path, column)
        assert rows.loc[path, "class"] == type(module).__name__
    # the 2-layer model's decoder layers each hold the same activations for backward
    assert rows.loc["model.layers.0", "activation_bytes"] == rows.loc["model.layers.1", "activation_bytes"] > 0


def test_llama_peak_is_in_the_optimizer_with_two_adam_moments():
    torch.manual_seed(0)
    step = train_step(deferred_init(LLAMA.cls, LLAMA.config()), **llama_inputs())
    parameter_bytes = sum(p.numel() * 4 for p in build_eager(LLAMA).parameters())
    assert step.phase == "optimizer"
    assert step.peak["parameters"] == step.peak["gradients"] == parameter_bytes
    assert step.peak["optimizer_state"] >= 2 * parameter_bytes
    assert step.optimizer == "AdamW"
    assert list(step.phase_peaks) == ["forward", "backward", "optimizer"]


def test_train_step_leaves_graph_values_and_rng_unchanged():
    torch.manual_seed(0)
    deferred = deferred_init(LLAMA.cls, LLAMA.config())
    graph = handle_of(deferred.lm_head.weight).graph
    before = (len(graph.ops), len(graph.tensors), len(graph.externals))
    rng = torch.get_rng_state()
    train_step(deferred, **llama_inputs())
    assert torch.equal(torch.get_rng_state(), rng)
    assert (len(graph.ops), len(graph.tensors), len(graph.externals)) == before
    assert all(p.grad is None for p in deferred.parameters())
    assert is_deferred(deferred)
    materialize_module(deferred)
    eager = build_eager(LLAMA)
    for (name, got), expected in zip(deferred.state_dict().items(), eager.state_dict().values()):
        assert torch.equal(got, expected), name


def test_a_sharded_step_leaves_graph_values_and_rng_unchanged():
    torch.manual_seed(0)
    deferred = deferred_init(LLAMA.cls, LLAMA.config())
    graph = handle_of(deferred.lm_head.weight).graph
    before = (len(graph.ops), len(graph.tensors), len(graph.externals))
    rng = torch.get_rng_state()
    train_step(deferred, **llama_inputs(), world_size=2, activation_checkpointing=True)
    assert torch.equal(torch.get_rng_state(), rng)
    assert (len(graph.ops), len(graph.tensors), len(graph.externals)) == before
    assert is_deferred(deferred)
    materialize_module(deferred)
    eager = build_eager(LLAMA)
    for (name, got), expected in zip(deferred.state_dict().items(), eager.state_dict().values()):
        assert torch.equal(got, expected), name


def test_train_step_leaves_an_eager_module_unchanged():
    eager = build_eager(LLAMA)
    weights = {name: p.detach().clone() for name, p in eager.named_parameters()}
    eager.eval()
    train_step(eager, **llama_inputs())
    assert not eager.training
    assert all(p.grad is None for p in eager.parameters())
    for name, p in eager.named_parameters():
        assert torch.equal(p, weights[name]), name


def test_sgd_without_momentum_keeps_no_optimizer_state():
    deferred = deferred_init(SmallCNN)
    step = train_step(deferred, (2, 3, 16, 16), optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    assert step.optimizer == "SGD"
    assert step.peak["optimizer_state"] == 0


def test_custom_loss_is_used():
    deferred = deferred_init(SmallCNN)
    seen = []

    def loss(output):
        seen.append(tuple(output.shape))
        return output.square().mean()

    train_step(deferred, (2, 3, 16, 16), loss=loss)
    assert seen == [(2, 10)]


def test_default_loss_prefers_the_models_own_loss():
    output = {"loss": torch.tensor(1.5, requires_grad=True), "logits": torch.ones(2, requires_grad=True)}
    assert default_loss(output) is output["loss"]
    logits = torch.ones(2, 3, requires_grad=True)
    assert default_loss({"logits": logits}).item() == 6.0


def test_output_without_gradient_is_refused():
    class Frozen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4).requires_grad_(False)

        def forward(self, x):
            return self.linear(x)

    with pytest.raises(TrainStepError) as error:
        train_step(deferred_init(Frozen), (2, 4))
    assert str(error.value) == "the forward returned no tensor that requires grad (got FakeTensor): pass loss=..."


def test_activation_checkpointing_without_repeated_blocks_is_refused():
    with pytest.raises(TrainStepError) as error:
        train_step(deferred_init(nn.Linear, 4, 4), (2, 4), activation_checkpointing=True)
    assert str(error.value) == (
        "activation_checkpointing=True found no repeated blocks in Linear (entries of an nn.ModuleList/"
        "nn.Sequential with submodules sharing a class): nothing to checkpoint"
    )


def test_bad_world_size_and_shard_without_world_are_refused():
    model = deferred_init(nn.Linear, 4, 4)
    with pytest.raises(ValueError, match=r"^world_size must be a positive int, got 0$"):
        train_step(model, (2, 4), world_size=0)
    with pytest.raises(ValueError, match=r"^shard= applies fully_shard under world_size > 1"):
        train_step(model, (2, 4), shard=lambda m: None)
    with pytest.raises(TypeError, match=r"^explorer.train_step expects an nn.Module, got int$"):
        train_step(3, (2, 4))


def test_fits_reads_budgets_in_bytes_and_units():
    step = train_step(deferred_init(nn.Linear, 4, 4), (2, 4))
    assert step.fits(step.peak_bytes) and not step.fits(step.peak_bytes - 1)
    assert step.fits("1KiB") == (step.peak_bytes <= 1024)
    assert step.fits("80GB")
    assert step.verdict("80GB").startswith("fits on 1 × 80GB (peak ")
    assert step.verdict(10).startswith("does not fit on 1 × 10 B (peak ")
    with pytest.raises(ValueError) as error:
        step.fits("eighty gigs")
    assert str(error.value) == (
        "cannot read the budget 'eighty gigs': write bytes or a number and a unit, e.g. '80GB', '80GiB', '512MiB'"
    )


def test_summary_and_html_show_peak_and_categories():
    step = train_step(deferred_init(SmallCNN), (2, 3, 16, 16))
    text = repr(step)
    assert text.splitlines()[0].startswith("SmallCNN training step (AdamW): peak ")
    assert f"({step.peak_bytes:,} bytes) on one device, in the backward" in text
    html = step._repr_html_()
    assert html.count('class="train-bar-segment"') == len(nonzero(step.peak)) + len(nonzero(step.end_of_forward))
    assert "blocks.0.conv1" in html
    forward_lines = text.splitlines()[len(nonzero(step.peak)) + 1 :]
    assert forward_lines[0] == (
        f"end of forward (backward starts): {format_bytes(step.end_of_forward_bytes)}, "
        f"activations {format_bytes(step.end_of_forward['activations'])}"
    )
    categories = nonzero(step.end_of_forward).items()
    assert forward_lines[1:] == [f"  {k.replace('_', ' ')}: {format_bytes(v)}" for k, v in categories]
    assert html.count('train-forward-activations"') == 1


def test_world_size_leaves_no_process_group_behind_even_on_failure():
    model = deferred_init(SmallCNN)

    def failing_loss(output):
        raise RuntimeError("boom")

    with pytest.raises(TrainStepError, match=r"the forward of SmallCNN .*RuntimeError: boom"):
        train_step(model, (2, 3, 16, 16), world_size=4, loss=failing_loss)
    assert not dist.is_initialized()
    step = train_step(model, (2, 3, 16, 16), world_size=4)
    assert not dist.is_initialized()
    assert step.world_size == 4
    assert list(step.modules["name"]) == ["", "blocks.0", "blocks.1"]


def test_a_shard_function_chooses_what_fully_shard_wraps():
    from torch.distributed.fsdp import fully_shard

    model = deferred_init(SmallCNN)
    step = train_step(model, (2, 3, 16, 16), world_size=2, shard=lambda twin: fully_shard(twin))
    assert list(step.modules["name"]) == [""]  # the root alone: one all-gather of everything
    assert step.peak["sharded_parameters"] > 0
    with pytest.raises(TrainStepError) as error:
        train_step(model, (2, 3, 16, 16), world_size=2, shard=lambda twin: fully_shard(twin.blocks[0]))
    assert str(error.value) == "shard(...) left the root SmallCNN unsharded: call fully_shard(module) on it last"
    assert not dist.is_initialized()


def test_a_step_on_a_device_this_process_cannot_reach_is_refused_before_anything_runs(monkeypatch):
    """On a CPU-only torch, autograd's CUDA device guard aborts the process (a notebook's kernel dies)
    at the first op that records a gradient, even on fakes: the step refuses first, naming the device."""
    from explorer.analysis.layout_step import layout_step
    from explorer.analysis.parallel_layout import Layout

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = deferred_init(lambda: nn.Sequential(nn.Linear(16, 16, device="cuda"), nn.ReLU(), nn.Linear(16, 8, device="cuda")))
    refusal = r"^Sequential's parameters are on cuda, which this process cannot reach: autograd guards that device"
    with pytest.raises(TrainStepError, match=refusal):
        train_step(model, (4, 16))
    with pytest.raises(TrainStepError, match=refusal):
        layout_step(model, (4, 16), layout=Layout())
    assert is_deferred(model) and model[0].weight.device == torch.device("cuda", 0)


def test_a_module_with_nothing_to_train_is_refused_naming_it():
    # before: the optimizer's own "optimizer got an empty parameter list"
    with pytest.raises(TrainStepError) as error:
        train_step(deferred_init(nn.ReLU), torch.randn(2, 4))
    assert str(error.value) == ("ReLU has no parameters: a training step would update nothing (the optimizer "
                                "refuses an empty parameter list); for its forward alone use dry_run")


def _sliding_window_qwen2() -> nn.Module:
    config = transformers.Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=300, use_sliding_window=True, sliding_window=8, max_window_layers=1,
    )  # fmt: skip
    return transformers.Qwen2ForCausalLM(config)


def test_a_kv_cache_grown_by_a_recomputed_block_is_named_with_its_fix_and_a_plan_lists_it_refused():
    from explorer.analysis.parallel_plan import plan_parallel

    ids = torch.randint(0, 300, (2, 16))
    model = deferred_init(_sliding_window_qwen2)
    with pytest.raises(TrainStepError) as caught:
        train_step(model, input_ids=ids, labels=ids, activation_checkpointing=True)
    assert "the backward of Qwen2ForCausalLM cannot run on fake tensors" in str(caught.value)
    assert "(the model keeps a KV cache, use_cache=True: if a checkpointed block recomputed" in str(caught.value)
    assert train_step(model, input_ids=ids, labels=ids, activation_checkpointing=True, use_cache=False).peak_bytes
    plan = plan_parallel(
        model, ids, labels=ids, gpus=1, gpu_memory="1GB", fsdp=(1,), tp=(1,), pp=(1,),
        activation_checkpointing=("none", "block"),
    )  # fmt: skip
    outcomes = {result.layout.activation_checkpointing: result for result in plan.results}
    assert outcomes["none"].ranks and not outcomes["block"].ranks
    assert "pass use_cache=False" in outcomes["block"].problems[0]


class _SparseEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(1000, 16, sparse=True)
        self.head = nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids))


def test_a_model_with_sparse_gradients_is_refused_naming_the_module_before_anything_runs():
    model = deferred_init(_SparseEmbedding)
    with pytest.raises(
        TrainStepError,
        match=r"^_SparseEmbedding\.embedding \(Embedding\) makes sparse gradients \(sparse=True\), which PyTorch's "
        r"memory tracker cannot count",
    ):
        train_step(model, torch.randint(0, 1000, (4, 8)), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    assert is_deferred(model.embedding.weight)
