"""explorer._torch_compat: the one place that knows the running torch (note [The compat boundary]
in tests/test_layout.py). What every release must give: the same fakes, the same devices, a warning
(never a refusal) outside the tested releases."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

from explorer import MaterializationError, deferred_init, materialize_module
from explorer._torch_compat import (
    TESTED_RANGE,
    UntestedTorchWarning,
    is_tested_release,
    torch_release,
    warn_if_untested,
)
from explorer._torch_compat.devices import allow_fake_cuda
from explorer._torch_compat.dispatch import disable_torch_dispatch, storage_id
from explorer._torch_compat.fake import FakeTemplate, FakeTensor, FakeTensorMode, fake_device_key, fake_device_of
from explorer._torch_compat.generators import cuda_state, cuda_state_fields, same_generator
from explorer.record.fake import DeferredTensor


@pytest.mark.parametrize(
    "version,release",
    [("2.11.0+cu130", (2, 11)), ("2.15.0", (2, 15)), ("2.16.0.dev20261120", (2, 16)), ("10.2.1a0", (10, 2))],
)
def test_torch_release_reads_major_and_minor(version: str, release: tuple[int, int]) -> None:
    assert torch_release(version) == release


def test_torch_release_names_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="cannot read a torch release from 'nightly'"):
        torch_release("nightly")


@pytest.mark.parametrize("version", ["2.11.0", "2.12.1", "2.13.0+cpu", "2.14.1", "2.15.0+cu132"])
def test_the_tested_releases_give_no_warning(version: str) -> None:
    assert is_tested_release(version)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_untested(version) is False


@pytest.mark.parametrize("version", ["2.10.1", "2.16.0", "3.0.0"])
def test_a_release_outside_the_range_warns_and_names_the_range(version: str) -> None:
    with pytest.warns(UntestedTorchWarning) as caught:
        assert warn_if_untested(version) is True
    assert str(caught[0].message) == (
        f"deferred-explorer is tested with {TESTED_RANGE} (2.11 to 2.15); this is torch {version}. "
        "It may work; if something fails, the error names the torch feature it needed."
    )


def test_importing_under_an_untested_torch_warns_and_still_imports() -> None:
    program = (
        "import warnings, torch\n"
        "torch.__version__ = '2.16.0'\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import explorer\n"
        "print([str(w.message).split(';')[0] for w in caught if w.category.__name__ == 'UntestedTorchWarning'])\n"
        "print(explorer.deferred_init is not None)\n"
    )
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == [f"['deferred-explorer is tested with {TESTED_RANGE} (2.11 to 2.15)']", "True"]


def test_the_running_torch_is_a_tested_release() -> None:
    # make test and make test-torch run only on tested releases; a new one must be added on purpose.
    assert is_tested_release(), torch.__version__


def _normal_fake(mode: FakeTensorMode, device: str) -> FakeTensor:
    with mode:
        return torch.empty(3, 4, device=device)


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_fake_device_of_reads_the_device_fake_mode_gave(device: str) -> None:
    mode = FakeTensorMode()
    fake = _normal_fake(mode, device)
    assert fake_device_of(fake) == fake.fake_device == fake.device
    assert fake_device_key() in (None, "fake_device", "_fake_device")


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
@pytest.mark.parametrize("use_template", [True, False], ids=["template", "new"])
def test_fakes_made_by_the_template_equal_fake_modes_own(device: str, use_template: bool) -> None:
    mode = FakeTensorMode()
    template = FakeTemplate(mode, DeferredTensor)
    if not use_template:  # the fallback a release without instance attributes gets
        template.for_device(torch.device(device))
        normalized, _ = template.devices[torch.device(device)]
        template.devices[torch.device(device)] = (normalized, None)
    with disable_torch_dispatch():
        made = template(torch.empty(3, 4, device="meta"), torch.device(device), requires_grad=True)
    reference = _normal_fake(mode, device)
    assert type(made) is DeferredTensor
    assert (made.shape, made.stride(), made.dtype, made.requires_grad) == ((3, 4), (4, 1), torch.float32, True)
    assert made.fake_mode is mode
    assert fake_device_of(made) == made.device == reference.device
    assert storage_id(made) != storage_id(reference)


class _OnCuda(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 3, device="cuda"))  # a random op on a CUDA fake
        self.register_buffer("scale", torch.ones(3, device="cuda").mul_(2))


def test_a_model_recorded_on_cuda_without_a_gpu_reports_cuda_and_refuses_eager_draws_clearly() -> None:
    # `torch.randn(..., device="cuda")` in a constructor: the fakes of torch 2.11 broke it (issue 32).
    module = deferred_init(_OnCuda)
    assert [(name, t.device, tuple(t.shape)) for name, t in module.state_dict().items()] == [
        ("weight", torch.device("cuda:0"), (4, 3)),
        ("scale", torch.device("cuda:0"), (3,)),
    ]
    with pytest.raises(MaterializationError, match=r"rng='eager' draws aten.randn.default \(at .*test_torch_compat"):
        materialize_module(module, device="cpu")
    assert all(isinstance(t, FakeTensor) for t in module.state_dict().values())  # left as it was
    materialize_module(module, device="cpu", rng="fast")
    assert module.scale.equal(torch.full((3,), 2.0))
    assert module.weight.device == torch.device("cpu") and module.weight.shape == (4, 3)


def _timm_on_cuda(name: str) -> torch.nn.Module:
    import timm

    with torch.device("cuda"):
        return timm.create_model(name, pretrained=False)


def _recorded_like_eager(name: str) -> None:
    import timm

    eager = timm.create_model(name, pretrained=False)
    module = deferred_init(_timm_on_cuda, name)
    recorded = {key: (tuple(t.shape), t.dtype, t.device) for key, t in module.state_dict().items()}
    assert recorded == {key: (tuple(t.shape), t.dtype, torch.device("cuda:0")) for key, t in eager.state_dict().items()}


@pytest.mark.parametrize(
    "name", ["vit_small_patch16_224", "convnext_atto", "resnet18", "levit_128s", "test_coatnet", "test_nfnet"]
)
def test_timm_models_record_on_cuda_fakes_with_eagers_names_and_shapes(name: str) -> None:
    # On torch 2.11 ViT and ConvNeXt failed to record on CUDA (trunc_normal_ on a CUDA fake); on a
    # CPU-only torch the last three did (a guarded binding: note [Fake CUDA on a build without CUDA]).
    _recorded_like_eager(name)


@pytest.mark.parametrize("name", ["bert", "mamba", "mixtral", "DiTTransformer2DModel", "PriorTransformer"])
def test_transformers_and_diffusers_models_record_under_torch_device_cuda(name: str) -> None:
    # Each failed on a CPU-only torch before note [Fake CUDA on a build without CUDA].
    from tests.support.diffusers_configs import DIFFUSERS_MODELS
    from tests.support.hf_configs import HF_ARCHITECTURES

    builders = {a.name: (lambda a=a: a.cls(a.config())) for a in HF_ARCHITECTURES}
    builders |= {m.name: m.build for m in DIFFUSERS_MODELS}
    build = builders[name]

    def on_cuda() -> torch.nn.Module:
        with torch.device("cuda"):
            return build()

    module = deferred_init(on_cuda)
    recorded = {key: (tuple(t.shape), t.dtype, t.device) for key, t in module.state_dict().items()}
    eager = build().state_dict()
    assert recorded == {key: (tuple(t.shape), t.dtype, torch.device("cuda:0")) for key, t in eager.items()}
    materialize_module(module, device={"cuda": "cpu"}, rng="fast")
    assert {t.device for t in module.state_dict().values()} == {torch.device("cpu")}


def test_swin_records_on_cuda_fakes_on_every_build_of_torch() -> None:
    # Swin indexes a CUDA tensor in its constructor; PyTorch's indexing takes a CUDA device guard,
    # which a CPU-only build (make test's wheel) lacks: note [Fake CUDA on a build without CUDA].
    _recorded_like_eager("swin_tiny_patch4_window7_224")


def test_fake_cuda_is_allowed_on_every_tested_build() -> None:
    assert allow_fake_cuda() is True


class _GuardedBindings(torch.nn.Module):
    """Each line calls a binding that guards its tensor's device before dispatch; every value is
    set by these ops (the embedding's random init is overwritten)."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(5, 3, padding_idx=0, device=device)  # weight[0].fill_(0)
        self.register_buffer("ramp", torch.empty(2, 3, device=device))
        self.register_buffer("picked", torch.empty(2, device=device))
        with torch.no_grad():
            self.table.weight.copy_(torch.arange(15.0, device=device).reshape(5, 3))  # Tensor.copy_
            self.table.weight[1:3] = self.table.weight[3:5] * 2  # __setitem__, __getitem__
            self.ramp.copy_(torch.arange(6.0, device=device).reshape(3, 2).t().contiguous())
            self.picked.copy_(self.ramp[torch.tensor([1, 0], device=device), 2])  # index with a tensor
            self.picked[0] = 7.0
        self.cast = torch.nn.Parameter(self.ramp.to(device.split(":")[0], torch.float16))  # no index
        self.count = self.ramp.nonzero().shape[0]


def test_bindings_that_guard_the_device_accept_cuda_fakes_and_replay_like_eager() -> None:
    # Recorded on cuda:0 with no GPU (on make test's CPU-only torch too), materialized onto the CPU:
    # every value is set by the ops above, so it must equal the CPU construction bit for bit.
    module = deferred_init(_GuardedBindings, "cuda")
    assert {name: t.device for name, t in module.state_dict().items()} == dict.fromkeys(
        ["cast", "ramp", "picked", "table.weight"], torch.device("cuda:0")
    )
    assert (module.cast.dtype, module.count) == (torch.float16, 5)
    materialize_module(module, device={"cuda": "cpu"}, rng="fast")
    eager = _GuardedBindings("cpu")
    for name, tensor in eager.state_dict().items():
        assert module.state_dict()[name].equal(tensor), name
    assert module.table.weight[:, 0].tolist() == [0.0, 18.0, 24.0, 9.0, 12.0]
    assert module.picked.tolist() == [7.0, 4.0]


def test_a_hugging_face_model_records_under_torch_device_cuda() -> None:
    # Its init pass copies the rotary frequencies into a buffer (`Tensor.copy_`): that stopped a
    # recording on cuda on a CPU-only torch before.
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64)

    def build() -> torch.nn.Module:
        with torch.device("cuda"):
            return LlamaForCausalLM(config)

    module = deferred_init(build)
    eager = LlamaForCausalLM(config)
    assert {name: (t.device, tuple(t.shape)) for name, t in module.state_dict().items()} == {
        name: (torch.device("cuda:0"), tuple(t.shape)) for name, t in eager.state_dict().items()
    }
    materialize_module(module.model.rotary_emb, device={"cuda": "cpu"})  # no random op: eager values
    assert module.model.rotary_emb.inv_freq.equal(eager.model.rotary_emb.inv_freq)


def test_cuda_states_are_seed_then_offset_as_an_h100_with_torch_211_gave_them() -> None:
    # torch.cuda.manual_seed(1234), then a 5-element normal_ (note [CUDA generator state layout])
    seen = [210, 4, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]
    assert cuda_state(1234, 4).tolist() == seen
    assert cuda_state_fields(torch.tensor(seen, dtype=torch.uint8)) == (1234, 4)
    assert cuda_state_fields(cuda_state(2**64 - 1, 2**40)) == (2**64 - 1, 2**40)  # seeds use all 64 bits


@pytest.mark.skipif(not torch.cuda.is_available(), reason="reads a real CUDA generator")
def test_the_real_cuda_generator_state_has_that_layout() -> None:
    generator = torch.Generator(device="cuda")
    generator.manual_seed(1234)
    torch.empty(5, device="cuda").normal_(generator=generator)
    assert cuda_state_fields(generator.get_state()) == (1234, 4)


def test_same_generator_tells_the_default_generator_from_a_new_one_through_the_dispatcher() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    own = torch.Generator().manual_seed(3)
    seen: list[torch.Generator] = []

    class Collect(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            if kwargs and "generator" in kwargs:
                seen.append(kwargs["generator"])
            return func(*args, **(kwargs or {}))

    with Collect():
        torch.empty(3).normal_(generator=torch.default_generator)
        torch.empty(3).normal_(generator=own)
    default_seen, own_seen = seen
    assert default_seen is not torch.default_generator and own_seen is not own  # new wrappers
    assert same_generator(default_seen, torch.default_generator) and same_generator(own_seen, own)
    assert not same_generator(own_seen, torch.default_generator)
    assert not same_generator(own, torch.Generator().manual_seed(3))


def test_a_state_of_another_size_is_refused_with_the_note_to_update() -> None:
    with pytest.raises(ValueError, match=r"24 torch.uint8 values, expected 16 uint8 .*CUDA generator state layout"):
        cuda_state_fields(torch.zeros(24, dtype=torch.uint8))


def _sharded_adamw_step_peak() -> int:
    """The peak MemTracker sees over one AdamW step of two fake linears TP-sharded over one fake rank."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from explorer._torch_compat.fake import unset_fake_temporarily
    from explorer.analysis.fake_fsdp import fake_process_group
    from explorer.analysis.train_twin import fake_twin

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    twin = fake_twin(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)), mode)
    with fake_process_group(1) as mesh:
        with unset_fake_temporarily():
            parallelize_module(twin, mesh, {"0": ColwiseParallel(), "1": ColwiseParallel()})
        with mode:
            x = mode.from_tensor(torch.ones(4, 32))
            optimizer = torch.optim.AdamW(twin.parameters())
            tracker = MemTracker()
            tracker.track_external(twin, optimizer, x)
            with tracker:
                loss = twin(x).sum()
                loss.backward()
                optimizer.step()
    return max(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values())


def test_a_function_never_traced_by_dynamo_runs_as_plain_python_under_torch_compile(tmp_path) -> None:
    # in a process of its own: dynamo, once used, patches nn.Module.__init__ for good
    script = tmp_path / "untraced.py"
    script.write_text(
        "import torch\n"
        "from explorer._torch_compat.dispatch import never_traced_by_dynamo\n"
        "compiling = []\n"
        "@never_traced_by_dynamo\n"
        "def untraced(x):\n"
        "    compiling.append(torch.compiler.is_compiling())\n"
        "    return x + 1\n"
        "out = torch.compile(lambda x: untraced(x) * 2, backend='eager')(torch.ones(2))\n"
        "print(out.tolist(), compiling)\n"  # traced, it would have run (and appended True) under dynamo
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[4.0, 4.0] [False]"


def test_dtensor_meta_propagation_is_hidden_from_a_tracker_under_our_fake_mode() -> None:
    """note [DTensor's meta propagation under our fake mode]: DTensor's global-shape fakes are not
    counted, so the fake step peaks at 84,244 bytes, what MemTracker gives the eager step, plain or
    sharded over one gloo rank (16,128 more before: two 64 × 32 weights' worth of fakes)."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    from explorer._torch_compat.distributed import dtensor_meta_propagation_hidden

    original = ShardingPropagator._propagate_tensor_meta_non_cached
    with dtensor_meta_propagation_hidden():
        assert ShardingPropagator._propagate_tensor_meta_non_cached is not original
    assert ShardingPropagator._propagate_tensor_meta_non_cached is original
    assert _sharded_adamw_step_peak() == 84244
def test_a_pipeline_root_may_run_forward_once_per_microbatch_under_the_pipeline_tracker() -> None:
    from torch.distributed._tools.mem_tracker import MemTracker

    from explorer._torch_compat.memory_tracker import PipelineMemTracker

    model = torch.nn.Linear(4, 4)
    with pytest.raises(NotImplementedError, match="multiple iterative calls"), MemTracker():
        model(torch.ones(1, 4))
        model(torch.ones(1, 4))
    tracker, microbatch = PipelineMemTracker(), torch.ones(1, 4)  # made outside: not tracked
    with tracker:
        kept = [model(microbatch) for _ in range(2)]  # two microbatches' outputs, 16 bytes each
    assert tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Activation"] == 2 * 16 and len(kept) == 2


def test_an_fsdp_pipeline_root_may_run_forward_once_per_microbatch_under_the_fsdp_pipeline_tracker() -> None:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import fully_shard

    from explorer._torch_compat.memory_tracker import FSDPPipelineMemTracker
    from explorer.analysis.fake_fsdp import fake_process_group

    with fake_process_group(2) as mesh:
        model, microbatch = fully_shard(torch.nn.Linear(4, 4), mesh=mesh), torch.ones(1, 4)
        with pytest.raises(NotImplementedError, match="multiple iterative calls"), FSDPMemTracker(model):
            model(microbatch)
            model(microbatch)
        tracker = FSDPPipelineMemTracker([model])
        with tracker:
            kept = [model(microbatch) for _ in range(2)]  # two microbatches' outputs, 16 bytes each
            alive = tracker.get_tracker_snapshot("current")[torch.device("cpu")]
    assert {key.value: alive[key] for key in alive if key != "Total" and alive[key]} == {
        "Sharded Param": 40, "Unsharded Param": 80, "Activation": 2 * 16,  # 4 × 4 + 4 floats, halved
    } and len(kept) == 2  # fmt: skip


def test_a_locally_voted_stage_runs_pytorchs_1f1b_as_rank_1_of_a_fake_group_on_fakes() -> None:
    from torch.distributed.pipelining import Schedule1F1B

    from explorer._torch_compat.pipelining import LocallyVotedStage
    from explorer.analysis.fake_fsdp import fake_process_group

    with fake_process_group(2, rank=1), FakeTensorMode():
        model = torch.nn.Linear(4, 4)
        example = torch.empty(2, 4, requires_grad=True)
        stage = LocallyVotedStage(model, 1, 2, torch.device("cpu"), input_args=(example,), output_args=(example,))
        Schedule1F1B(stage, 2, loss_fn=lambda output, target: output.sum()).step(target=torch.empty(4, 4))
        assert model.weight.grad is not None and model.weight.grad.shape == (4, 4)


def _stock_key_part(mode: FakeTensorMode, args: tuple) -> list:
    """The key values FakeTensorMode's own walk gives `args`."""
    from torch._subclasses.fake_tensor import _CacheKeyState

    values: list = []
    FakeTensorMode._prep_args_for_hash(mode, values, args, _CacheKeyState(), [])
    return values


def _keyed_key_part(mode: FakeTensorMode, args: tuple) -> list:
    from torch._subclasses.fake_tensor import _CacheKeyState

    values: list = []
    mode._prep_args_for_hash(values, args, _CacheKeyState(), [])
    return values


def _assert_keys_equal_exactly_when_fake_modes_do(mode: FakeTensorMode, cases: list[tuple[str, tuple]]) -> None:
    keyed = [(name, _keyed_key_part(mode, args), _stock_key_part(mode, args)) for name, args in cases]
    for name, ours, stock in keyed:
        for other, other_ours, other_stock in keyed:
            assert (ours == other_ours) == (stock == other_stock), (name, other)


def _metadata(tensor: torch.Tensor) -> tuple:
    return (tensor.dtype, tensor.shape, tensor.stride(), tensor.storage_offset(), tensor.untyped_storage().nbytes(),
            tensor.requires_grad, tensor.is_conj(), tensor.is_neg(), tensor.is_inference())  # fmt: skip


def test_dense_fakes_cache_keys_are_equal_exactly_when_fake_modes_own_are() -> None:
    """note [A dense fake's cache key, read directly]: fakes differing in each piece of metadata an op's
    output can depend on, and fakes alike but for their identity. Each fake is made by ops the mode
    caches, and must match the eager tensor the same ops make: a key too coarse would hand one of
    them another's cached output."""
    from explorer._torch_compat.fake import KeyedFakeTensorMode

    def made(device: str) -> dict[str, torch.Tensor]:
        base = torch.zeros(4, 6, device=device)
        made = {
            "base": base,
            "alike": torch.zeros(4, 6, device=device),
            "half": torch.zeros(4, 6, dtype=torch.float16, device=device),
            "int32": torch.zeros(4, 6, dtype=torch.int32, device=device),  # as many bytes as float32
            "shape": torch.zeros(6, 4, device=device),
            "narrower": torch.zeros(4, 6, device=device).narrow(1, 0, 5),  # base's strides and storage
            "transposed": base.t(),
            "offset": torch.zeros(5, 6, device=device).narrow(0, 1, 4),
            "larger storage": torch.zeros(5, 6, device=device).narrow(0, 0, 4),
            "requires_grad": torch.zeros(4, 6, requires_grad=True, device=device),
        }
        if device == "cpu":  # on a fake CUDA tensor these ask for a real CUDA device
            complex_base = torch.zeros(4, 6, dtype=torch.complex64)
            made |= {
                "imag": complex_base.imag,
                "conjugate": complex_base.conj(),
                "negative": complex_base.conj().imag,
                "complex": complex_base,
            }
            with torch.inference_mode():
                made["inference"] = torch.zeros(4, 6)
        return made

    eager = made("cpu")
    mode = KeyedFakeTensorMode()
    with mode:
        fakes = made("cpu")
        fakes |= {f"cuda {name}": fake for name, fake in made("cuda").items()}
        fakes["cuda:1"] = torch.zeros(4, 6, device="cuda:1")
    for name, tensor in eager.items():
        assert _metadata(fakes[name]) == _metadata(tensor) == _metadata(fakes.get(f"cuda {name}", tensor)), name
    base, half = fakes["base"], fakes["half"]
    cases = [(name, (fake,)) for name, fake in fakes.items()]
    cases += [("in a list", ([base, 2.0],)), ("in a dict", ({"alpha": base},)), ("pair", (base, half))]
    _assert_keys_equal_exactly_when_fake_modes_do(mode, cases)
    assert _keyed_key_part(mode, (base,)) == _keyed_key_part(mode, (fakes["alike"],))


def test_dense_fakes_cache_keys_follow_every_change_a_live_fake_can_take() -> None:
    from explorer._torch_compat.fake import KeyedFakeTensorMode

    mode = KeyedFakeTensorMode()
    with mode:
        x = torch.empty(2, 3)
        y = torch.empty(6)
    changes = [
        ("none", lambda: None),
        ("transpose in place", lambda: x.t_()),
        ("resize", lambda: x.resize_(4, 5)),
        ("as_strided in place", lambda: x.as_strided_((2, 2), (1, 2), 3)),
        ("storage resized", lambda: y.untyped_storage().resize_(0)),
        ("requires_grad", lambda: x.requires_grad_(True)),
        ("data swapped to half", lambda: setattr(y, "data", torch.empty(6, dtype=torch.float16))),
    ]
    cases = []
    for name, change in changes:
        with mode:
            change()
        args = (x, [y, 2.0])
        cases.append((name, _keyed_key_part(mode, args), _stock_key_part(mode, args)))
    for name, ours, stock in cases:
        for other, other_ours, other_stock in cases:
            assert (ours == other_ours) == (stock == other_stock), (name, other)
    assert len({tuple(map(str, stock)) for _, _, stock in cases}) == len(changes)  # every change changed the key


def test_fakes_fake_mode_must_see_keep_its_own_cache_key_walk() -> None:
    """A constant (and any fake of another mode) goes through FakeTensorMode's walk: the same refusal."""
    from torch._subclasses.fake_tensor import _BypassDispatchCache

    from explorer._torch_compat.fake import KeyedFakeTensorMode

    mode, other = KeyedFakeTensorMode(), KeyedFakeTensorMode()
    with mode:
        constant = torch.tensor(3.0)  # a one-element literal: FakeTensorMode keeps its value
    with other:
        foreign = torch.empty(2)
    assert constant.constant is not None
    for fake, reason in ((constant, "constant attribute"), (foreign, "not our fake")):
        for walk in (_keyed_key_part, _stock_key_part):
            with pytest.raises(_BypassDispatchCache, match=reason):
                walk(mode, (fake,))


def test_ops_on_a_fake_changed_in_place_give_the_shapes_eager_gives() -> None:
    from explorer._torch_compat.fake import KeyedFakeTensorMode

    def shapes(tensor: torch.Tensor) -> tuple:
        first = tensor.add(tensor)
        tensor.t_()
        second = tensor.add(tensor)
        return first.shape, first.stride(), second.shape, second.stride()

    results = [shapes(torch.zeros(2, 3))]
    with KeyedFakeTensorMode():
        results.append(shapes(torch.zeros(2, 3)))
    assert results[0] == results[1] == ((2, 3), (3, 1), (3, 2), (1, 3))


def _direct_hit_calls(tensors: dict[str, torch.Tensor]) -> list:
    """Calls covering each kind of cached output: new tensors, views (one and several), in-place
    results, constants; scalars of each type, lists, sizes, keywords, a factory on another device."""
    x, y, ints, cplx = tensors["x"], tensors["y"], tensors["ints"], tensors["complex"]
    return [
        x + y,
        torch.add(x, y, alpha=2),
        ints * 1,
        ints * 1.0,  # the same value as a float: another dtype out
        ints * True,
        x.view(24),
        x.t(),
        x.split([1, 3]),
        x.unsqueeze(0).expand(2, 4, 6),
        torch.ops.aten.sum.dim_IntList(x, [0, 1]),
        torch.ops.aten.sum.dim_IntList(x, (0,)),
        x.new_zeros(torch.Size([2, 3])),
        torch.empty(3, 5, dtype=torch.float16, device="cuda"),
        x.is_same_size(y),
        cplx.conj(),
        cplx.conj().imag,
        y.mul_(2),
        torch.ops.aten._unsafe_view(x, [6, 4]),  # FakeTensorMode caches it from torch 2.15 on
        torch.ops.aten._unsafe_view(x.t(), [6, 1, 4]),  # strides of a transpose, viewed
    ]


def _described(value: object, inputs: dict[str, torch.Tensor]) -> object:
    """What a caller can tell of an output: its metadata, device, class, and what input it is or
    shares storage with."""
    if isinstance(value, tuple):
        return tuple(_described(item, inputs) for item in value)
    if not isinstance(value, torch.Tensor):
        return (type(value), value)
    same = [name for name, tensor in inputs.items() if value is tensor]
    shared = [
        name for name, tensor in inputs.items() if value.untyped_storage()._cdata == tensor.untyped_storage()._cdata
    ]
    return (type(value), _metadata(value), value.device, value.fake_mode is not None, same, shared)


def test_a_cache_hit_taken_directly_gives_fake_modes_own_output() -> None:
    """note [A cache hit, taken directly]: the second run of each call is answered by the direct path,
    and every output matches FakeTensorMode's own on the same calls (its second run, from its cache),
    down to identity and storage sharing."""
    from explorer._torch_compat.fake import KeyedFakeTensorMode

    def inputs() -> dict[str, torch.Tensor]:
        return {
            "x": torch.zeros(4, 6),
            "y": torch.zeros(4, 6),
            "ints": torch.zeros(3, dtype=torch.int32),
            "complex": torch.zeros(2, 2, dtype=torch.complex64),
        }

    described = {}
    for mode in (FakeTensorMode(), KeyedFakeTensorMode()):
        with mode:
            for _ in range(2):
                tensors = inputs()
                outputs = _direct_hit_calls(tensors)
        described[type(mode)] = [_described(output, tensors) for output in outputs]
    stock, direct = described.values()
    assert direct == stock
    assert stock[16][-2:] == (["y"], ["y"]) and stock[5][-1] == ["x"]  # in place: the input; view: its storage
    assert stock[17][-1] == stock[18][-1] == ["x"] and stock[18][1][2] == (1, 24, 6)  # _unsafe_view too

    def dispatched(mode: FakeTensorMode) -> tuple[set[str], set[str], int]:
        """The third run's ops FakeTensorMode.dispatch saw, those its cache answered, and the hits."""
        with mode:
            for _ in range(2):
                _direct_hit_calls(inputs())
        seen: set[str] = set()
        from_cache: set[str] = set()
        dispatch, from_entry = FakeTensorMode.dispatch, FakeTensorMode._output_from_cache_entry

        calls: list[str] = []

        def counted(self, func, types, args=(), kwargs=None):
            seen.add(str(func))
            calls.append(str(func))
            try:
                return dispatch(self, func, types, args, kwargs or {})
            finally:
                calls.pop()

        def answered(self, *args):  # its arguments differ between releases
            from_cache.add(calls[-1])
            return from_entry(self, *args)

        hits = FakeTensorMode.cache_hits
        FakeTensorMode.dispatch, FakeTensorMode._output_from_cache_entry = counted, answered
        try:
            with mode:
                _direct_hit_calls(inputs())
        finally:
            FakeTensorMode.dispatch, FakeTensorMode._output_from_cache_entry = dispatch, from_entry
        return seen, from_cache, FakeTensorMode.cache_hits - hits

    stock_seen, stock_cached, stock_hits = dispatched(FakeTensorMode())
    seen, cached, hits = dispatched(KeyedFakeTensorMode())
    # FakeTensorMode answers exactly what its own cache does not hold, but `_unsafe_view` (answered as `view`)
    unsafe_view = {"aten._unsafe_view.default"}
    assert seen == stock_seen - stock_cached - unsafe_view and "prim.device.default" in seen
    # as many hits: where FakeTensorMode does not cache `_unsafe_view`, it runs it as a cached `view`
    assert not cached and hits == stock_hits >= 20


def test_a_cached_call_follows_the_default_dtype_and_device() -> None:
    """The defaults are part of the direct key: a float scalar takes the default dtype, a factory
    the default device."""
    from explorer._torch_compat.fake import KeyedFakeTensorMode

    made = []
    with KeyedFakeTensorMode():
        ints = torch.zeros(3, dtype=torch.int32)
        for dtype, device in ((torch.float32, "cpu"), (torch.float64, "cpu"), (torch.float32, "cuda"), (None, None)):
            previous_dtype = torch.get_default_dtype()
            if dtype is not None:
                torch.set_default_dtype(dtype)
                torch.set_default_device(device)
            try:
                made.append(((ints * 1.5).dtype, torch.empty(2).device.type))
            finally:
                torch.set_default_dtype(previous_dtype)
                torch.set_default_device(None)
    assert made == [(torch.float32, "cpu"), (torch.float64, "cpu"), (torch.float32, "cuda"), (torch.float32, "cpu")]


def test_an_unsafe_view_fails_as_fake_mode_fails_it() -> None:
    """`_unsafe_view`, answered as `view`: what cannot be viewed raises FakeTensorMode's own error."""
    from explorer._torch_compat.fake import KeyedFakeTensorMode

    errors = []
    for mode in (FakeTensorMode(), KeyedFakeTensorMode()):
        with mode:
            transposed = torch.zeros(4, 6).t()
            for _ in range(2):
                with pytest.raises((RuntimeError, ValueError)) as raised:
                    torch.ops.aten._unsafe_view(transposed, [24])
                errors.append((raised.type, str(raised.value)))
    assert len(set(errors)) == 1 and "Cannot view a tensor with shape torch.Size([6, 4])" in errors[0][1]


def test_a_call_fake_mode_no_longer_caches_goes_back_to_it() -> None:
    """A cleared cache: the direct key stays, its call goes back to FakeTensorMode, which caches it
    again; the outputs are the same either way."""
    from explorer._torch_compat.fake import KeyedFakeTensorMode

    mode = KeyedFakeTensorMode()
    with mode:
        x = torch.zeros(4, 6)
        first = x.t()
        FakeTensorMode.cache_clear()
        misses = FakeTensorMode.cache_misses
        second = x.t()
        assert FakeTensorMode.cache_misses == misses + 1
        third = x.t()
    assert FakeTensorMode.cache_misses == misses + 1
    assert _described(first, {"x": x}) == _described(second, {"x": x}) == _described(third, {"x": x})
    assert _metadata(third) == (torch.float32, (6, 4), (1, 6), 0, 96, False, False, False, False)


def test_the_fast_trackers_answer_a_fakes_device_query_without_taking_it_as_an_op() -> None:
    """note [Device queries are not ops]: the query a real tensor answers in C++ reaches no tracker
    bookkeeping (here: the op observer sees none), and its answer is the fake mode's."""
    from explorer._torch_compat.memory_tracker import FastMemTracker

    mode = FakeTensorMode()
    with mode:
        fake = torch.empty(2, 2, device="cuda")
    seen = []
    tracker = FastMemTracker()
    tracker.op_observer = lambda func, args, kwargs, result: seen.append(str(func))
    with mode, tracker:
        answered = torch.ops.prim.device.default(fake)
        fake.add(fake)
    assert answered == torch.device("cuda", 0) == fake.device
    assert seen == ["aten.add.Tensor"]


def test_the_trackers_direct_output_map_gives_pytrees_result_on_every_kind_of_tree() -> None:
    """note [An op's outputs, mapped directly]: same result and same calls, in the same order, as
    pytree's `tree_map_only`, which the trackers' modules no longer call directly."""
    import collections

    import torch.distributed._tools.fsdp2_mem_tracker as fsdp2_mem_tracker
    import torch.distributed._tools.mem_tracker as mem_tracker
    import torch.utils._pytree as pytree

    from explorer._torch_compat.memory_tracker import _flat_tree_map_only

    assert mem_tracker.tree_map_only is fsdp2_mem_tracker.tree_map_only is _flat_tree_map_only
    pair = collections.namedtuple("pair", "a b")
    a, b = torch.ones(2), torch.zeros(3, dtype=torch.int64)
    trees = [a, (a, None, 3), [a, b], (a, (b,)), pair(a, b), {"x": a}, torch.Size([2, 3]), None, 2.5, ([a], b), ()]
    for tree in trees:
        calls: list[list] = [[], []]
        results = [
            mapper(torch.Tensor, lambda t, seen=seen: seen.append(t) or t.shape, tree)
            for mapper, seen in ((_flat_tree_map_only, calls[0]), (pytree.tree_map_only, calls[1]))
        ]
        assert results[0] == results[1] and type(results[0]) is type(results[1]), tree
        assert [id(t) for t in calls[0]] == [id(t) for t in calls[1]], tree


def test_the_cpu_generator_layout_check_holds_under_a_float64_default() -> None:
    """The check draws one float32 value: a float64 draw takes two words and failed it, so a second
    deferred_init under a float64 default raised that torch lays out its state differently."""
    from explorer._torch_compat.generators import cpu_state_layout
    from explorer.replay.replay import default_dtype_set

    cpu_state_layout.cache_clear()
    with default_dtype_set(torch.float64):
        torch.manual_seed(0)
        torch.nn.Linear(30, 30)
        eager = torch.nn.Linear(30, 30)
        torch.manual_seed(0)
        deferred_init(torch.nn.Linear, 30, 30)
        second = materialize_module(deferred_init(torch.nn.Linear, 30, 30))
    assert second.weight.dtype == torch.float64 and torch.equal(second.weight, eager.weight)
