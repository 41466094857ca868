"""Bad input, second round: the cases test_errors.py, test_external_tensors.py and test_devices.py
leave open. Each test reads the message, and checks that nothing was changed or left behind."""

from __future__ import annotations

import gc
import io
import pickle
import threading
import weakref

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from explorer import (
    DeferredInitError,
    MaterializationError,
    deferred_init,
    is_deferred,
    materialize_module,
    materialize_tensor,
)
from explorer.record.scope import recording_graph

JOIN_TIMEOUT_S = 120  # generous: a deadlock never finishes, a slow shared machine eventually does


def assert_clean_global_state() -> None:
    """No mode active, no recording in progress, lazy-module patches undone, collector running."""
    assert gc.isenabled()
    assert _get_current_dispatch_mode_stack() == []
    assert _get_current_function_mode_stack() == []
    assert recording_graph() is None
    assert UninitializedParameter.__dict__["__new__"] is _ORIGINAL_NEW[UninitializedParameter]
    assert UninitializedBuffer.__dict__["__new__"] is _ORIGINAL_NEW[UninitializedBuffer]


_ORIGINAL_NEW = {cls: cls.__dict__["__new__"] for cls in (UninitializedParameter, UninitializedBuffer)}


def assert_same_state(module: nn.Module, reference: nn.Module) -> None:
    """Bitwise equal parameters and buffers, same names, dtypes, strides and kinds."""
    got, want = module.state_dict(keep_vars=True), reference.state_dict(keep_vars=True)
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert type(got[name]) is type(tensor), name
        assert got[name].dtype == tensor.dtype and got[name].stride() == tensor.stride(), name
        assert torch.equal(got[name], tensor), name


def seeded(build, seed: int = 0):  # noqa: ANN001, ANN201
    torch.manual_seed(seed)
    return build()


# -- module_fn -------------------------------------------------------------------------------
def test_module_fn_that_forgets_to_return_names_the_function():
    def build():
        nn.Linear(2, 2)  # no return: a common slip in factory functions

    with pytest.raises(TypeError) as error:
        deferred_init(build)
    assert str(error.value) == (
        "deferred_init: 'test_module_fn_that_forgets_to_return_names_the_function.<locals>.build' "
        "returned NoneType, not an nn.Module"
    )
    assert_clean_global_state()


@pytest.mark.parametrize("exception", [ValueError("bad config"), KeyboardInterrupt()], ids=["ValueError", "KeyboardInterrupt"])
def test_exception_inside_module_fn_changes_no_global_state(exception):
    def broken():
        nn.Linear(4, 4)
        torch.rand(3)  # random draws are recorded, never taken from the global generator
        nn.LazyLinear(2)  # patches the uninitialized-parameter classes while recording
        with torch.no_grad():
            raise exception

    torch.manual_seed(3)
    rng = torch.get_rng_state()
    with pytest.raises(type(exception)) as error:
        deferred_init(broken)
    assert error.value is exception
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.is_grad_enabled()
    assert_clean_global_state()
    # The next deferred_init is not mistaken for a nested one, and still matches eager.
    module = materialize_module(deferred_init(nn.Linear, 4, 4))
    assert_same_state(module, seeded(lambda: nn.Linear(4, 4), 3))


def test_nested_deferred_init_caught_inside_module_fn_leaves_the_outer_recording_intact():
    def outer():
        with pytest.raises(DeferredInitError, match="deferred_init cannot be nested"):
            deferred_init(nn.Linear, 2, 2)
        return nn.Linear(3, 3)

    torch.manual_seed(0)
    module = materialize_module(deferred_init(outer))
    assert_same_state(module, seeded(lambda: nn.Linear(3, 3)))
    assert_clean_global_state()


# -- ops deferred_init cannot run --------------------------------------------------------------
class NonzeroMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("kept", torch.tensor([0.0, 1.0, 2.0]).nonzero())


def test_op_with_data_dependent_output_shape_is_computed_and_replays_as_eager():
    eager = NonzeroMask()
    module = deferred_init(NonzeroMask)
    assert module.kept.shape == (2, 1) and is_deferred(module.kept)
    materialize_module(module)
    assert torch.equal(module.kept, eager.kept)
    assert_clean_global_state()


# -- external tensors --------------------------------------------------------------------------
class Table(nn.Module):
    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("doubled", table * 2)
        self.register_buffer("first_row", table[0])  # a view: shares the caller's memory


def test_external_tensor_deleted_by_the_user_is_kept_alive_and_materializes_as_eager():
    eager = Table(torch.arange(6.0).reshape(2, 3))
    table = torch.arange(6.0).reshape(2, 3)
    module = deferred_init(Table, table)
    still_there = weakref.ref(table)
    del table
    gc.collect()
    assert still_there() is not None  # the recording holds it by reference
    materialize_module(module)
    assert_same_state(module, eager)
    assert module.first_row.untyped_storage().data_ptr() == still_there().untyped_storage().data_ptr()


@pytest.mark.parametrize(
    ("write", "what", "op"),
    [
        (lambda t: t.add_(1), "a real tensor", "aten.add_.Tensor"),
        (lambda t: t.view(-1).mul_(2), "a view of a real tensor", "aten.mul_.Tensor"),
        (lambda t: nn.init.zeros_(t[0]), "a view of a real tensor", "aten.zero_.default"),
    ],
    ids=["in-place", "through-a-view", "nn.init"],
)
def test_writing_into_an_external_tensor_is_refused_and_leaves_it_untouched(write, what, op):
    table = torch.arange(6.0).reshape(2, 3)

    class Normalizes(nn.Module):
        def __init__(self, t: torch.Tensor) -> None:
            super().__init__()
            with torch.no_grad():
                write(t)
            self.register_buffer("table", t)

    with pytest.raises(DeferredInitError) as error:
        deferred_init(Normalizes, table)
    message = str(error.value)
    assert message.startswith(f"{op} writes in place into {what} from outside the constructor (float32[")
    assert "while building Normalizes at " in message and "test_bad_input.py" in message
    assert message.endswith(
        "eager construction would change that tensor, which deferred_init cannot defer: clone it first "
        "(x = x.clone()) or change it before calling deferred_init"
    )
    assert torch.equal(table, torch.arange(6.0).reshape(2, 3)) and table._version == 0
    assert_clean_global_state()


# -- inference tensors made inside the constructor ------------------------------------------------
class InferenceBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 2)
        with torch.inference_mode():
            scale = torch.ones(3) * 2
            scale.add_(torch.rand(3))
            self.register_buffer("scale", scale)
        self.register_buffer("noise", torch.randn(2))


def _inference_flags(module: nn.Module) -> dict[str, bool]:
    return {name: t.is_inference() for name, t in module.state_dict(keep_vars=True).items()}


def test_module_built_under_inference_mode_materializes_as_eager_built_it():
    # Recording used to fail with "Inference tensors do not track version counter".
    eager = seeded(InferenceBuffers)
    torch.manual_seed(0)
    module = deferred_init(InferenceBuffers)
    with torch.inference_mode():  # where materialization runs does not matter, construction does
        materialize_module(module)
    assert_same_state(module, eager)
    assert _inference_flags(module) == _inference_flags(eager) == {
        "scale": True, "noise": False, "proj.weight": False, "proj.bias": False}

    with torch.inference_mode():
        eager = seeded(InferenceBuffers)
        torch.manual_seed(0)
        module = deferred_init(InferenceBuffers)
    materialize_module(module)
    assert_same_state(module, eager)
    assert _inference_flags(module) == _inference_flags(eager) == dict.fromkeys(_inference_flags(eager), True)
    assert module.proj.weight.requires_grad and isinstance(module.proj.weight, nn.Parameter)


# -- fakes changed by the user after deferred_init ------------------------------------------------
def test_initializing_fakes_after_deferred_init_replays_as_eager_then_the_same_init():
    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))

    def reinit(module: nn.Module) -> None:
        module.apply(lambda m: nn.init.normal_(m.weight) if isinstance(m, nn.Linear) else None)

    torch.manual_seed(6)
    eager = build()
    reinit(eager)
    torch.manual_seed(6)
    module = deferred_init(build)
    reinit(module)
    materialize_module(module)
    for (name, want), (_, got) in zip(eager.state_dict().items(), module.state_dict().items()):
        assert torch.equal(got, want), name


def test_writing_a_fake_through_a_view_after_deferred_init_reaches_its_base():
    torch.manual_seed(1)
    module = deferred_init(nn.Linear, 3, 2)
    with torch.no_grad():
        module.weight[0].zero_()  # a view of the weight: recorded, replayed into the base
    bias = materialize_tensor(module.bias)  # an untouched tensor still materializes alone
    materialize_module(module)
    torch.manual_seed(1)
    eager = nn.Linear(3, 2)
    with torch.no_grad():
        eager.weight[0].zero_()
    assert torch.equal(module.weight, eager.weight) and torch.equal(bias, eager.bias)


# -- devices ----------------------------------------------------------------------------------
@pytest.mark.parametrize("device", [{"cpu": "gpu0"}, {"gpu0": "cpu"}], ids=["target", "source"])
def test_unknown_device_in_a_device_map_is_rejected_before_anything_runs(device):
    module = deferred_init(nn.Linear, 2, 2)
    with pytest.raises(MaterializationError) as error:
        materialize_module(module, device=device)
    assert str(error.value) == "unknown device 'gpu0': Invalid device string: 'gpu0'"
    assert is_deferred(module.weight) and is_deferred(module.bias)


def test_unknown_device_inside_the_constructor_raises_what_eager_raises():
    with pytest.raises(RuntimeError) as eager_error:
        nn.Linear(2, 2, device="gpu0")
    with pytest.raises(RuntimeError) as deferred_error:
        deferred_init(nn.Linear, 2, 2, device="gpu0")
    assert str(deferred_error.value) == str(eager_error.value) == "Invalid device string: 'gpu0'"
    assert_clean_global_state()


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the message for a machine without MPS")
def test_module_recorded_on_an_absent_device_type_names_the_tensor_and_the_fix():
    module = deferred_init(nn.Linear, 2, 2, device="mps")
    assert module.weight.device == torch.device("mps", 0)
    with pytest.raises(MaterializationError) as error:
        materialize_module(module)
    assert str(error.value) == (
        "'weight' was recorded on mps:0 and would be materialized there, but device mps:0 is not available "
        "on this machine; pass device= (e.g. device='cpu' or device={'mps': 'cpu'})"
    )
    materialize_module(module, device={"mps": "cpu"}, rng="fast")
    assert module.weight.device == torch.device("cpu") and not is_deferred(module)


# -- tensors from elsewhere -----------------------------------------------------------------
def test_fake_moved_into_another_deferred_module_materializes_from_its_own_graph():
    torch.manual_seed(0)
    donor = deferred_init(nn.Linear, 2, 2)
    torch.manual_seed(1)
    receiver = deferred_init(nn.Linear, 2, 2)
    receiver.weight = donor.weight  # graph of `donor`, slot of `receiver`
    materialize_module(receiver)
    assert torch.equal(receiver.weight, seeded(lambda: nn.Linear(2, 2), 0).weight)
    assert torch.equal(receiver.bias, seeded(lambda: nn.Linear(2, 2), 1).bias)
    assert materialize_tensor(donor.weight) is receiver.weight  # one fake, one real tensor


def test_fake_from_another_fake_mode_is_rejected_where_it_is_used():
    with FakeTensorMode():
        foreign = torch.ones(2)

    def uses_foreign():
        module = nn.Module()
        module.register_buffer("scaled", foreign * 2)
        return module

    with pytest.raises(DeferredInitError) as error:
        deferred_init(uses_foreign)
    assert str(error.value).startswith("a fake tensor that deferred_init did not create was used at ")
    assert str(error.value).endswith("; it may come from another FakeTensorMode")
    with pytest.raises(MaterializationError, match=r"^this fake tensor was not created by deferred_init"):
        materialize_tensor(foreign)
    assert_clean_global_state()


# -- interrupts and threads -------------------------------------------------------------------
_INTERRUPT = threading.Event()


@torch.library.custom_op("explorer_bad_input::interruptible_double", mutates_args=())
def interruptible_double(x: torch.Tensor) -> torch.Tensor:
    if _INTERRUPT.is_set():
        raise KeyboardInterrupt
    return x * 2


@interruptible_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Interruptible(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.before = nn.Linear(4, 4)
        self.register_buffer("doubled", interruptible_double(torch.randn(4)))
        self.after = nn.Linear(4, 4)


@pytest.mark.parametrize("rng", ["eager", "fast"])
def test_keyboard_interrupt_inside_a_replayed_op_leaves_the_module_as_before(rng):
    torch.manual_seed(0)
    module = deferred_init(Interruptible)
    before = dict(module.state_dict(keep_vars=True))
    threads = threading.active_count()
    torch.manual_seed(5)
    global_rng = torch.get_rng_state()
    _INTERRUPT.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            materialize_module(module, rng=rng)  # `before` has replayed when `doubled` interrupts
    finally:
        _INTERRUPT.clear()
    assert all(module.state_dict(keep_vars=True)[name] is t for name, t in before.items())
    assert torch.equal(torch.get_rng_state(), global_rng)
    assert threading.active_count() == threads  # rng="fast" fill workers are gone
    materialize_module(module)
    assert_same_state(module, seeded(Interruptible))


class Blocks(nn.Module):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.Linear(32, 8)) for _ in range(count)
        )
        for block in self.blocks:
            block.register_buffer("noise", torch.randn(8))
            nn.init.normal_(block[0].weight, std=0.02)


def test_threads_materializing_disjoint_submodules_at_once_match_eager():
    eager = seeded(lambda: Blocks(6))
    for round_ in range(3):
        torch.manual_seed(0)
        module = deferred_init(Blocks, 6)
        order = list(module.blocks) if round_ % 2 == 0 else list(reversed(module.blocks))
        start = threading.Barrier(len(order))
        errors: list[BaseException] = []

        def materialize(block: nn.Module) -> None:
            try:
                start.wait()
                materialize_module(block)
            except BaseException as error:  # noqa: BLE001 - reported below with the thread's result
                errors.append(error)

        workers = [threading.Thread(target=materialize, args=(block,), daemon=True) for block in order]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(JOIN_TIMEOUT_S)
        assert not any(worker.is_alive() for worker in workers), "materialization threads deadlocked"
        assert errors == []
        assert not is_deferred(module)
        assert_same_state(module, eager)


# -- type checks on the public functions (each a clear error, nothing changed) --------------------
def test_materialize_module_of_a_non_module_is_a_type_error_naming_it():
    with pytest.raises(TypeError) as error:
        materialize_module("not a module")
    assert str(error.value) == "explorer.materialize_module expects an nn.Module, got str 'not a module'"


def test_materialize_tensor_of_a_non_tensor_is_a_type_error_naming_it():
    with pytest.raises(TypeError) as error:
        materialize_tensor([1, 2])
    assert str(error.value) == "explorer.materialize_tensor expects a tensor, got list [1, 2]"


def test_a_device_that_is_not_a_device_names_what_was_given():
    module = deferred_init(nn.Linear, 3, 4)
    with pytest.raises(MaterializationError) as error:
        materialize_module(module, device=3.5)
    assert str(error.value) == (
        "device must be a string such as 'cpu' or 'cuda:0', a torch.device or a device index, got float 3.5"
    )
    assert is_deferred(module.weight) and is_deferred(module.bias)


def test_an_unknown_rng_mode_is_refused_before_anything_runs():
    module = deferred_init(nn.Linear, 3, 4)
    with pytest.raises(MaterializationError, match=r"rng must be one of \('eager', 'fast'\), got 'eagre'"):
        materialize_module(module, rng="eagre")
    assert is_deferred(module.weight)


def test_a_check_fn_that_raises_names_the_submodule_and_changes_nothing():
    module = deferred_init(lambda: nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 3))))
    before = {name: t for name, t in module.named_parameters()}

    def picky(sub: nn.Module) -> bool:
        if isinstance(sub, nn.Linear) and sub.out_features == 3:
            raise ValueError("no 3s")
        return True

    with pytest.raises(MaterializationError) as error:
        materialize_module(module, check_fn=picky)
    assert str(error.value) == "check_fn raised ValueError for submodule '1.0' (Linear): no 3s; nothing was materialized"
    assert isinstance(error.value.__cause__, ValueError)
    assert {name: t for name, t in module.named_parameters()} == before
    assert all(is_deferred(t) for t in before.values())


@pytest.mark.parametrize("save", [pickle.dumps, lambda m: torch.save(m, io.BytesIO())], ids=["pickle", "torch.save"])
def test_pickling_a_deferred_module_is_a_type_error_naming_the_tensor_and_the_fix(save):
    module = deferred_init(lambda: nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)))
    materialize_module(module[0])
    with pytest.raises(TypeError) as error:
        save(module)
    assert str(error.value) == (
        "cannot pickle parameter '1.weight' (shape (3, 2), float32): it is a deferred (fake) tensor with no data. "
        "Materialize first (explorer.materialize_module(module), then torch.save / pickle), or pickle the recipe "
        "(the module class and its arguments) and call deferred_init again where you load it"
    )
    materialize_module(module)
    restored = pickle.loads(pickle.dumps(module))  # once materialized, it pickles as any module
    assert torch.equal(restored[1].weight, module[1].weight)
