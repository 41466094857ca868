"""to_fx: the recorded initialization as an FX GraphModule computing what materialize_module does.

Each program's output is compared bit for bit (values, dtype, shape, stride, tie groups) with
`materialize_module` on a second deferred copy built from the same seed (materialization itself
is compared with eager construction by the engine's tests).
"""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.testing._internal.common_modules import module_db

from explorer import InitProgram, MaterializationError, deferred_init, is_deferred, materialize_module, to_fx
from explorer.analysis.fx_export import rng_seek, rng_tell
from tests.support.hf_configs import HF_BY_NAME

MODULE_DB = {info.name: info for info in module_db}
MODULE_DB_SAMPLE = [
    "nn.Linear", "nn.Bilinear", "nn.Conv2d", "nn.ConvTranspose3d", "nn.BatchNorm2d", "nn.GroupNorm", "nn.Embedding",
    "nn.LSTM", "nn.GRUCell", "nn.MultiheadAttention", "nn.TransformerEncoderLayer", "nn.PReLU",
]


def build_twice(module_fn, *args, **kwargs) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    first = deferred_init(module_fn, *args, **kwargs)
    torch.manual_seed(0)
    second = deferred_init(module_fn, *args, **kwargs)
    return first, second


def slots(module: nn.Module) -> dict[str, torch.Tensor]:
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    return named


def assert_same_as_materialized(program: fx.GraphModule, reference: nn.Module) -> dict[str, torch.Tensor]:
    rng = torch.get_rng_state()
    out = program()
    assert torch.equal(torch.get_rng_state(), rng), "the program changed the global RNG"
    materialize_module(reference)
    expected = slots(reference)
    assert sorted(out) == sorted(expected)
    for name, tensor in out.items():
        want = expected[name]
        assert type(tensor) is torch.Tensor, name
        assert (tensor.dtype, tensor.shape, tensor.stride(), tensor.device) == (
            want.dtype, want.shape, want.stride(), want.device), name
        assert torch.equal(tensor, want), name
    groups = {}
    for name, tensor in expected.items():
        groups.setdefault(id(tensor), []).append(name)
    for names in groups.values():
        assert all(out[name] is out[names[0]] for name in names), names  # ties stay one tensor
    return out


@pytest.mark.parametrize("arch_name", ["llama", "qwen2", "t5", "swin", "mamba"])
def test_program_equals_materialize_module_on_transformers(arch_name):
    arch = HF_BY_NAME[arch_name]
    module, reference = build_twice(arch.cls, arch.config())
    program = to_fx(module)
    assert isinstance(program, InitProgram)
    out = assert_same_as_materialized(program, reference)
    again = program()  # a second call starts from the recorded RNG state again
    assert all(torch.equal(again[name], tensor) for name, tensor in out.items())
    assert is_deferred(module)  # exporting and running changed nothing: it still materializes the same
    materialize_module(module)
    assert all(torch.equal(tensor, out[name]) for name, tensor in slots(module).items())


@pytest.mark.parametrize("name", MODULE_DB_SAMPLE)
def test_program_equals_materialize_module_on_module_db(name):
    info = MODULE_DB[name]
    sample = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=False, training=True)[0]
    module, reference = build_twice(info.module_cls, *sample.constructor_input.args, **sample.constructor_input.kwargs)
    assert_same_as_materialized(to_fx(module), reference)


def test_nodes_carry_fake_values_matching_what_runs():
    arch = HF_BY_NAME["llama"]
    torch.manual_seed(0)
    program = to_fx(deferred_init(arch.cls, arch.config()))
    seen: dict[fx.Node, object] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, node):
            seen[node] = value = super().run_node(node)
            return value

    Recorder(program).run()  # an Interpreter, not program(): the RNG nodes work on their own
    checked = 0
    for node, value in seen.items():
        if isinstance(value, torch.Tensor):
            fake = node.meta["val"]
            assert isinstance(fake, torch._subclasses.FakeTensor), node
            assert (fake.shape, fake.stride(), fake.storage_offset(), fake.dtype, fake.device) == (
                value.shape, value.stride(), value.storage_offset(), value.dtype, value.device), node
            checked += 1
    assert checked == sum(1 for n in program.graph.nodes if n.op in ("call_function", "get_attr")
                          and isinstance(n.meta.get("val"), torch.Tensor))
    assert checked > 50


def test_nodes_are_aten_ops_with_constructor_stack_traces():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.randn(3) * 2)

    torch.manual_seed(0)
    program = to_fx(deferred_init(Net))
    calls = [n for n in program.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls] == [
        rng_seek, torch.ops.aten.randn.default, rng_tell, torch.ops.aten.mul.Tensor, torch.ops.aten.detach.default,
    ]
    assert calls[0].args[1:] == ("cpu", 0)
    assert calls[2].args[1:] == ("cpu", 0, calls[1])  # rng_tell sees what was drawn
    randn = calls[1]
    assert randn.meta["stack_trace"].endswith("self.scale = nn.Parameter(torch.randn(3) * 2)\n")
    torch.manual_seed(0)
    assert torch.equal(program()["scale"], torch.randn(3) * 2)


def test_fake_tensor_propagation_leaves_the_program_correct():
    arch = HF_BY_NAME["llama"]
    module, reference = build_twice(arch.cls, arch.config())
    program = to_fx(module)
    rng = torch.get_rng_state()
    FakeTensorProp(program, FakeTensorMode(allow_non_fake_inputs=True)).propagate()  # draws nothing
    assert torch.equal(torch.get_rng_state(), rng)
    assert_same_as_materialized(program, reference)


class DrawsRanges(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ids = nn.Buffer(torch.empty(6, 3, dtype=torch.int64).random_(-3, 50))  # aten.random_.from
        self.low = nn.Buffer(torch.empty(4, dtype=torch.int32).random_(7, None))


def test_an_overload_named_by_a_python_keyword_is_exported_as_code_that_runs():
    module, reference = build_twice(DrawsRanges)
    program = to_fx(module)
    assert "call_overload('aten.random_.from'" in program.code
    assert_same_as_materialized(program, reference)
    torch.manual_seed(0)
    assert torch.equal(program()["ids"], DrawsRanges().ids)


def test_dead_code_elimination_keeps_the_program_correct():
    arch = HF_BY_NAME["gpt2"]
    module, reference = build_twice(arch.cls, arch.config())
    program = to_fx(module)
    program.graph.eliminate_dead_code()  # random and in-place nodes are side effects: they stay
    program.graph.lint()
    program.recompile()
    assert_same_as_materialized(program, reference)


def test_partly_materialized_module_exports_what_is_left():
    arch = HF_BY_NAME["llama"]
    module, reference = build_twice(arch.cls, arch.config())
    materialize_module(module.model.layers[0])
    out = to_fx(module)()
    assert not any(name.startswith("model.layers.0.") for name in out)
    materialize_module(reference)
    expected = slots(reference)
    assert set(out) == {name for name in expected if not name.startswith("model.layers.0.")}
    for name, tensor in out.items():
        assert torch.equal(tensor, expected[name]), name


def test_module_without_deferred_tensors_exports_an_empty_program():
    assert to_fx(nn.Linear(2, 2))() == {}


def test_lazy_parameter_is_refused():
    with pytest.raises(MaterializationError, match=r"^'weight' is an uninitialized lazy parameter"):
        to_fx(deferred_init(nn.LazyLinear, 3))


def test_two_recordings_are_refused():
    model = nn.Sequential(deferred_init(nn.Linear, 2, 2), deferred_init(nn.Linear, 2, 2))
    with pytest.raises(MaterializationError) as error:
        to_fx(model)
    assert str(error.value) == (
        "to_fx exports one recorded initialization, but the tensors of this Sequential come from 2 "
        "deferred_init calls; export its submodules one at a time"
    )


def test_getitem_nodes_split_multi_output_ops():
    class Halves(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            first, second = torch.arange(6.0).chunk(2)
            self.register_buffer("first", first.clone())
            self.register_buffer("second", second * 10)

    module, reference = build_twice(Halves)
    program = to_fx(module)
    getitems = [n for n in program.graph.nodes if n.target is operator.getitem]
    assert [n.args[1] for n in getitems] == [0, 1]
    out = assert_same_as_materialized(program, reference)
    assert torch.equal(out["second"], torch.tensor([30.0, 40.0, 50.0]))


class _SharedSubmodule(nn.Module):
    """One embedding module at two paths, as transformers 4's T5 puts `shared` at `encoder.embed_tokens`."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Embedding(10, 4)
        self.encoder = nn.Sequential(nn.Linear(4, 4))
        self.encoder.embed_tokens = self.shared
        self.head = nn.Linear(4, 2)


def test_a_submodule_at_two_paths_is_named_at_both_as_state_dict_names_it():
    module, reference = build_twice(_SharedSubmodule)
    out = assert_same_as_materialized(to_fx(module), reference)
    assert "encoder.embed_tokens.weight" in out and out["encoder.embed_tokens.weight"] is out["shared.weight"]
    assert sorted(out) == sorted(reference.state_dict())


def test_a_model_recorded_on_an_absent_device_is_refused_without_advice_to_fx_cannot_take():
    # before: replay's "pass device= (e.g. device='cpu')", an argument to_fx does not have
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA: this one could export it")  # CI has none

    def on_cuda() -> nn.Module:
        with torch.device("cuda"):
            return nn.Linear(4, 4)

    with pytest.raises(MaterializationError) as error:
        to_fx(deferred_init(on_cuda))
    assert str(error.value) == (
        "to_fx exports the initialization on the devices it was recorded on: 'weight' was recorded on cuda:0, "
        "but device cuda:0 is not available (this machine has 0 CUDA devices). Export on a machine that has it, "
        "or record the model on the CPU"
    )

    def cpu_from_a_cuda_draw() -> nn.Module:
        module = nn.Module()
        module.w = nn.Parameter(torch.randn(4, device="cuda").cpu())  # the parameter is on the CPU
        return module

    with pytest.raises(MaterializationError) as error:  # before: replay's advice of rng="fast"
        to_fx(deferred_init(cpu_from_a_cuda_draw))
    assert str(error.value).startswith(
        "to_fx exports the initialization on the devices it was recorded on: aten.randn.default (recorded at "
    )
    assert "made a tensor on cuda:0, which the exported tensors are computed from, but device cuda:0" in str(error.value)


def test_program_runs_integer_promotions_under_the_default_dtype_they_were_recorded_under():
    from tests.explorer.record.test_recording import PromotesIntegersUnderHalfDefault

    module, reference = build_twice(PromotesIntegersUnderHalfDefault)
    program = to_fx(module)
    assert "under_default_dtype" in program.code
    out = assert_same_as_materialized(program, reference)
    assert out["divided"].dtype == torch.float16 and out["after"].dtype == torch.float32


def test_program_of_a_model_deferred_right_after_another_equals_eager(restore_rng):
    torch.manual_seed(0)
    deferred_init(nn.Linear, 3, 3)
    second = deferred_init(nn.Linear, 3, 3)  # its generator continues the first recording
    out = to_fx(second)()
    torch.manual_seed(0)
    nn.Linear(3, 3)
    eager = nn.Linear(3, 3)
    assert torch.equal(out["weight"], eager.weight) and torch.equal(out["bias"], eager.bias)


class _ConstantsModesAndDefaults(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import numpy as np

        self.register_buffer("transposed", torch.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4).T))
        self.register_buffer("flat", self.transposed.as_strided((12,), (1,)) * 1)  # reads memory order
        self.register_buffer("third", torch.arange(4) / 3)  # takes the default dtype
        with torch.inference_mode():
            self.register_buffer("frozen", torch.ones(3) * 2)


def test_program_keeps_constant_layouts_inference_mode_and_the_recorded_default_dtype():
    eager = _ConstantsModesAndDefaults()
    model = deferred_init(_ConstantsModesAndDefaults)
    program = to_fx(model)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the caller's default: not the one the model was recorded under
    try:
        out = program()
    finally:
        torch.set_default_dtype(before)
    for name, tensor in eager.state_dict().items():
        assert (out[name].dtype, out[name].stride(), out[name].is_inference()) == (
            tensor.dtype, tensor.stride(), tensor.is_inference()
        ), name  # fmt: skip
        assert torch.equal(out[name], tensor), name


class _DoublesItsInput(nn.Module):
    def __init__(self, given: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(given * 2)


def test_a_program_refuses_inputs_changed_since_export_as_materialize_module_does(tmp_path):
    import time

    from safetensors.torch import save_file

    from explorer import load_checkpoint

    path = tmp_path / "m.safetensors"
    save_file({"weight": torch.ones(2, 2), "bias": torch.ones(2)}, path)
    model = deferred_init(nn.Linear, 2, 2)
    load_checkpoint(model, path)
    program = to_fx(model)
    assert torch.equal(program()["weight"], torch.ones(2, 2))
    time.sleep(0.01)
    save_file({"weight": torch.full((2, 2), 7.0), "bias": torch.ones(2)}, path)
    with pytest.raises(MaterializationError, match=r"m\.safetensors changed since it was recorded"):
        program()
    given = torch.arange(4.0)
    program = to_fx(deferred_init(_DoublesItsInput, given))
    given.add_(100)
    with pytest.raises(MaterializationError, match="modified in place after deferred_init"):
        program()
