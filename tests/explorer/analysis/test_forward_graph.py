"""forward_graph: the forward recorded op by op on fakes, each op owned by the module that ran it.

References are independent of the recorder: shapes and FLOPs of matrix products are computed by
hand from the configs, the modules that must own an op are read from `named_modules()` (every
Linear owns exactly one matrix product, every Conv2d one convolution), output shapes come from the
eager module's real forward, and "changes nothing" is checked on the recording size, the tensor
objects and versions, the RNG state and bitwise eager parity after materializing.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explorer import deferred_init, is_deferred, materialize_module
from explorer.analysis.forward_graph import OP_COLUMNS, ForwardGraphError, forward_graph, ops_inside
from explorer.record.fake import handle_of
from tests.support.hf_configs import HF_BY_NAME, build_eager


def graph_size(module: nn.Module) -> tuple[int, int]:
    graph = handle_of(next(iter(module.parameters()))).graph
    return len(graph.ops), len(graph.tensors)


def tiny_cnn() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))


def deferred_llama() -> nn.Module:
    torch.manual_seed(0)
    arch = HF_BY_NAME["llama"]  # hidden 32, intermediate 64, 4 heads of 8, 2 kv heads, vocab 96, 2 layers
    return deferred_init(arch.cls, arch.config()).eval()


def mm_rows(forward):
    return forward.ops[forward.ops["op"] == "mm"]


def test_every_linear_owns_its_matrix_product_with_shapes_and_flops():
    model = deferred_llama()
    forward = forward_graph(model, HF_BY_NAME["llama"].inputs())  # input_ids (2, 8)
    linears = [path for path, sub in model.named_modules() if isinstance(sub, nn.Linear)]
    assert mm_rows(forward)["module"].tolist() == linears  # forward order is registration order here
    up = mm_rows(forward).set_index("module").loc["model.layers.0.mlp.up_proj"]
    assert up["input_shapes"] == [(16, 32), (32, 64)]  # tokens flattened, weight transposed
    assert up["input_dtypes"] == ["float32", "float32"]
    assert up["output_shapes"] == [(16, 64)]
    assert up["flops"] == 2 * 16 * 32 * 64
    assert up["bytes"] == 16 * 64 * 4
    assert up["class"] == "Linear" and up["kind"] == "compute" and up["aten"] == "aten.mm.default"
    assert list(forward.ops.columns) == OP_COLUMNS


def test_attention_flops_follow_the_scaled_dot_product_formula():
    forward = forward_graph(deferred_llama(), HF_BY_NAME["llama"].inputs())
    attention = forward.ops[forward.ops["op"] == "_scaled_dot_product_flash_attention_for_cpu"]
    assert attention["module"].tolist() == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    # batch 2, 4 heads, 8 tokens, head size 8: Q·Kᵀ and P·V, 2 FLOPs per multiply-add each
    assert attention["flops"].tolist() == [2 * 2 * (2 * 4 * 8 * 8 * 8)] * 2
    linear_flops = sum(2 * 16 * i * o for i, o in [(32, 32), (32, 16), (32, 16), (32, 32), (32, 64), (32, 64),
                                                   (64, 32)]) * 2 + 2 * 16 * 32 * 96
    assert forward.flops == linear_flops + attention["flops"].sum()


def test_module_table_sums_subtrees():
    forward = forward_graph(deferred_llama(), (1, 16))
    table = forward.modules.set_index("name")
    q = table.loc["model.layers.0.self_attn.q_proj"]
    assert (q["class"], q["ops"], q["flops"], q["activation_bytes"]) == ("Linear", 4, 2 * 16 * 32 * 32, 16 * 32 * 4)
    assert table.loc[""]["ops"] == len(forward.graph.ops)
    assert table.loc["model.layers"]["flops"] == table.loc["model.layers.0"]["flops"] * 2
    assert forward.module_totals("model.layers.0.self_attn.q_proj") == (4, 2 * 16 * 32 * 32, 16 * 32 * 4)
    assert forward.module_totals("no.such.module") == (0, 0, 0)


def test_a_shape_becomes_token_ids_and_inputs_are_named():
    forward = forward_graph(deferred_llama(), (1, 16))
    assert forward.inputs == {"input 0": 0}
    info = forward.graph.tensors[0]
    assert (info.shape, info.dtype) == ((1, 16), torch.int64)
    assert forward.output.logits.shape == (1, 16, 96)
    assert ops_inside(forward, "lm_head") == [i for i, owner in enumerate(forward.owners) if owner == "lm_head"]


def test_parameters_read_are_mapped_to_the_forward_tensors_that_feed_ops():
    model = deferred_llama()
    forward = forward_graph(model, (1, 4))
    assert set(forward.parameters) == {name for name, _ in model.named_parameters()} | {"model.rotary_emb.inv_freq"}
    weight = forward.graph.tensors[forward.parameters["model.layers.1.mlp.down_proj.weight"]]
    assert (weight.shape, weight.producer) == ((32, 64), -1)  # an input of the forward, made by no op of it


def test_t5_encoder_and_decoder_ops_land_in_their_blocks():
    arch = HF_BY_NAME["t5"]
    torch.manual_seed(0)
    model = deferred_init(arch.cls, arch.config()).eval()
    forward = forward_graph(model, arch.inputs())  # input_ids (2, 8), decoder_input_ids (2, 5)
    assert forward.inputs == {"input_ids": 0, "decoder_input_ids": 1}
    by_module = mm_rows(forward).set_index("module")
    cross_k = by_module.loc["decoder.block.1.layer.1.EncDecAttention.k"]
    assert cross_k["input_shapes"] == [(16, 32), (32, 32)]  # keys from the 2×8 encoder tokens
    cross_q = by_module.loc["decoder.block.1.layer.1.EncDecAttention.q"]
    assert cross_q["input_shapes"] == [(10, 32), (32, 32)]  # queries from the 2×5 decoder tokens
    eager = build_eager(arch).eval()
    with torch.no_grad():
        expected = eager(**arch.inputs()).logits.shape
    assert forward.output.logits.shape == expected == (2, 5, 96)


def test_cnn_convolutions_belong_to_their_conv_layers():
    forward = forward_graph(tiny_cnn(), (2, 3, 16, 16))
    assert forward.ops[["op", "module"]].values.tolist() == [
        ["convolution", "0"], ["relu", "1"], ["convolution", "2"], ["relu", "3"], ["mean", "4"], ["view", "5"],
        ["t", "6"], ["addmm", "6"],
    ]
    second = forward.ops.iloc[2]
    assert second["input_shapes"] == [(2, 8, 16, 16), (4, 8, 3, 3), (4,)]
    assert second["flops"] == 2 * (2 * 4 * 16 * 16) * (8 * 3 * 3)
    assert second["bytes"] == 2 * 4 * 16 * 16 * 4


def test_forward_graph_changes_nothing_in_a_deferred_module():
    model = deferred_llama()
    tensors = {name: (t, t._version) for name, t in model.state_dict(keep_vars=True).items()}
    size = graph_size(model)
    rng = torch.get_rng_state()
    first = forward_graph(model, (2, 8))
    assert torch.equal(torch.get_rng_state(), rng)
    assert graph_size(model) == size  # nothing recorded into the construction graph
    for name, tensor in model.state_dict(keep_vars=True).items():
        assert tensor is tensors[name][0] and tensor._version == tensors[name][1], name
    assert len(forward_graph(model, (2, 8)).graph.ops) == len(first.graph.ops)  # same graph again
    assert is_deferred(model)
    materialize_module(model)  # still eager's values, bit for bit
    eager = build_eager(HF_BY_NAME["llama"]).eval()
    for (name, value), (_, expected) in zip(model.state_dict().items(), eager.state_dict().items()):
        assert torch.equal(value, expected), name


def test_forward_graph_changes_nothing_in_an_eager_module():
    torch.manual_seed(0)
    model = tiny_cnn()
    before = {name: (t.data_ptr(), t.clone()) for name, t in model.state_dict().items()}
    rng = torch.get_rng_state()
    forward = forward_graph(model, (1, 3, 8, 8))
    assert torch.equal(torch.get_rng_state(), rng)
    assert forward.output.shape == (1, 10)
    for name, tensor in model.state_dict().items():
        assert tensor.data_ptr() == before[name][0] and torch.equal(tensor, before[name][1]), name


def test_partly_materialized_module_keeps_its_real_tensors():
    model = deferred_llama()
    materialize_module(model.model.layers[0])
    real = {name: (t.data_ptr(), t.clone()) for name, t in model.model.layers[0].state_dict().items()}
    forward = forward_graph(model, (1, 4))
    assert forward.output.logits.shape == (1, 4, 96)
    for name, tensor in model.model.layers[0].state_dict().items():
        assert tensor.data_ptr() == real[name][0] and torch.equal(tensor, real[name][1]), name
    assert is_deferred(model.model.layers[1])


def test_a_value_dependent_forward_names_the_module():
    class Gate(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[x > 0]  # output shape depends on values

    model = nn.Sequential(nn.Linear(4, 4), Gate())
    with pytest.raises(ForwardGraphError) as caught:
        forward_graph(model, (2, 4))
    assert str(caught.value).startswith(
        "the forward of 1 (Gate) cannot run on fake tensors (it depends on tensor values, which fake tensors "
        "do not have): DynamicOutputShapeException")


def test_forward_graph_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="^explorer.forward_graph expects an nn.Module, got function$"):
        forward_graph(tiny_cnn, (1, 3, 8, 8))


def test_fused_moe_experts_run_grouped_mm_in_float32_on_cpu_fakes():
    # transformers 5 runs Mixtral's fused experts through aten._grouped_mm, whose fake kernel in
    # torch 2.13 accepts only bfloat16 while the CPU kernel takes float32 (explorer.analysis.cpu_fake_mode)
    arch = HF_BY_NAME["mixtral"]  # hidden 32, intermediate 64, 4 experts, 2 per token, 2 layers
    eager = build_eager(arch).eval()
    torch.manual_seed(0)
    deferred = deferred_init(arch.cls, arch.config()).eval()
    inputs = arch.inputs()  # 2 x 8 tokens: 16 tokens, 2 experts each = 32 rows
    with torch.no_grad():
        expected = eager(**inputs).logits
    forward = forward_graph(deferred, inputs)
    assert (forward.output.logits.shape, forward.output.logits.dtype) == (expected.shape, expected.dtype)
    grouped = forward.ops[forward.ops["aten"] == "aten._grouped_mm.default"]
    assert list(grouped["module"]) == ["model.layers.0.mlp.experts"] * 2 + ["model.layers.1.mlp.experts"] * 2
    assert list(grouped["input_shapes"])[:2] == [[(32, 32), (4, 32, 128), (4,)], [(32, 64), (4, 64, 32), (4,)]]
    assert list(grouped["output_shapes"])[:2] == [[(32, 128)], [(32, 32)]]
    assert set(grouped["output_dtypes"].map(tuple)) == {("float32",)}
    # each of the 32 rows goes through one expert: 2·M·K·N
    assert list(grouped["flops"])[:2] == [2 * 32 * 32 * 128, 2 * 32 * 64 * 32]


def test_a_forward_branching_on_a_random_draw_names_the_line_that_reads_it():
    # LayerDrop as M2M100, Wav2Vec2 and others write it: in training mode a layer is skipped when a
    # fresh torch.rand draw falls below the drop rate, which fakes cannot decide
    class LayerDrop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            skip = torch.rand([])
            return x if skip < 0.1 else self.layer(x)

    model = nn.Sequential(LayerDrop())
    with pytest.raises(ForwardGraphError) as caught:
        forward_graph(model, (2, 4))
    line = LayerDrop.forward.__code__.co_firstlineno + 2
    assert str(caught.value) == (
        "the forward of 0 (LayerDrop) cannot run on fake tensors (it depends on tensor values, which fake tensors "
        "do not have): DataDependentOutputException: aten._local_scalar_dense.default "
        f"(at {__file__}:{line} in forward: return x if skip < 0.1 else self.layer(x))"
    )


def test_an_eval_mode_transformer_encoder_counts_the_flops_of_its_fused_inference_path():
    from torch.utils.flop_counter import FlopCounterMode

    from explorer import dry_run

    def build() -> nn.Module:
        layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
        return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    x = torch.randn(2, 8, 32)
    eager = build()
    with FlopCounterMode(display=False) as counter:
        eager(x)  # train mode: every matmul through ops that have a formula
    model = deferred_init(build).eval()
    assert forward_graph(model, x).flops == dry_run(model, x).flops == counter.get_total_flops() > 0
    assert torch.backends.mha.get_fastpath_enabled()  # PyTorch's setting is back
