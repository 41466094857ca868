"""What deferred_init records and what the fake tensors report."""

import gc
import logging
import re

import psutil
import pytest
import torch
from torch import nn

from explorer import DeferredInitError, MaterializationError, deferred_init, is_deferred, is_fake, materialize_module
from explorer.replay.replay import default_dtype_set
from explorer.record.fake import handle_of
from tests.support.graphs import assert_same_graph, graph_of


class DeviceAware(nn.Module):
    def __init__(self, device: str) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2, 3, device=device))
        self.like = nn.Parameter(torch.zeros_like(torch.empty(4)))
        # constructor logic that branches on the device it sees
        self.on_cuda = self.w.device.type == "cuda"


def test_tensors_report_the_requested_device_even_cuda_without_a_gpu():
    module = deferred_init(DeviceAware, "cuda")
    assert module.w.device == torch.device("cuda", 0)
    assert module.on_cuda is True
    assert module.like.device == torch.device("cpu")


class ReadsItsCudaValues(nn.Module):
    def __init__(self, random: bool) -> None:
        super().__init__()
        made = torch.rand(3, device="cuda") if random else torch.linspace(0, 1, 3, device="cuda")
        self.rates = made.tolist()  # a value read: made now, as eager would


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA reads them from CUDA (CI has no GPU)")
def test_a_constructor_reading_cuda_values_without_a_gpu_reads_them_or_says_why_it_cannot():
    assert deferred_init(ReadsItsCudaValues, random=False).rates == [0.0, 0.5, 1.0]  # no draw: made on the CPU
    with pytest.raises(DeferredInitError) as caught:
        deferred_init(ReadsItsCudaValues, random=True)
    assert str(caught.value).startswith(
        f"the code at {__file__}:{ReadsItsCudaValues.__init__.__code__.co_firstlineno + 3} in __init__ reads the value "
        "of a tensor on cuda:0, which this machine does not have, and that value cannot be made elsewhere: "
        "rng='eager' draws aten.rand.default"
    )
    assert str(caught.value).endswith(
        "Build the model on the CPU (no device, or device='cpu') to read values here, or run it where cuda:0 exists"
    )
    assert caught.value.reason == "a value read needs cuda:0"
    assert "rng='fast'" not in str(caught.value)  # materialize_*'s advice: deferred_init takes no rng


def test_parameters_and_buffers_are_fake_with_exact_metadata():
    module = deferred_init(nn.Linear, 5, 3, dtype=torch.float64)
    assert is_fake(module.weight) and is_deferred(module.weight) and is_deferred(module)
    assert isinstance(module.weight, nn.Parameter)
    assert module.weight.shape == (3, 5)
    assert module.weight.stride() == (5, 1)
    assert module.weight.dtype == torch.float64
    assert module.weight.requires_grad is True


def test_fake_tensors_print_with_metadata_and_fake_flag():
    module = deferred_init(nn.Linear, 5, 1)
    assert repr(module.bias) == "tensor(..., size=(1,), device='cpu', requires_grad=True, fake=True)"
    assert str(deferred_init(nn.Linear, 5, 1, dtype=torch.float16).weight) == (
        "tensor(..., size=(1, 5), device='cpu', dtype=torch.float16, requires_grad=True, fake=True)")
    buffer = deferred_init(nn.BatchNorm1d, 4).running_mean
    assert repr(buffer) == "tensor(..., size=(4,), device='cpu', fake=True)"


def test_every_aten_op_is_recorded_in_order_with_data_reads_and_writes():
    class DataAccess(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.empty(3))
            self.w.data.fill_(2.0)  # .data read
            self.w.data = torch.ones(4)  # .data write

    module = deferred_init(DataAccess)
    graph = handle_of(module.w).graph
    labels = [op.label for op in graph.ops]
    assert labels == [
        "aten.empty.memory_format",
        "aten.detach.default",  # nn.Parameter wrapping
        "aten.detach.default",  # .data read
        "aten.fill_.Scalar",
        "aten.ones.default",
        "set_data",
    ]
    assert module.w.shape == (4,)


def test_constructor_allocates_no_storage_for_a_70b_architecture():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=32000,
    )
    gc.collect()
    before = psutil.Process().memory_info().rss
    model = deferred_init(transformers.LlamaForCausalLM, config)
    grown = psutil.Process().memory_info().rss - before
    parameters = sum(p.numel() for p in model.parameters())
    assert parameters > 68e9
    assert grown < 1.5e9, f"RSS grew by {grown / 1e9:.2f} GB for {parameters / 1e9:.0f}B fake parameters"


def test_garbage_collector_is_paused_only_while_the_constructor_runs():
    seen = []

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            seen.append(gc.isenabled())
            self.proj = nn.Linear(2, 2)

    assert gc.isenabled()
    deferred_init(Probe)
    assert seen == [False] and gc.isenabled()
    gc.disable()  # a caller that turned it off keeps it off
    try:
        deferred_init(Probe)
        assert not gc.isenabled()
    finally:
        gc.enable()


class CastsInsideTheConstructor(nn.Module):
    """What Hugging Face does (`Apertus1p5`, `DeepseekV4`: `Norm(...).to(dtype=torch.float32)`)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4).to(dtype=torch.float32)  # a no-op cast
        self.low = nn.Linear(4, 4)
        self.low.weight._no_weight_decay = True  # kept by the cast, as eager's .data assignment keeps it
        self.low.to(dtype=torch.bfloat16)
        self.round_trip = nn.Linear(4, 3).half().float()
        self.tied = nn.Linear(4, 4, bias=False)
        self.twin = nn.Linear(4, 4, bias=False)
        self.twin.weight = self.tied.weight
        self.pair = nn.ModuleList([self.tied, self.twin]).double()  # converts a tied parameter once
        self.low.weight.data.mul_(2)


def test_module_casts_inside_a_constructor_record_and_materialize_as_eager():
    from tests.support.parity import assert_module_equals_eager

    torch.manual_seed(3)
    eager = CastsInsideTheConstructor()
    torch.manual_seed(3)
    module = deferred_init(CastsInsideTheConstructor)
    assert module.low.weight.dtype == torch.bfloat16 and module.tied.weight.dtype == torch.float64
    assert module.twin.weight is module.tied.weight and isinstance(module.low.weight, nn.Parameter)
    assert module.low.weight._no_weight_decay is True
    materialize_module(module)
    assert_module_equals_eager("CastsInsideTheConstructor", module, eager)
    assert module.low.weight._no_weight_decay is True and eager.low.weight._no_weight_decay is True
    assert "swappable_fakes" not in torch.utils.swap_tensors.__qualname__  # the scope's patch is undone


class ChangesTheDefaultDtype(nn.Module):
    """A constructor that builds under another default dtype, as `from_config(dtype=...)` does."""

    def __init__(self) -> None:
        super().__init__()
        with default_dtype_set(torch.float64):
            self.proj = nn.Linear(4, 3)
            self.register_buffer("steps", torch.linspace(0, 1, 5))
            self.register_buffer("scale", torch.scalar_tensor(0.5))
        self.after = nn.Linear(3, 2)  # float32 again


def test_factory_ops_keep_the_default_dtype_of_the_moment_they_were_recorded(restore_rng):
    from tests.support.parity import assert_module_equals_eager

    torch.manual_seed(5)
    eager = ChangesTheDefaultDtype()
    torch.manual_seed(5)
    module = deferred_init(ChangesTheDefaultDtype)
    assert module.proj.weight.dtype == module.steps.dtype == torch.float64 and module.after.weight.dtype == torch.float32
    materialize_module(module)
    assert_module_equals_eager("ChangesTheDefaultDtype", module, eager)


def test_transformers_from_config_with_a_dtype_matches_eager(restore_rng):
    transformers = pytest.importorskip("transformers")
    from tests.support.parity import assert_module_equals_eager

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=50)
    torch.manual_seed(0)
    eager = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    torch.manual_seed(0)
    module = deferred_init(transformers.AutoModelForCausalLM.from_config, config, dtype=torch.bfloat16)
    materialize_module(module)
    assert_module_equals_eager("from_config(bfloat16)", module, eager)


class PromotesIntegersUnderHalfDefault(nn.Module):
    """Integer tensors promoted to the default dtype (a sinusoid table under from_config(dtype=...))."""

    def __init__(self) -> None:
        super().__init__()
        with default_dtype_set(torch.float16):
            positions = torch.arange(7)
            self.register_buffer("divided", positions / 3)
            self.register_buffer("scaled", positions * 0.37)
            self.register_buffer("rooted", positions.sqrt())
            self.register_buffer("table", torch.sin(positions[:, None] * torch.exp(-torch.arange(4) * 0.7)))
            self.register_buffer("halved", torch.tensor(3) * 0.5)
            self.register_buffer("mixed", positions.to(torch.float16) / 3)  # its input decides: not pinned
        self.register_buffer("after", torch.arange(5) / 3)  # float32 again


@pytest.mark.parametrize("default_at_replay", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_integer_inputs_promoted_to_the_default_dtype_replay_under_the_recorded_default(default_at_replay, restore_rng):
    from tests.support.parity import assert_module_equals_eager

    eager = PromotesIntegersUnderHalfDefault()
    module = deferred_init(PromotesIntegersUnderHalfDefault)
    assert [module.divided.dtype, module.after.dtype] == [torch.float16, torch.float32]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default_at_replay)  # whatever the default when materializing
    try:
        materialize_module(module)
    finally:
        torch.set_default_dtype(previous)
    assert_module_equals_eager("PromotesIntegersUnderHalfDefault", module, eager)
    assert torch.get_default_dtype() is previous


def test_whisper_sinusoids_under_from_config_bfloat16_equal_eager(restore_rng):
    transformers = pytest.importorskip("transformers")
    from tests.support.parity import assert_module_equals_eager

    config = transformers.WhisperConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                                        vocab_size=60, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                        decoder_start_token_id=1, max_source_positions=16, max_target_positions=16,
                                        num_mel_bins=8)
    torch.manual_seed(0)
    eager = transformers.AutoModel.from_config(config, dtype=torch.bfloat16)
    torch.manual_seed(0)
    module = deferred_init(transformers.AutoModel.from_config, config, dtype=torch.bfloat16)
    materialize_module(module)
    assert_module_equals_eager("Whisper from_config(bfloat16)", module, eager)


class _TrailingSwaps(nn.Module):
    """`.data = x` on each of 12 parameters, with scratch fakes dying in between, whose addresses the
    next fakes reuse; the swaps are recorded at the end of the recording, in the order of the fakes."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(4)) for _ in range(12))
        for i, weight in enumerate(self.weights):
            scratch = [torch.zeros(4) for _ in range(i % 3 + 1)]
            weight.data = scratch[0] + i


def test_recording_twice_gives_the_same_graph_when_fake_addresses_are_reused():
    first = graph_of(deferred_init(_TrailingSwaps))
    for _ in range(20):  # before the fix, about half the recordings put the swaps in another order
        assert_same_graph(graph_of(deferred_init(_TrailingSwaps)), first)
    module = deferred_init(_TrailingSwaps)
    materialize_module(module)
    assert [w.tolist() for w in module.weights] == [[float(i)] * 4 for i in range(12)]


def test_a_sparse_tensor_is_refused_naming_the_op_line_and_what_to_do():
    class SparseAdjacency(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("adjacency", torch.eye(3).to_sparse())

    with pytest.raises(DeferredInitError) as caught:
        deferred_init(SparseAdjacency)
    message = str(caught.value)
    assert message.startswith(f"aten._to_sparse.default failed under deferred_init while building SparseAdjacency at {__file__}:")
    assert message.endswith(
        'self.register_buffer("adjacency", torch.eye(3).to_sparse())\nNotImplementedError: it makes a sparse_coo '
        "tensor, and deferred_init records strided (dense) tensors only: keep the dense tensor in the constructor and "
        "convert it after materializing (materialize_module, then .to_sparse())"
    )


def test_gradients_left_on_parameters_are_materialized_with_them(restore_rng):
    def probes_backward() -> nn.Module:
        module = nn.Linear(3, 2)
        module(torch.randn(4, 3)).pow(2).sum().backward()  # a warm-up backward in the constructor
        return module

    torch.manual_seed(0)
    eager = probes_backward()
    torch.manual_seed(0)
    model = materialize_module(deferred_init(probes_backward))
    assert torch.equal(model.weight.grad, eager.weight.grad) and torch.equal(model.bias.grad, eager.bias.grad)
    tagged = deferred_init(nn.Linear, 2, 2)
    tagged.weight.grad = torch.ones(2, 2)  # a real gradient set on the deferred parameter
    assert torch.equal(materialize_module(tagged).weight.grad, torch.ones(2, 2))


class _ComplexNorms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        a = torch.randn(2, 3, dtype=torch.complex64)
        self.register_buffer("vector", torch.linalg.vector_norm(a, dim=1))
        self.register_buffer("normalized", nn.functional.normalize(a, dim=1))
        self.register_buffer("whole", torch.norm(a))


@pytest.mark.parametrize("default_at_replay", [torch.float32, torch.float64])
def test_norms_of_complex_tensors_replay_in_their_complex_dtype(default_at_replay, restore_rng):
    torch.manual_seed(0)
    eager = _ComplexNorms()
    torch.manual_seed(0)
    model = deferred_init(_ComplexNorms)
    with default_dtype_set(default_at_replay):
        materialize_module(model)
    for name, tensor in eager.state_dict().items():
        assert model.state_dict()[name].dtype == tensor.dtype, name
        assert torch.equal(model.state_dict()[name], tensor), name


class _ScatterIntoOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        x, src, out = torch.randn(4, 3), torch.randn(2, 3), torch.zeros(0)
        torch.slice_scatter(x, src, 0, 0, 2, 1, out=out)  # FakeTensorMode's kernel returns x here
        self.register_buffer("x", x)
        self.register_buffer("out", out)


def test_an_out_argument_is_what_the_op_returns_as_its_schema_says(restore_rng):
    torch.manual_seed(0)
    eager = _ScatterIntoOut()
    torch.manual_seed(0)
    model = materialize_module(deferred_init(_ScatterIntoOut))
    assert torch.equal(model.x, eager.x) and torch.equal(model.out, eager.out)
    assert model.x.untyped_storage().data_ptr() != model.out.untyped_storage().data_ptr()


class _NotPositiveDefinite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("factor", torch.linalg.cholesky(-torch.eye(3)))


def test_a_value_check_eager_raises_in_the_constructor_is_replayed_and_raises_at_materialization():
    with pytest.raises(RuntimeError, match="not positive-definite"):
        _NotPositiveDefinite()
    model = deferred_init(_NotPositiveDefinite)  # no values while recording: nothing to check yet
    with pytest.raises(
        MaterializationError,
        match=r"^replaying aten\._linalg_check_errors\.default \(recorded at .*test_recording\.py:\d+ in __init__\) "
        r"for 'factor' failed: _LinAlgError: linalg\.cholesky: .* not positive-definite",
    ):
        materialize_module(model)
    assert is_deferred(model.factor)


@pytest.mark.parametrize("op", ["atan2_", "clamp_min_", "add_", "copysign_", "eq_", "heaviside_"])
def test_an_in_place_op_whose_other_operand_would_grow_self_is_refused_as_eager_refuses_it(op):
    def build() -> nn.Module:
        module = nn.Module()
        module.register_buffer("x", getattr(torch.randn(10, 1, 5), op)(torch.randn(10, 10, 5)))
        return module

    with pytest.raises(RuntimeError, match=r"output with shape \[10, 1, 5\] doesn't match the broadcast shape"):
        build()
    with pytest.raises(DeferredInitError) as caught:
        deferred_init(build)
    assert re.match(rf"aten\.{op}\.\w+ failed under deferred_init", str(caught.value))
    assert "RuntimeError: output with shape [10, 1, 5] doesn't match the broadcast shape [10, 10, 5]" in str(caught.value)


_UNCASTABLE_WRITES = {
    "an integer tensor times a float": (torch.long, lambda b: b.mul_(1.5), "Float", "Long"),
    "an integer tensor's logit": (torch.long, lambda b: b.logit_(), "Float", "Long"),
    "a bool tensor plus a float tensor": (torch.bool, lambda b: b.add_(torch.ones(3)), "Float", "Bool"),
    "a float tensor times a complex number": (torch.float32, lambda b: b.mul_(1j), "ComplexFloat", "Float"),
}


@pytest.mark.parametrize("case", list(_UNCASTABLE_WRITES))
def test_an_in_place_op_whose_result_cannot_be_cast_to_self_is_refused_while_recording(case):
    dtype, write, result, output = _UNCASTABLE_WRITES[case]

    def build() -> nn.Module:
        module = nn.Module()
        module.register_buffer("b", torch.ones(3, dtype=dtype))
        write(module.b)
        return module

    message = f"result type {result} can't be cast to the desired output type {output}"
    with pytest.raises(RuntimeError, match=re.escape(message)):
        build()  # eager's own words
    with pytest.raises(DeferredInitError) as caught:
        deferred_init(build)
    assert f"RuntimeError: {message}" in str(caught.value)
    assert "test_recording.py" in str(caught.value)  # the line that wrote, not a later materialization


def test_an_in_place_op_whose_result_casts_to_self_is_recorded_as_eager_runs_it():
    def build() -> nn.Module:
        module = nn.Module()
        module.register_buffer("counts", torch.arange(4).add_(2).mul_(3))  # integer results stay integer
        module.register_buffer("halves", torch.ones(4, dtype=torch.half).add_(torch.ones(4)))  # same kind
        return module

    eager, model = build(), deferred_init(build)
    materialize_module(model)
    for name, tensor in eager.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor) and model.state_dict()[name].dtype == tensor.dtype


def test_a_meta_kernel_that_fails_while_recording_logs_no_traceback(caplog):
    def build() -> nn.Module:
        module = nn.Module()
        module.register_buffer("b", torch.arange(3))
        module.b.div_(2)  # int / int is a float: the meta kernel refuses, and FakeTensorMode would log it
        return module

    with caplog.at_level(logging.DEBUG), pytest.raises(DeferredInitError, match=r"aten\.div_\.Tensor failed under"):
        deferred_init(build)
    assert [record.getMessage() for record in caplog.records] == []


class _IntoEmptyOut(nn.Module):
    """out= calls whose CPU kernel lays the result out column-major where the fake kernel does not."""

    def __init__(self) -> None:
        super().__init__()
        a = torch.randn(4, 4, dtype=torch.complex64)
        inverse = torch.zeros(0, dtype=torch.complex64)
        torch.cholesky_inverse(torch.linalg.cholesky(a @ a.mH + torch.eye(4)), out=inverse)
        transform = torch.zeros(0, dtype=torch.complex64)
        torch.fft.ifft(torch.randn(2, 3, 4), n=5, dim=1, out=transform)
        q = torch.zeros(0)
        torch.linalg.qr(torch.randn(3, 3), out=(q, torch.zeros(0)))
        self.register_buffer("inverse", inverse)
        self.register_buffer("transform", transform)
        self.register_buffer("scaled", transform * 2)  # read through the recorded layout
        self.register_buffer("q_in_memory_order", q.as_strided((9,), (1,)) * 1)


def test_a_resized_out_argument_takes_the_layout_and_values_of_eagers_kernel(restore_rng):
    torch.manual_seed(0)
    eager = _IntoEmptyOut()
    torch.manual_seed(0)
    model = deferred_init(_IntoEmptyOut)
    assert {n: t.stride() for n, t in model.named_buffers()} == {n: t.stride() for n, t in eager.named_buffers()}
    materialize_module(model)
    for name, tensor in eager.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
        assert model.state_dict()[name].stride() == tensor.stride(), name


class _RandomAndFullOuts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        picked = torch.zeros(0, dtype=torch.long)
        torch.multinomial(torch.rand(3, 10), 3, out=picked)  # a random op into an empty out
        own = torch.Generator().manual_seed(1)
        drawn = torch.zeros(0)
        torch.rand(3, generator=own, out=drawn)
        solved = torch.full((2, 5, 3), 7.0)  # already the result's shape: the CPU kernel keeps its strides
        torch.linalg.solve(torch.randn(2, 5, 5), torch.randn(2, 5, 3), out=solved)
        self.register_buffer("picked", picked)
        self.register_buffer("drawn", drawn)
        self.register_buffer("later", torch.rand(3, generator=own))
        self.register_buffer("solved", solved)
        self.register_buffer("after", torch.rand(2))


def test_out_arguments_of_random_ops_and_of_the_right_shape_replay_as_eager(restore_rng):
    torch.manual_seed(0)
    eager = _RandomAndFullOuts()
    torch.manual_seed(0)
    model = deferred_init(_RandomAndFullOuts)  # refused before: a probe run of multinomial drew for real
    materialize_module(model)
    for name, tensor in eager.state_dict().items():  # "later" and "after": no draw taken twice
        assert torch.equal(model.state_dict()[name], tensor), name
        assert model.state_dict()[name].stride() == tensor.stride(), name
