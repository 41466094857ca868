"""init_report: each initializer family named with its analytic moments, and every flag on a known case."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn

import explorer
from explorer import deferred_init, init_report, materialize_module
from explorer.analysis.init_flags import write_seconds_per_byte
from tests.support.hf_configs import HF_BY_NAME


class Holder(nn.Module):
    """One parameter of `shape`, made by `torch.empty` and initialized by `init`."""

    def __init__(self, init, shape=(6, 4)):
        super().__init__()
        self.w = nn.Parameter(torch.empty(*shape))
        init(self.w)


def row(report, name):
    return report.set_index("name").loc[name]


def _p(count, total):
    return count / total


NN_INIT_CASES = [
    # (id, initializer, shape, init text, mean, std)
    ("normal_", lambda w: nn.init.normal_(w, mean=1.0, std=0.5), (6, 4), "normal(mean=1.0, std=0.5)", 1.0, 0.5),
    ("uniform_", lambda w: nn.init.uniform_(w, -0.125, 0.125), (6, 4), "uniform(-0.125, 0.125)", 0.0,
     0.25 / math.sqrt(12)),
    # the standard normal truncated to [-1, 1]: std 0.5395600937549 (numerical integration)
    ("trunc_normal_", lambda w: nn.init.trunc_normal_(w, 0.0, 1.0, -1.0, 1.0), (6, 4),
     "trunc_normal(mean=0.0, std=1.0, a=-1.0, b=1.0)", 0.0, 0.5395600937549),
    ("constant_", lambda w: nn.init.constant_(w, 0.3), (6, 4), "constant(0.3)", 0.3, 0.0),
    ("zeros_", nn.init.zeros_, (6, 4), "zeros", 0.0, 0.0),
    ("ones_", nn.init.ones_, (6, 4), "constant(1.0)", 1.0, 0.0),
    ("eye_", nn.init.eye_, (6, 4), "eye", _p(4, 24), math.sqrt(_p(4, 24) * _p(20, 24))),
    ("dirac_", nn.init.dirac_, (4, 2, 3), "zeros; 2 elements: constant(1.0)", _p(2, 24),
     math.sqrt(_p(2, 24) * _p(22, 24))),
    ("xavier_uniform_", nn.init.xavier_uniform_, (6, 4), "uniform(-0.774597, 0.774597)", 0.0,
     math.sqrt(6 / 10) / math.sqrt(3)),
    ("xavier_normal_", nn.init.xavier_normal_, (6, 4), "normal(mean=0.0, std=0.447214)", 0.0, math.sqrt(2 / 10)),
    # kaiming_uniform_(a=sqrt(5)) on fan_in 16 (nn.Linear's default): bound 1/4
    ("kaiming_uniform_", lambda w: nn.init.kaiming_uniform_(w, a=math.sqrt(5)), (8, 16), "uniform(-0.25, 0.25)",
     0.0, 0.25 / math.sqrt(3)),
    ("kaiming_normal_", lambda w: nn.init.kaiming_normal_(w, mode="fan_out"), (8, 16), "normal(mean=0.0, std=0.5)",
     0.0, 0.5),
    # orthonormal columns of a 6x4 matrix: squares sum to 4 over 24 elements, times gain 2
    ("orthogonal_", lambda w: nn.init.orthogonal_(w, gain=2.0), (6, 4), "orthogonal(gain=2.0)", 0.0,
     2 * math.sqrt(4 / 24)),
    # 3 of 6 rows zeroed in each of 4 columns: half the elements are zeros
    ("sparse_", lambda w: nn.init.sparse_(w, 0.5, std=0.1), (6, 4), "normal(mean=0.0, std=0.1); 12 elements: zeros",
     0.0, 0.1 * math.sqrt(0.5)),
]


@pytest.mark.parametrize("init, shape, text, mean, std", [case[1:] for case in NN_INIT_CASES],
                         ids=[case[0] for case in NN_INIT_CASES])
def test_each_nn_init_function_is_named_with_its_analytic_moments(init, shape, text, mean, std):
    report = init_report(deferred_init(Holder, init, shape))
    w = row(report, "w")
    assert w["init"] == text
    assert w["mean"] == pytest.approx(mean, abs=1e-12)
    assert w["std"] == pytest.approx(std, rel=1e-9)
    assert w["flags"] == (["constant matrix"] if std == 0 and mean != 0 else [])  # one nonzero value
    assert w["uninitialized"] == 0


@pytest.mark.parametrize("init, text", [
    (lambda w: nn.init.normal_(w, 0.5, 0.02), "normal(mean=0.5, std=0.02)"),
    (lambda w: nn.init.trunc_normal_(w, 1.0, 1.0, 0.0, 3.0), "trunc_normal(mean=1.0, std=1.0, a=0.0, b=3.0)"),
    (lambda w: nn.init.orthogonal_(w, gain=0.5), "orthogonal(gain=0.5)"),
    (lambda w: nn.init.sparse_(w, 0.25), "normal(mean=0.0, std=0.01); 16384 elements: zeros"),
    (lambda w: nn.init.kaiming_uniform_(w, a=math.sqrt(5)), "uniform(-0.125, 0.125)")  # fan_in 64,
])
def test_materialized_values_agree_with_the_analytic_moments(init, text):
    torch.manual_seed(0)
    module = deferred_init(Holder, init, (1024, 64))
    materialize_module(module)
    w = row(init_report(module), "w")
    assert w["init"] == text
    assert w["state"] == "materialized"
    values = module.w.detach().double()
    assert w["measured_mean"] == pytest.approx(float(values.mean()), rel=1e-9)
    assert w["measured_std"] == pytest.approx(float(values.std(unbiased=False)), rel=1e-9)
    assert abs(w["measured_std"] - w["std"]) < 0.01 * w["std"]
    assert "measured differs" not in w["flags"]


class Defaults(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 8)
        self.conv1 = nn.Conv1d(3, 4, 5)
        self.conv2 = nn.Conv2d(3, 4, 3)
        self.conv3 = nn.Conv3d(2, 4, 2)
        self.embedding = nn.Embedding(10, 4, padding_idx=2)
        self.layer_norm = nn.LayerNorm(4)
        self.batch_norm = nn.BatchNorm1d(4)
        self.group_norm = nn.GroupNorm(2, 4)
        self.rms_norm = nn.RMSNorm(4)
        self.attention = nn.MultiheadAttention(8, 2)


@pytest.fixture(scope="module")
def defaults_report():
    return init_report(deferred_init(Defaults))


@pytest.mark.parametrize("name, text, std, flags", [
    ("linear.weight", "uniform(-0.25, 0.25)", 0.25 / math.sqrt(3), []),
    ("linear.bias", "uniform(-0.25, 0.25)", 0.25 / math.sqrt(3), []),
    ("conv1.weight", "uniform(-0.258199, 0.258199)", 1 / math.sqrt(15) / math.sqrt(3), []),  # fan_in 3*5
    ("conv2.weight", "uniform(-0.19245, 0.19245)", 1 / math.sqrt(27) / math.sqrt(3), []),  # fan_in 3*3*3
    ("conv3.weight", "uniform(-0.25, 0.25)", 0.25 / math.sqrt(3), []),  # fan_in 2*2*2*2
    ("conv3.bias", "uniform(-0.25, 0.25)", 0.25 / math.sqrt(3), []),
    # N(0, 1) with the padding row (4 of 40 elements) zeroed
    ("embedding.weight", "normal(mean=0.0, std=1.0); 4 elements: zeros", math.sqrt(36 / 40), []),
    ("layer_norm.weight", "constant(1.0)", 0.0, []),
    ("layer_norm.bias", "zeros", 0.0, []),
    ("batch_norm.weight", "constant(1.0)", 0.0, []),
    ("batch_norm.bias", "zeros", 0.0, []),
    # torch.zeros / torch.ones, then reset_running_stats() writes them again
    ("batch_norm.running_mean", "zeros", 0.0, ["overwritten"]),
    ("batch_norm.running_var", "constant(1.0)", 0.0, ["overwritten"]),
    ("batch_norm.num_batches_tracked", "zeros", 0.0, ["overwritten"]),
    ("group_norm.weight", "constant(1.0)", 0.0, []),
    ("group_norm.bias", "zeros", 0.0, []),
    ("rms_norm.weight", "constant(1.0)", 0.0, []),
    ("attention.in_proj_weight", "uniform(-0.433013, 0.433013)", math.sqrt(6 / 32) / math.sqrt(3), []),
    ("attention.in_proj_bias", "zeros", 0.0, []),
    ("attention.out_proj.weight", "uniform(-0.353553, 0.353553)", 1 / math.sqrt(8) / math.sqrt(3), []),
    # NonDynamicallyQuantizableLinear draws its bias, then MultiheadAttention zeroes it
    ("attention.out_proj.bias", "zeros", 0.0, ["overwritten"]),
])
def test_default_inits_of_torch_modules(defaults_report, name, text, std, flags):
    entry = row(defaults_report, name)
    assert (entry["init"], entry["flags"]) == (text, flags)
    assert entry["std"] == pytest.approx(std, rel=1e-9, abs=1e-15)


def test_dead_write_counts_the_bytes_replay_spends_on_it(defaults_report):
    bias = row(defaults_report, "attention.out_proj.bias")
    assert (bias["writes"], bias["dead_writes"], bias["dead_bytes"]) == (2, 1, 8 * 4)
    assert row(defaults_report, "batch_norm.num_batches_tracked")["dead_bytes"] == 8  # one int64


def test_module_class_and_kind_columns(defaults_report):
    entry = row(defaults_report, "batch_norm.running_var")
    assert (entry["module"], entry["module_class"], entry["kind"], entry["shape"], entry["dtype"]) == (
        "batch_norm", "BatchNorm1d", "buffer", (4,), "float32")


class PartlyWritten(nn.Module):
    def __init__(self):
        super().__init__()
        self.rows = nn.Parameter(torch.empty(4, 4))
        self.rows.data[:2].zero_()  # 8 of 16 elements, through a view
        self.column = nn.Parameter(torch.empty(4, 4))
        self.column.data[:, 1:].fill_(2.0)  # every row but its first element: a strided view
        self.never = nn.Parameter(torch.empty(3))
        self.register_buffer("whole", torch.empty(2, 2))
        self.whole.view(-1).uniform_()  # written through a reshaped view: fully initialized


def test_partial_writes_through_views_leave_the_rest_uninitialized():
    report = init_report(deferred_init(PartlyWritten))
    rows, column, never, whole = (row(report, name) for name in ("rows", "column", "never", "whole"))
    assert (rows["init"], rows["uninitialized"], rows["flags"]) == ("zeros; 8 elements: uninitialized", 8,
                                                                   ["uninitialized"])
    assert (column["init"], column["uninitialized"]) == ("constant(2.0); 4 elements: uninitialized", 4)
    assert (never["init"], never["uninitialized"], never["writes"]) == ("uninitialized", 3, 0)
    assert pd.isna(never["source"])
    assert math.isnan(never["mean"]) and math.isnan(never["std"])
    assert (whole["init"], whole["uninitialized"], whole["flags"]) == ("uniform(0.0, 1.0)", 0, [])


class ReadBeforeOverwrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4))
        self.register_buffer("snapshot", self.w.detach() + 1)  # reads the zeros: they were used
        nn.init.normal_(self.w)
        self.v = nn.Parameter(torch.ones(4))
        nn.init.normal_(self.v)  # the ones were never read: dead


def test_a_write_read_before_it_is_overwritten_is_not_dead():
    report = init_report(deferred_init(ReadBeforeOverwrite))
    assert (row(report, "w")["dead_writes"], row(report, "w")["flags"]) == (0, [])
    assert (row(report, "v")["dead_writes"], row(report, "v")["flags"]) == (1, ["overwritten"])
    assert row(report, "snapshot")["init"] == "constant(1.0)"  # zeros + 1


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(8, 8))
        nn.init.normal_(self.w, std=0.02)
        self.w.data.mul_(0.5)  # GPT-2-like rescaling after the draw
        self.b = nn.Parameter(torch.randn(8) * 3)


def test_scaling_after_a_draw_keeps_the_family_and_scales_the_moments():
    report = init_report(deferred_init(Scaled))
    assert (row(report, "w")["init"], row(report, "w")["std"]) == ("normal(mean=0.0, std=0.02) * 0.5", 0.01)
    assert (row(report, "b")["init"], row(report, "b")["std"]) == ("normal(mean=0.0, std=1.0) * 3.0", 3.0)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        nn.init.normal_(self.layers[2].weight, std=0.5)
        self.head = nn.Linear(8, 8)
        nn.init.constant_(self.head.weight, 0.5)
        self.gate = nn.Linear(8, 8)
        nn.init.zeros_(self.gate.weight)  # deliberate, as LoRA's B


def test_outlier_is_the_layer_whose_init_differs_from_its_siblings():
    report = init_report(deferred_init(Stack))
    outliers = report.loc[report["flags"].map(lambda flags: "outlier" in flags), "name"].tolist()
    assert outliers == ["layers.2.weight"]
    assert row(report, "layers.2.weight")["role"] == "layers.*.weight"
    assert row(report, "layers.2.weight")["flags"] == ["overwritten", "outlier"]


def test_constant_matrix_flags_a_weight_whose_rows_cannot_differ():
    report = init_report(deferred_init(Stack))
    assert row(report, "head.weight")["flags"] == ["overwritten", "constant matrix"]
    assert "constant matrix" not in row(report, "head.bias")["flags"]  # 1-D
    assert row(report, "gate.weight")["flags"] == ["overwritten"]  # zeros: not flagged


def test_measured_values_that_disagree_are_flagged():
    torch.manual_seed(0)
    module = deferred_init(nn.Linear, 256, 256)
    materialize_module(module)
    assert row(init_report(module), "weight")["flags"] == []
    with torch.no_grad():
        module.weight.mul_(1.5)  # behind the recording's back
        module.bias[:3] = float("nan")
    report = init_report(module)
    assert row(report, "weight")["flags"] == ["measured differs"]
    bias = row(report, "bias")
    assert (bias["flags"], bias["nan_count"], bias["inf_count"]) == (["nan/inf", "measured differs"], 3, 0)


def test_an_eager_module_is_measured_and_not_explained():
    torch.manual_seed(0)
    report = init_report(nn.LayerNorm(4))
    weight = row(report, "weight")
    assert (weight["state"], weight["init"], weight["family"], weight["flags"]) == ("real", "not recorded", "unrecorded", [])
    assert (weight["measured_mean"], weight["measured_std"], weight["measured_min"], weight["measured_max"]) == (1, 0, 1, 1)


def test_init_report_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="^explorer.init_report expects an nn.Module, got Tensor$"):
        init_report(torch.zeros(2))


def test_hugging_face_llama_init_weights():
    arch = HF_BY_NAME["llama"]
    config = arch.config()
    report = init_report(deferred_init(arch.cls, config))
    std = config.initializer_range
    expected = f"normal(mean=0.0, std={std})"
    linear = report[report["module_class"] == "Linear"]
    assert len(linear) == 2 * 7 + 1 and set(linear["init"]) == {expected}
    assert set(linear["std"]) == {std}
    # the module's own reset_parameters drew first; Hugging Face's _init_weights overwrote it
    assert all(flags == ["overwritten"] for flags in linear["flags"])
    assert row(report, "model.embed_tokens.weight")["init"] == expected
    assert set(report.loc[report["module_class"] == "LlamaRMSNorm", "init"]) == {"constant(1.0)"}
    inv_freq = row(report, "model.rotary_emb.inv_freq")
    assert inv_freq["family"] == "computed" and inv_freq["kind"] == "non-persistent buffer"
    assert not report["flags"].map(lambda flags: "uninitialized" in flags or "outlier" in flags).any()


def test_hugging_face_bert_zeroes_the_padding_row():
    arch = HF_BY_NAME["bert"]
    config = arch.config()
    report = init_report(deferred_init(arch.cls, config))
    words = row(report, "bert.embeddings.word_embeddings.weight")
    assert words["init"] == f"normal(mean=0.0, std={config.initializer_range}); {config.hidden_size} elements: zeros"
    assert row(report, "bert.embeddings.position_ids")["init"] == "computed (arange)"


# -- the meta-init check -------------------------------------------------------------------------


class Rotary(nn.Module):
    """A RoPE-like module: a non-persistent buffer computed in __init__, and a reset that forgets it."""

    def __init__(self, dim=8):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)), persistent=False)

    def reset(self):
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)


def reset(module):
    module.reset()


def test_reinit_that_never_writes_a_computed_buffer_leaves_it_uninitialized():
    module = deferred_init(Rotary)
    graph = explorer.record.fake.handle_of(module.proj.weight).graph
    ops_before = len(graph.ops)
    report = init_report(module, reinit=reset)
    inv_freq = row(report, "inv_freq")
    assert inv_freq["flags"] == ["uninitialized after reinit"]
    assert inv_freq["reinit"] == "uninitialized"
    assert inv_freq["reinit_source"] == (f"never written by reset ({__file__}:"
                                         f"{reset.__code__.co_firstlineno})")
    weight = row(report, "proj.weight")
    assert (weight["init"], weight["reinit"]) == ("uniform(-0.353553, 0.353553)", "normal(mean=0.0, std=0.02)")
    assert weight["flags"] == ["reinit differs"]
    assert weight["reinit_source"].endswith(f"in reset")
    assert row(report, "proj.bias")["flags"] == ["reinit differs"]
    # the module and its recording are unchanged
    assert len(graph.ops) == ops_before
    assert explorer.is_fake(module.inv_freq) and module.inv_freq.shape == (4,)


def test_reinit_that_reproduces_construction_raises_no_flag():
    module = deferred_init(Rotary)
    report = init_report(module, reinit=lambda m: [m.proj.reset_parameters(),
                                                   m.inv_freq.copy_(1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)))])
    assert report["flags"].map(len).sum() == 0
    assert row(report, "inv_freq")["reinit"].startswith("computed (")


def test_reinit_with_another_std_differs_and_names_its_line():
    arch = HF_BY_NAME["llama"]
    module = deferred_init(arch.cls, arch.config())

    def other_std(model):
        for sub in model.modules():
            if isinstance(sub, nn.Linear):
                nn.init.normal_(sub.weight, std=0.05)  # the line the report names
            elif hasattr(sub, "weight") and sub.weight is not None:
                nn.init.ones_(sub.weight)
        for name, buffer in model.named_buffers():
            buffer.copy_(torch.ones_like(buffer))

    report = init_report(module, reinit=other_std)
    q_proj = row(report, "model.layers.0.self_attn.q_proj.weight")
    assert q_proj["reinit"] == "normal(mean=0.0, std=0.05)"
    assert q_proj["flags"] == ["overwritten", "reinit differs"]
    line = other_std.__code__.co_firstlineno + 3
    assert q_proj["reinit_source"] == f"{__file__}:{line} in other_std"
    assert "reinit differs" not in row(report, "model.norm.weight")["flags"]
    assert "reinit differs" in row(report, "model.rotary_emb.inv_freq")["flags"]  # ones, not computed


def test_reinit_leaves_later_random_numbers_as_eager(restore_rng):
    torch.manual_seed(0)
    first = deferred_init(nn.Linear, 8, 8)
    init_report(first, reinit=lambda m: nn.init.normal_(m.weight))
    second = deferred_init(nn.Linear, 8, 8)
    materialize_module(first)
    materialize_module(second)
    torch.manual_seed(0)
    eager_first, eager_second = nn.Linear(8, 8), nn.Linear(8, 8)
    assert torch.equal(first.weight, eager_first.weight) and torch.equal(second.weight, eager_second.weight)


def test_reinit_errors_name_the_function():
    def broken(model):
        raise ValueError("no init here")

    with pytest.raises(ValueError, match="^no init here") as caught:
        init_report(deferred_init(nn.Linear, 2, 2), reinit=broken)
    assert caught.value.__notes__ == [
        f"while recording reinit=test_reinit_errors_name_the_function.<locals>.broken ({__file__}:"
        f"{broken.__code__.co_firstlineno}) on an empty copy of Linear"]


def test_checkpoint_values_are_copied_from_their_file_and_key(tmp_path):
    from tests.support.checkpoints import loaded_pair

    module, _ = loaded_pair(tmp_path)
    report = init_report(module)
    weight = row(report, "first.weight")
    assert weight["init"] == "copied from checkpoint pair.safetensors:first.weight"
    assert weight["family"] == "copied" and math.isnan(weight["std"])
    assert (weight["dead_writes"], weight["flags"]) == (1, ["overwritten"])  # the constructor's draw
    assert row(report, "scale")["init"] == "constant(1.0)"


class FromOutside(nn.Module):
    def __init__(self, values):
        super().__init__()
        self.w = nn.Parameter(torch.empty(4))
        with torch.no_grad():
            self.w.copy_(values)


def test_a_tensor_from_outside_the_recording_gives_its_exact_moments():
    values = torch.tensor([1.0, 2.0, 3.0, 6.0])
    w = row(init_report(deferred_init(FromOutside, values)), "w")
    assert w["init"] == "copied from a tensor from outside the recording (4,)"
    assert (w["mean"], w["std"]) == (3.0, math.sqrt(3.5))


def test_a_module_materialized_on_the_meta_device_is_reported_without_measurements() -> None:
    torch.manual_seed(0)
    module = explorer.deferred_init(nn.Linear, 4, 3)
    explorer.materialize_module(module, device="meta")
    row = explorer.init_report(module).set_index("name").loc["weight"]
    assert row["init"] == "uniform(-0.5, 0.5)"
    assert math.isnan(row["measured_mean"]) and "measured differs" not in row["flags"]


# -- severity and the cost of waste ---------------------------------------------------------------


class Reinitialized(nn.Module):
    """A Linear whose own reset_parameters draws are overwritten, as Hugging Face's `_init_weights` does."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 8)
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)


def test_a_reset_overwritten_by_a_later_init_is_waste_with_the_bytes_it_wrote():
    report = init_report(deferred_init(Reinitialized))
    weight, bias = row(report, "proj.weight"), row(report, "proj.bias")
    assert (weight["flags"], weight["severity"], weight["wasted_bytes"]) == (["overwritten"], "waste", 8 * 4 * 4)
    assert (bias["flags"], bias["severity"], bias["wasted_bytes"]) == (["overwritten"], "waste", 8 * 4)
    assert weight["wasted_s"] == 128 * write_seconds_per_byte()


def test_an_uninitialized_tensor_is_a_defect_that_wastes_nothing():
    report = init_report(deferred_init(Holder, lambda w: None, (2, 3)))  # torch.empty, never written
    w = row(report, "w")
    assert (w["flags"], w["severity"], w["wasted_bytes"], w["wasted_s"]) == (["uninitialized"], "defect", 0, 0.0)


def test_a_defect_outranks_waste_on_the_same_tensor():
    report = init_report(deferred_init(Stack))
    assert (row(report, "layers.2.weight")["flags"], row(report, "layers.2.weight")["severity"]) == (
        ["overwritten", "outlier"], "defect")
    assert row(report, "layers.0.weight")["severity"] is None  # no flag


def test_hugging_face_qwen2_has_no_defects_and_every_overwrite_is_waste():
    arch = HF_BY_NAME["qwen2"]
    config = arch.config()
    assert config.num_hidden_layers == 2
    report = init_report(deferred_init(arch.cls, config))
    assert (report["severity"] == "defect").sum() == 0
    overwritten = report[report["flags"].map(lambda flags: "overwritten" in flags)]
    assert len(overwritten) == 28 and set(overwritten["severity"]) == {"waste"}
    assert report["flags"].map(lambda flags: set(flags) <= {"overwritten"}).all()
    # the tied lm_head is the embedding: its dead draw (96 x 32 float32) is counted once, under the first name
    assert row(report, "model.embed_tokens.weight")["wasted_bytes"] == 96 * 32 * 4
    assert row(report, "lm_head.weight")["wasted_bytes"] == 0
    assert report["wasted_bytes"].sum() == 87184


class MaskedAttention(nn.Module):
    """A causal mask's -inf fill and a NaN sentinel: constants that are not numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.full((4, 4), float("-inf")).triu(1))
        self.register_buffer("fill", torch.full((4,), float("-inf")))
        self.register_buffer("sentinel", torch.full((2,), float("nan")))


def test_constants_that_are_not_finite_are_described_not_crashed_on():
    # before: OverflowError "cannot convert float infinity to integer" from the text of the constant
    report = init_report(deferred_init(MaskedAttention)).set_index("name")
    assert report.loc["fill", "init"] == "constant(-inf)"
    assert report.loc["sentinel", "init"] == "constant(nan)"
    assert report.loc["fill", "flags"] == [] and report.loc["sentinel", "flags"] == []
    assert explorer.inspect(deferred_init(MaskedAttention)).init is not None
