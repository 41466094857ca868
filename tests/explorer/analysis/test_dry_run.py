"""dry_run: a forward pass on fake tensors gives eager's output shapes and FLOPs, changes nothing.

References are computed independently: the eager module's real forward (shapes, dtypes) and
`FlopCounterMode` around that real forward (FLOPs; CPU attention by a formula written here, as torch
< 2.15 has none); a 70B Llama's FLOPs are counted by hand from its config.
"""

from __future__ import annotations

import gc

import psutil
import pytest
import torch
import transformers
from torch import nn
from torch.testing._internal.common_modules import module_db
from torch.utils.flop_counter import FlopCounterMode

from explorer import DryRunError, deferred_init, dry_run, is_deferred, materialize_module
from explorer._torch_compat.flops import sdpa_backward_flops, sdpa_flops
from explorer.analysis.dry_run import shape_input_dtype, tensor_leaves
from explorer.analysis.forward_graph import forward_graph
from explorer.analysis.forward_record import FLOP_MAPPING
from explorer.record.fake import handle_of
from tests.support.hf_configs import HF_BY_NAME, build_eager

MODULE_DB = {info.name: info for info in module_db}
# Varied: dense, bilinear, 1-3d convolutions, normalizations with running stats, embeddings,
# recurrent layers and cells, attention and transformer layers, parameter-free pooling and losses.
MODULE_DB_SAMPLE = [
    "nn.Linear", "nn.Bilinear", "nn.Conv1d", "nn.Conv2d", "nn.ConvTranspose2d", "nn.Conv3d", "nn.BatchNorm2d",
    "nn.GroupNorm", "nn.LayerNorm", "nn.RMSNorm", "nn.InstanceNorm2d", "nn.Embedding", "nn.LSTM", "nn.GRU",
    "nn.RNNCell", "nn.MultiheadAttention", "nn.TransformerEncoderLayer", "nn.TransformerDecoderLayer",
    "nn.PReLU", "nn.MaxPool2d", "nn.AdaptiveAvgPool2d", "nn.CrossEntropyLoss",
]
INPUTS_PER_ENTRY = 2


def signature(value) -> list[tuple[tuple[int, ...], torch.dtype]]:
    return [(tuple(t.shape), t.dtype) for t in tensor_leaves(value)]


def grouped_query_attention_flops(batch, query_heads, queries, keys, head_size, value_size):
    """Q·Kᵀ and P·V for every query head (a key/value head shared by several counts once for each),
    2 FLOPs per multiply-add: torch 2.15's formula, by hand."""
    return 2 * batch * query_heads * queries * keys * head_size + 2 * batch * query_heads * queries * keys * value_size


def cpu_attention_by_hand(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """A shape formula for FlopCounterMode: torch < 2.15 has none for the CPU attention kernel."""
    batch, heads, queries, head_size = query_shape
    return grouped_query_attention_flops(batch, heads, queries, key_shape[2], head_size, value_shape[3])


def eager_reference(module: nn.Module, *args, **kwargs) -> tuple[list, int]:
    """Shapes/dtypes of a real forward and the FLOPs FlopCounterMode counts for it (CPU attention
    by `cpu_attention_by_hand` on every release)."""
    by_hand = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention_by_hand}
    with FlopCounterMode(display=False, custom_mapping=by_hand) as counter, torch.no_grad():
        out = module(*args, **kwargs)
    return signature(out), counter.get_total_flops()


def graph_size(module: nn.Module) -> tuple[int, int, int]:
    graph = handle_of(next(t for t in module.parameters())).graph
    return len(graph.ops), len(graph.tensors), len(graph.externals)


@pytest.mark.parametrize("name", MODULE_DB_SAMPLE)
def test_dry_run_matches_eager_shapes_and_flops_on_module_db(name):
    info = MODULE_DB[name]
    samples = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=False, training=False)
    for sample in samples[:INPUTS_PER_ENTRY]:
        c_args, c_kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
        f_args, f_kwargs = sample.forward_input.args, sample.forward_input.kwargs
        eager = info.module_cls(*c_args, **c_kwargs).eval()
        expected_shapes, expected_flops = eager_reference(eager, *f_args, **f_kwargs)

        deferred = deferred_init(info.module_cls, *c_args, **c_kwargs).eval()
        rng = torch.get_rng_state()
        result = dry_run(deferred, *f_args, **f_kwargs)
        assert torch.equal(torch.get_rng_state(), rng)
        assert signature(result.output) == expected_shapes
        assert result.flops == expected_flops
        assert result.modules["flops"][0] == expected_flops  # the root row includes everything
        assert result.modules["output_shapes"][0] == [shape for shape, _ in expected_shapes]
        if any(True for _ in deferred.parameters()):
            assert is_deferred(deferred)

        # The eager module itself dry-runs to the same answer.
        assert signature(dry_run(eager, *f_args, **f_kwargs).output) == expected_shapes


@pytest.mark.parametrize("arch_name", ["llama", "bert", "vit", "t5"])
def test_dry_run_matches_eager_forward_on_transformers(arch_name):
    arch = HF_BY_NAME[arch_name]
    eager = build_eager(arch).eval()
    expected_shapes, expected_flops = eager_reference(eager, **arch.inputs())
    torch.manual_seed(0)
    deferred = deferred_init(arch.cls, arch.config()).eval()
    result = dry_run(deferred, arch.inputs())  # a dict is keyword arguments
    assert signature(result.output) == expected_shapes
    assert result.flops == expected_flops


def test_modules_table_reports_each_call_exactly():
    torch.manual_seed(0)
    arch = HF_BY_NAME["llama"]  # hidden 32, intermediate 64, vocab 96, input (2, 8)
    model = deferred_init(arch.cls, arch.config()).eval()
    table = dry_run(model, arch.inputs()).modules.set_index("name")
    up = table.loc["model.layers.0.mlp.up_proj"]
    assert up["class"] == "Linear"
    assert up["calls"] == 1
    assert up["output_shapes"] == [(2, 8, 64)]
    assert up["output_dtypes"] == ["float32"]
    assert up["activation_bytes"] == 2 * 8 * 64 * 4
    assert up["flops"] == 2 * (2 * 8) * 32 * 64
    assert table.loc["model.layers"]["calls"] == 0  # a ModuleList is never called
    assert table.loc["lm_head"]["output_shapes"] == [(2, 8, 96)]
    assert list(table.columns) == [
        "class", "calls", "output_shapes", "output_dtypes", "activation_bytes", "peak_activation_bytes", "flops",
    ]


def test_peak_activation_memory_counts_live_intermediates():
    # (3, 4) input: Linear → (3, 8) = 96 B; ReLU → another 96 B while the first is alive (192 B);
    # then the first is dropped; Linear → (3, 2) = 24 B next to the ReLU output (120 B).
    model = deferred_init(lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    result = dry_run(model, (3, 4))
    assert result.peak_activation_bytes == 192
    assert result.modules["peak_activation_bytes"].tolist() == [192, 96, 192, 120]
    assert result.modules["activation_bytes"].tolist() == [24, 96, 96, 24]
    assert result.modules["flops"].tolist() == [2 * 3 * 4 * 8 + 2 * 3 * 8 * 2, 2 * 3 * 4 * 8, 0, 2 * 3 * 8 * 2]
    assert result.output.shape == (3, 2) and result.output.dtype == torch.float32


def test_integer_token_inputs_and_shape_tuples():
    torch.manual_seed(0)
    arch = HF_BY_NAME["llama"]
    model = deferred_init(arch.cls, arch.config())
    assert dry_run(model, torch.zeros(1, 16, dtype=torch.long)).output.logits.shape == (1, 16, 96)
    linear = deferred_init(nn.Linear, 5, 7)
    assert dry_run(linear, (2, 3, 5)).output.shape == (2, 3, 7)


def test_a_shape_given_to_a_model_that_starts_with_an_embedding_becomes_token_ids():
    torch.manual_seed(0)
    arch = HF_BY_NAME["llama"]
    model = deferred_init(arch.cls, arch.config())
    assert shape_input_dtype(model) == torch.int64
    assert dry_run(model, (1, 2048)).output.logits.shape == (1, 2048, 96)
    bag = deferred_init(lambda: nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2)))
    assert shape_input_dtype(bag) == torch.int64
    assert dry_run(bag, (3, 5)).output.shape == (3, 5, 2)
    assert shape_input_dtype(deferred_init(lambda: nn.Sequential(nn.ReLU(), nn.Linear(4, 2)))) == torch.float32


class Rescales(nn.Module):
    """Writes its own parameter and buffer in place during forward (as RWKV's eval forward does)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.linear.weight.mul_(0.5)
            self.steps.add_(1)
        return self.linear(x)


def test_dry_run_changes_nothing_in_a_deferred_module():
    torch.manual_seed(0)
    model = deferred_init(Rescales)
    tensors = {name: (t, t._version) for name, t in model.state_dict(keep_vars=True).items()}
    size = graph_size(model)
    rng = torch.get_rng_state()
    assert dry_run(model, (2, 4)).output.shape == (2, 4)
    assert torch.equal(torch.get_rng_state(), rng)
    assert graph_size(model) == size  # nothing recorded
    for name, tensor in model.state_dict(keep_vars=True).items():
        assert tensor is tensors[name][0] and tensor._version == tensors[name][1], name
    # ...so it still materializes to exactly what eager construction gives.
    materialize_module(model)
    torch.manual_seed(0)
    eager = Rescales()
    for (name, value), (_, expected) in zip(model.state_dict().items(), eager.state_dict().items()):
        assert torch.equal(value, expected), name


def test_dry_run_changes_nothing_in_an_eager_module():
    torch.manual_seed(0)
    model = Rescales()
    before = {name: (t.data_ptr(), t.clone()) for name, t in model.state_dict().items()}
    dry_run(model, (2, 4))
    for name, tensor in model.state_dict().items():
        assert tensor.data_ptr() == before[name][0] and torch.equal(tensor, before[name][1]), name


def test_dry_run_on_partly_materialized_module_keeps_real_tensors():
    torch.manual_seed(0)
    arch = HF_BY_NAME["llama"]
    model = deferred_init(arch.cls, arch.config()).eval()
    materialize_module(model.model.layers[0])
    real = {name: t.clone() for name, t in model.model.layers[0].state_dict().items()}
    pointers = {name: t.data_ptr() for name, t in model.model.layers[0].state_dict().items()}
    result = dry_run(model, arch.inputs())
    assert result.output.logits.shape == (2, 8, 96)
    for name, tensor in model.model.layers[0].state_dict().items():
        assert tensor.data_ptr() == pointers[name] and torch.equal(tensor, real[name]), name
    assert is_deferred(model.model.layers[1])


def test_value_dependent_forward_names_the_module():
    class Gate(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    model = deferred_init(lambda: nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.ReLU(), Gate())))
    with pytest.raises(DryRunError) as error:
        dry_run(model, (3, 4))
    line = Gate.forward.__code__.co_firstlineno + 1
    assert str(error.value) == (
        "the forward of 1.1 (Gate) cannot run on fake tensors (it depends on tensor values, which fake "
        "tensors do not have): DataDependentOutputException: aten._local_scalar_dense.default "
        f"(at {__file__}:{line} in forward: return x if x.sum() > 0 else -x)"
    )


def test_uninitialized_lazy_parameter_is_refused():
    model = deferred_init(nn.LazyLinear, 3)
    with pytest.raises(DryRunError, match=r"^'weight' is an uninitialized lazy parameter"):
        dry_run(model, (2, 4))


def test_70b_llama_dry_run_without_storage():
    config = transformers.LlamaConfig(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8,
    )
    model = deferred_init(transformers.LlamaForCausalLM, config)
    gc.collect()
    process = psutil.Process()
    rss = process.memory_info().rss
    result = dry_run(model, torch.zeros(1, 16, dtype=torch.long))
    growth = process.memory_info().rss - rss
    assert growth < 2 * 10**9, f"dry run grew RSS by {growth:,} bytes"
    assert result.output.logits.shape == (1, 16, 32000)

    # FLOPs by hand: 2 per multiply-add of every linear layer for each of the 16 tokens, plus each
    # layer's attention: Q·Kᵀ and P·V for every one of the 64 query heads of size 128 (its 8
    # key/value heads are shared by 8 query heads each, and counted once per query head), 16 queries
    # against 16 keys, 2 FLOPs per multiply-add, causal masking not discounted (torch 2.15's formula;
    # 2.11 to 2.14 count it through explorer._torch_compat.flops).
    h, i, kv = 8192, 28672, 8192 // 64 * 8
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i
    attention = 2 * 64 * 16 * 16 * (128 + 128)
    assert result.flops == 2 * 16 * (80 * per_layer + h * 32000) + 80 * attention
    table = result.modules.set_index("name")
    assert table.loc["model.layers.79.mlp.down_proj"]["output_shapes"] == [(1, 16, 8192)]
    assert table.loc["model.layers.79"]["flops"] == 2 * 16 * per_layer + attention
    assert table.loc["model.layers.79.self_attn"]["flops"] == 2 * 16 * (2 * h * h + 2 * h * kv) + attention


def test_grouped_query_attention_flops_follow_the_formula_on_the_running_release():
    arch = HF_BY_NAME["llama"]  # 2 layers, 4 query heads of 8 sharing 2 key/value heads
    config = arch.config()
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 8)
    model = deferred_init(arch.cls, config).eval()
    run = dry_run(model, (2, 8))
    per_layer = grouped_query_attention_flops(2, 4, 8, 8, 8, 8)
    assert run.flops_by_op["aten._scaled_dot_product_flash_attention_for_cpu"] == 2 * per_layer
    table = run.modules.set_index("name")
    projections = 2 * 16 * (32 * 32 + 32 * 16 + 32 * 16 + 32 * 32)  # q, k, v, o of 16 tokens
    assert table.loc["model.layers.0.self_attn"]["flops"] == projections + per_layer
    assert forward_graph(model, (2, 8)).flops == run.flops  # op by op, the same formulas


def test_attention_backward_flops_follow_the_formula_on_the_running_release():
    """A real CPU attention backward with grouped-query heads under the counter dry_run uses (the
    CPU flash kernel needs equal head sizes: other sizes run as bmm)."""
    query = torch.randn(2, 4, 3, 6, requires_grad=True)
    key = torch.randn(2, 2, 5, 6, requires_grad=True)
    value = torch.randn(2, 2, 5, 6, requires_grad=True)
    with FlopCounterMode(display=False, custom_mapping=FLOP_MAPPING) as counter:
        out = nn.functional.scaled_dot_product_attention(query, key, value, enable_gqa=True)
        out.sum().backward()
    counts = {str(op): count for op, count in counter.flop_counts["Global"].items()}
    # backward: the scores again (Q·Kᵀ), dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K, dK = Qᵀ·dS, per query head
    backward = 2 * 2 * 4 * 3 * 5 * (6 + 6 + 6 + 6 + 6)
    assert counts == {
        "aten._scaled_dot_product_flash_attention_for_cpu": grouped_query_attention_flops(2, 4, 3, 5, 6, 6),
        "aten._scaled_dot_product_flash_attention_for_cpu_backward": backward,
    }


def test_attention_formulas_refuse_heads_that_do_not_group():
    with pytest.raises(AssertionError, match=r"query heads \(3\) must be a multiple of key/value heads \(2\)"):
        sdpa_flops((1, 3, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))
    with pytest.raises(AssertionError, match="grad_out has shape"):
        sdpa_backward_flops((1, 4, 4, 8), (1, 4, 4, 8), (1, 2, 4, 8), (1, 2, 4, 6))
    assert sdpa_flops((1, 4, 3, 2), (1, 2, 5, 2), (1, 2, 5, 3)) == grouped_query_attention_flops(1, 4, 3, 5, 2, 3)


class GroupedMatmuls(nn.Module):
    """A 2-D x 3-D grouped product with offsets (as MoE experts run it) and a 3-D x 3-D one."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.Parameter(torch.randn(4, 12, 8))

    def forward(self, rows: torch.Tensor, offsets: torch.Tensor, batched: torch.Tensor) -> tuple:
        return torch._grouped_mm(rows, self.experts, offsets), torch._grouped_mm(batched, self.experts)


def test_float32_grouped_mm_on_cpu_fakes_gives_the_cpu_kernels_shapes_and_dtype():
    module = GroupedMatmuls()
    inputs = (torch.randn(10, 12), torch.tensor([2, 5, 5, 10], dtype=torch.int32), torch.randn(4, 10, 12))
    expected = module(*inputs)
    run = dry_run(module, *inputs)
    assert signature(run.output) == signature(expected) == [((10, 8), torch.float32), ((4, 10, 8), torch.float32)]
    # torch counts no FLOPs for _grouped_mm: each of the 10 rows through one 12x8 expert, then 4 batched 10x12 @ 12x8
    assert run.flops_by_op == {"aten._grouped_mm": 2 * 10 * 12 * 8 + 2 * 4 * 10 * 12 * 8}


def test_grouped_mm_with_misaligned_strides_is_refused_on_fakes_as_on_cpu():
    module = GroupedMatmuls()
    rows = torch.randn(10, 13)[:, :12]  # row stride 13 floats = 52 bytes, not a multiple of 16
    inputs = (rows, torch.tensor([2, 5, 5, 10], dtype=torch.int32), torch.randn(4, 10, 12))
    with pytest.raises(RuntimeError, match="strides should be multiple of 16 bytes"):
        module(*inputs)
    with pytest.raises(DryRunError) as caught:
        dry_run(module, *inputs)
    line = GroupedMatmuls.forward.__code__.co_firstlineno + 1
    assert str(caught.value) == (
        "the forward of <root> (GroupedMatmuls) cannot run on fake tensors: RuntimeError: "
        "_grouped_mm: mat_a's strides (13, 1) are not multiples of 16 bytes "
        f"(at {__file__}:{line} in forward: "
        "return torch._grouped_mm(rows, self.experts, offsets), torch._grouped_mm(batched, self.experts))"
    )


class SharedAtTwoPaths(nn.Module):
    """One layer at three paths (ALBERT-style sharing) and another module also held twice."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.Linear(8, 8)
        self.layers = nn.ModuleList([layer] * 3)
        self.norm = nn.LayerNorm(8)
        self.again = self.norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.again(x)


@pytest.mark.parametrize("analysis", ["dry_run", "forward_graph"])
@pytest.mark.parametrize("deferred", [True, False])
def test_a_module_held_at_two_paths_keeps_its_own_tensors_after_the_analysis(analysis, deferred, restore_rng):
    # note [Each slot swapped once]: functional_call restored the analysis's fakes into such slots
    import explorer

    torch.manual_seed(0)
    model = explorer.deferred_init(SharedAtTwoPaths) if deferred else SharedAtTwoPaths()
    before = {name: tensor for name, tensor in model.state_dict(keep_vars=True).items()}
    getattr(explorer, analysis)(model, torch.randn(2, 8))
    after = model.state_dict(keep_vars=True)
    assert [name for name in before if after[name] is not before[name]] == []
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())
    if not deferred:
        torch.manual_seed(0)
        assert torch.equal(model(torch.ones(2, 8)), SharedAtTwoPaths()(torch.ones(2, 8)))
