"""Bad input and failures: clear messages, nothing changed, no mode left behind."""

import pytest
import torch
from torch import nn
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from explorer import DeferredInitError, MaterializationError, deferred_init, is_deferred, materialize_module


@torch.library.custom_op("explorer_tests::no_fake_kernel", mutates_args=())
def no_fake_kernel(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))
        self.register_buffer("bad", no_fake_kernel(self.w))


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(2, 2)
        self.inner = Inner()


def assert_no_mode_active():
    assert _get_current_dispatch_mode_stack() == []
    assert _get_current_function_mode_stack() == []


def test_op_without_fake_kernel_names_op_module_chain_and_source_line():
    with pytest.raises(DeferredInitError) as error:
        deferred_init(Outer)
    message = str(error.value)
    assert message.startswith("explorer_tests.no_fake_kernel.default failed under deferred_init while building "
                              "Outer.inner(Inner) at ")
    assert "test_errors.py:" in message and "in __init__" in message
    assert 'self.register_buffer("bad", no_fake_kernel(self.w))' in message
    assert error.value.graph is not None and len(error.value.graph.ops) >= 6  # the partial recording
    assert_no_mode_active()


def test_exception_inside_module_fn_propagates_and_leaves_no_mode_active():
    def broken():
        nn.Linear(2, 2)
        raise KeyError("config field missing")

    with pytest.raises(KeyError, match="config field missing") as error:
        deferred_init(broken)
    assert len(error.value.deferred_graph.ops) > 0
    assert_no_mode_active()
    assert torch.ones(2).sum().item() == 2.0  # real tensors work again


def test_a_failed_construction_keeps_what_it_had_built_as_partial_module():
    with pytest.raises(DeferredInitError) as error:
        deferred_init(Outer)
    partial = error.value.partial_module
    assert type(partial) is Outer
    assert [name for name, _ in partial.named_modules()] == ["", "first"]  # `inner` was never assigned
    assert is_deferred(partial) and tuple(partial.first.weight.shape) == (2, 2)

    def broken():
        nn.Linear(2, 2)
        raise KeyError("config field missing")

    with pytest.raises(KeyError) as plain:
        deferred_init(broken)
    assert plain.value.partial_module is None  # no module constructor was running


def test_non_callable_module_fn_is_rejected():
    with pytest.raises(TypeError, match=r"deferred_init expects a callable that builds an nn.Module .* got str 'Linear'"):
        deferred_init("Linear")


def test_already_built_module_is_rejected_with_a_hint():
    with pytest.raises(TypeError, match=r"got an already built Linear instance; pass the class and its arguments"):
        deferred_init(nn.Linear(2, 2))


def test_module_fn_returning_a_non_module_is_rejected():
    with pytest.raises(TypeError, match=r"returned a Tensor, not an nn.Module"):
        deferred_init(lambda: torch.ones(2))
    assert_no_mode_active()


def test_nested_deferred_init_is_rejected():
    def outer():
        return deferred_init(nn.Linear, 2, 2)

    with pytest.raises(DeferredInitError, match="deferred_init cannot be nested"):
        deferred_init(outer)
    assert_no_mode_active()


def test_failed_materialize_module_leaves_every_attribute_as_it_was():
    table = torch.arange(2.0)

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fine = nn.Linear(2, 2)
            self.register_buffer("from_table", table + 1)

    module = deferred_init(Mixed)
    before = {name: tensor for name, tensor in module.state_dict(keep_vars=True).items()}
    table.mul_(3)
    with pytest.raises(MaterializationError):
        materialize_module(module)
    after = module.state_dict(keep_vars=True)
    assert all(after[name] is tensor for name, tensor in before.items())
    assert is_deferred(module.fine.weight)


def test_interrupt_during_materialization_leaves_module_and_rng_unchanged():
    module = deferred_init(lambda: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
    before = dict(module.state_dict(keep_vars=True))
    rng = torch.get_rng_state()

    def interrupt(done, total, done_bytes, total_bytes):
        if done >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        materialize_module(module, progress=interrupt)
    assert all(module.state_dict(keep_vars=True)[name] is t for name, t in before.items())
    assert torch.equal(torch.get_rng_state(), rng)
    materialize_module(module)
    assert not is_deferred(module)


def test_fake_modified_after_deferred_init_is_recorded_and_replayed():
    torch.manual_seed(2)
    eager = nn.Linear(2, 2)
    with torch.no_grad():
        eager.weight.add_(1)
    torch.manual_seed(2)
    module = deferred_init(nn.Linear, 2, 2)
    with torch.no_grad():
        module.weight.add_(1)  # recorded into the graph after the constructor's ops
    materialize_module(module)
    assert torch.equal(module.weight, eager.weight) and torch.equal(module.bias, eager.bias)


def test_a_write_into_a_tensor_of_another_graph_is_rejected_and_a_read_is_recorded():
    first = deferred_init(nn.Linear, 2, 2)

    def writes() -> nn.Module:
        module = nn.Linear(2, 2)
        first.weight.data.copy_(module.weight)
        return module

    with pytest.raises(DeferredInitError, match="a fake tensor from another deferred_init graph"):
        deferred_init(writes)

    def reads() -> nn.Module:  # record/foreign.py: the value `first.weight` has now
        module = nn.Linear(2, 2)
        module.weight.data.copy_(first.weight)
        return module

    assert torch.equal(materialize_module(deferred_init(reads)).weight, materialize_module(first).weight)


class _OneBadIndex(nn.Module):
    """Records fine (a fake index_select reads no values); fails when replayed, as eager fails."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(4, 4) for _ in range(4))
        with torch.no_grad():
            self.d.weight.copy_(self.d.weight.index_select(0, torch.tensor([0, 1, 2, 7])))


@pytest.mark.parametrize("part", ["model", "d"])
def test_a_replay_failure_names_the_tensor_that_needs_the_op_with_its_module_path(part):
    model = deferred_init(_OneBadIndex)
    with pytest.raises(MaterializationError) as caught:
        materialize_module(model if part == "model" else model.d)
    message = str(caught.value)
    assert message.startswith("replaying aten.index_select.default (recorded at "), message
    assert message.endswith("for 'd.weight' failed: IndexError: index out of range in self"), message
    assert is_deferred(model)


def test_progress_counts_once_across_the_recordings_of_one_call():
    model = nn.Sequential(deferred_init(nn.Linear, 16, 16), deferred_init(nn.Linear, 16, 4))
    calls: list[tuple[int, int, int, int]] = []
    materialize_module(model, progress=lambda *report: calls.append(report))
    assert calls == [(1, 4, 1024, 1360), (2, 4, 1088, 1360), (3, 4, 1344, 1360), (4, 4, 1360, 1360)]
