"""`materialize_tensor` of a view selecting rows makes only those rows (`replay/slices.py`), bit for
bit eager's rows; anything else makes the whole base and says so."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from explorer import deferred_init, load_checkpoint, materialize_module, materialize_tensor
from explorer.replay.slices import HELD_VIEW, SlicePlan, WholeBaseWarning, slice_plan
from tests.support.run_length_op import add_length_

INITS = {
    "normal_": lambda t: nn.init.normal_(t, std=0.02),
    "kaiming_uniform_ then normal_": lambda t: nn.init.normal_(nn.init.kaiming_uniform_(t), std=0.02),
    "uniform_": lambda t: nn.init.uniform_(t, -0.5, 0.5),
    "xavier_uniform_": nn.init.xavier_uniform_,
    "exponential_": lambda t: t.exponential_(2.0),
    "cauchy_": lambda t: t.cauchy_(),
    "geometric_": lambda t: t.geometric_(0.3),
    "random_": lambda t: t.random_(0, 200),
    "bernoulli_": lambda t: t.bernoulli_(0.3),
}
VIEWS = {
    "t[i]": lambda t: t[2],
    "t[-1]": lambda t: t[-1],
    "t[a:b]": lambda t: t[1:4],
    "t.narrow": lambda t: t.narrow(0, 3, 2),
    "t.select": lambda t: t.select(0, 4),
}


class FusedExperts(nn.Module):
    """Experts fused into 3-D parameters, as transformers 5 builds MoE layers."""

    def __init__(self, init, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.router = nn.Linear(8, 5)  # draws before the experts: their fill starts mid-stream
        self.gate_up_proj = nn.Parameter(init(torch.empty(5, 6, 7, dtype=dtype)))
        self.down_proj = nn.Parameter(init(torch.empty(5, 7, 3, dtype=dtype)))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(torch.uint8)


def _quiet_materialize(view: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("error", WholeBaseWarning)  # a fallback fails the test
        return materialize_tensor(view)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("init", INITS)
def test_rows_of_fused_experts_are_drawn_alone_and_equal_eagers_rows(init, dtype, restore_rng) -> None:
    torch.manual_seed(7)
    eager = FusedExperts(INITS[init], dtype)
    torch.manual_seed(7)
    deferred = deferred_init(FusedExperts, INITS[init], dtype)
    for view_name, view in VIEWS.items():
        for name in ("gate_up_proj", "down_proj"):
            fake_view = view(getattr(deferred, name))
            plan = slice_plan(fake_view)
            assert (plan.sliced, plan.source, plan.nbytes) == (True, "random fill", fake_view.numel() * dtype.itemsize)
            real = _quiet_materialize(fake_view)
            expected = view(getattr(eager, name))
            assert real.shape == expected.shape and real.requires_grad
            assert _bits(real).equal(_bits(expected)), (view_name, name)


def test_rows_of_a_trunc_normal_fill_make_the_whole_base_with_eagers_values(restore_rng) -> None:
    # rejection sampling: how many draws a row takes depends on the values, so rows cannot be jumped to
    torch.manual_seed(9)
    eager = FusedExperts(nn.init.trunc_normal_)
    torch.manual_seed(9)
    deferred = deferred_init(FusedExperts, nn.init.trunc_normal_)
    assert not slice_plan(deferred.down_proj[1]).sliced
    whole_base = r"\(84 bytes\) makes its whole base \(420 bytes\): its base is not made by position: "
    rejection = r"explorer.trunc_normal_.default \(rejection sampling\) draws as many numbers as its values need"
    with pytest.warns(WholeBaseWarning, match=whole_base + rejection):
        rows = materialize_tensor(deferred.down_proj[1])
    assert _bits(rows).equal(_bits(eager.down_proj[1]))


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_rows_equal_eagers_rows(padding_idx, restore_rng) -> None:
    # with a padding row, normal_ is followed by that row zeroed: a constant over a run of
    # elements, applied to whatever part of it a slice holds
    torch.manual_seed(2)
    eager = nn.Embedding(50, 16, padding_idx=padding_idx)
    torch.manual_seed(2)
    deferred = deferred_init(nn.Embedding, 50, 16, padding_idx=padding_idx)
    for rows in (slice(10, 20), slice(2, 5), slice(3, 4), slice(0, 3)):
        plan = slice_plan(deferred.weight[rows])
        assert (plan.sliced, plan.source, plan.nbytes) == (True, "random fill", (rows.stop - rows.start) * 16 * 4)
        assert _bits(_quiet_materialize(deferred.weight[rows])).equal(_bits(eager.weight[rows])), rows
    if padding_idx is not None:
        assert not _quiet_materialize(deferred.weight[padding_idx]).any()


def test_rows_with_rng_fast_equal_the_rows_of_the_whole_fast_tensor(restore_rng) -> None:
    module = deferred_init(FusedExperts, INITS["normal_"])
    rows = materialize_tensor(module.gate_up_proj[1:3], rng="fast")
    whole = materialize_tensor(module.gate_up_proj, rng="fast")
    assert _bits(rows).equal(_bits(whole[1:3]))


class Constants(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ones = nn.Parameter(torch.ones(4, 3))
        self.full = nn.Parameter(torch.full((4, 3), 2.5))
        self.zeroed = nn.Parameter(nn.init.zeros_(torch.empty(4, 3)))
        self.filled = nn.Parameter(torch.empty(4, 3, dtype=torch.float64).fill_(-7.25))


@pytest.mark.parametrize("name", ["ones", "full", "zeroed", "filled"])
def test_rows_of_a_constant_are_that_constant(name) -> None:
    eager, deferred = Constants(), deferred_init(Constants)
    view = getattr(deferred, name)[1:3]
    assert slice_plan(view).source == "constant"
    rows = _quiet_materialize(view)
    assert rows.dtype == getattr(eager, name).dtype and _bits(rows).equal(_bits(getattr(eager, name)[1:3]))


def test_rows_of_a_checkpoint_read_are_read_alone(tmp_path, restore_rng) -> None:
    source = FusedExperts(INITS["uniform_"])
    save_file({k: v.detach().contiguous() for k, v in source.state_dict().items()}, tmp_path / "w.safetensors")
    deferred = deferred_init(FusedExperts, INITS["normal_"])
    load_checkpoint(deferred, tmp_path / "w.safetensors")
    view = deferred.gate_up_proj[3]
    assert slice_plan(view).source == "checkpoint read"
    assert _bits(_quiet_materialize(view)).equal(_bits(source.gate_up_proj[3]))


class ReadsThenConverts(nn.Module):
    """Checkpoint values changed after the read in ways that rows of the file alone do not give."""

    def __init__(self, path: str) -> None:
        super().__init__()
        import safetensors

        with safetensors.safe_open(path, framework="pt") as handle:
            # rounded through bfloat16 (`from_pretrained(dtype=torch.bfloat16).float()`)
            self.rounded = nn.Parameter(handle.get_tensor("square").to(torch.bfloat16).to(torch.float32))
            self.linear = nn.Linear(6, 6, bias=False)
            with torch.no_grad():
                self.linear.weight.copy_(handle.get_tensor("square").t())  # GPT-2's Conv1D, square
            self.transposed = nn.Parameter(handle.get_tensor("square").t().contiguous())
            self.embedding = nn.Embedding(6, 6)
            with torch.no_grad():
                self.embedding.weight.copy_(handle.get_tensor("square"))
                self.embedding.weight[5].copy_(self.embedding.weight[0])  # a new token's row from another
            overwritten = handle.get_tensor("square")  # last: eager's later reads would see the write
            with torch.no_grad():
                overwritten.copy_(torch.full((6, 6), 3.0))  # a real tensor copied over the read whole
            self.overwritten = nn.Parameter(overwritten)


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("rounded", "checkpoint read"),
        ("linear.weight", None),
        ("transposed", None),
        ("overwritten", None),
        ("embedding.weight", None),
    ],
)
def test_rows_of_a_checkpoint_value_changed_after_the_read_equal_eagers_rows(tmp_path, name, source) -> None:
    path = str(tmp_path / "square.safetensors")
    save_file({"square": torch.randn(6, 6, generator=torch.Generator().manual_seed(1))}, path)
    eager, deferred = ReadsThenConverts(path), deferred_init(ReadsThenConverts, path)
    view = deferred.get_parameter(name)[4:6]
    assert slice_plan(view).source == source
    if source is None:  # made whole, and said so
        with pytest.warns(WholeBaseWarning, match="its base is not made by position"):
            rows = materialize_tensor(view)
    else:
        rows = _quiet_materialize(view)
    assert _bits(rows).equal(_bits(eager.get_parameter(name)[4:6]))


def test_a_view_that_is_not_rows_makes_the_whole_base_and_warns(restore_rng) -> None:
    torch.manual_seed(1)
    eager = FusedExperts(INITS["normal_"])
    torch.manual_seed(1)
    deferred = deferred_init(FusedExperts, INITS["normal_"])
    plan = slice_plan(deferred.gate_up_proj[:, 2])
    assert (plan.sliced, plan.nbytes, plan.source) == (False, 5 * 6 * 7 * 4, None)
    assert plan.reason == "it is not a contiguous run of its base's elements (only rows are drawn alone: t[i], t[a:b])"
    expected = r"materializing a \[5, 7\] view of parameter 'gate_up_proj' \(140 bytes\) makes its whole base \(840 "
    with pytest.warns(WholeBaseWarning, match=expected):
        column = materialize_tensor(deferred.gate_up_proj[:, 2])
    assert _bits(column).equal(_bits(eager.gate_up_proj[:, 2]))


def test_a_tail_op_that_rounds_by_position_makes_the_whole_base_and_the_plan_says_so(restore_rng) -> None:
    # add_length_ is tagged pointwise but adds its run's length: rows alone would differ from eager's
    def scaled_then_lengthened(t: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return add_length_(nn.init.normal_(t))

    torch.manual_seed(3)
    eager = FusedExperts(scaled_then_lengthened)
    torch.manual_seed(3)
    deferred = deferred_init(FusedExperts, scaled_then_lengthened)
    reason = (
        "its run_length_test.add_length_.default rounds some float32 elements differently alone than in the "
        "whole tensor on cpu, so the base is made whole, as eager made it"
    )
    assert slice_plan(deferred.gate_up_proj[1:3]) == SlicePlan(False, 5 * 6 * 7 * 4, None, reason)
    with pytest.warns(WholeBaseWarning, match=re.escape(f"(840 bytes): {reason}")):
        rows = materialize_tensor(deferred.gate_up_proj[1:3])
    assert _bits(rows).equal(_bits(eager.gate_up_proj[1:3]))


def test_a_slice_is_memoized_and_leaves_the_generators_alone(restore_rng) -> None:
    deferred = deferred_init(FusedExperts, INITS["normal_"])
    view = deferred.gate_up_proj[2]
    state = torch.get_rng_state()
    first = _quiet_materialize(view)
    assert _quiet_materialize(view) is first
    assert torch.get_rng_state().equal(state)


def test_a_view_of_a_base_materialized_earlier_shares_its_memory(restore_rng) -> None:
    deferred = deferred_init(FusedExperts, INITS["normal_"])
    materialize_module(deferred)
    # the module now holds real tensors: a view of it is an ordinary real view
    assert slice_plan(deferred.gate_up_proj[1]) == slice_plan(torch.zeros(1))
    other = deferred_init(FusedExperts, INITS["normal_"])
    base = materialize_tensor(other.gate_up_proj)
    plan = slice_plan(other.gate_up_proj[1])
    assert (plan.sliced, plan.nbytes) == (False, 0)
    row = materialize_tensor(other.gate_up_proj[1])
    assert row.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def test_the_whole_base_warning_names_the_parameter_the_view_reads(restore_rng) -> None:
    # orthogonal_ copies a QR factor over the weight's kaiming_uniform_: not made by position
    def build() -> nn.Sequential:
        model = nn.Sequential(nn.Linear(4, 10))
        nn.init.orthogonal_(model[0].weight)
        return model

    torch.manual_seed(2)
    eager = build()
    torch.manual_seed(2)
    deferred = deferred_init(build)
    with pytest.warns(WholeBaseWarning) as caught:
        row = materialize_tensor(deferred[0].weight[3])
    assert [str(w.message) for w in caught] == [
        "materializing a [4] view of parameter '0.weight' (16 bytes) makes its whole base (160 bytes): its base "
        "is not made by position: aten.copy_.default after the fill reads another tensor"
    ]
    assert _bits(row).equal(_bits(eager[0].weight[3]))


class HoldsARow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        table = torch.empty(10, 4).normal_()
        self.register_buffer("table", table)
        self.register_buffer("row", table[3])


def test_a_view_the_module_holds_is_made_with_its_base_and_shares_its_memory(restore_rng) -> None:
    # made alone, it would be one row's cost but no longer alias the module's table as eager's does
    torch.manual_seed(4)
    eager = HoldsARow()
    torch.manual_seed(4)
    deferred = deferred_init(HoldsARow)
    assert slice_plan(deferred.row) == SlicePlan(False, 10 * 4 * 4, None, HELD_VIEW)
    assert slice_plan(deferred.table[3]).sliced  # a view made afterwards is made alone
    row, table = materialize_tensor(deferred.row), materialize_tensor(deferred.table)
    assert row.untyped_storage().data_ptr() == table.untyped_storage().data_ptr()
    assert _bits(row).equal(_bits(eager.row)) and _bits(table).equal(_bits(eager.table))


def test_a_random_factory_is_made_whole_and_the_reason_says_which_fill_would_be_drawn_by_rows():
    class Factories(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.by_factory = nn.Parameter(torch.randn(64, 8))
            self.by_fill = nn.Parameter(torch.empty(64, 8).normal_())  # the same draws, placed by row

    model = deferred_init(Factories)
    assert slice_plan(model.by_fill[3]).sliced
    assert slice_plan(model.by_factory[3]) == SlicePlan(
        False, 64 * 8 * 4, None,
        "its base is not made by position: it is made by a random factory (aten.randn.default), whose draws are "
        "not placed by row here: torch.empty(...) then an in-place fill (.normal_(), .uniform_()) draws the same "
        "numbers and is",
    )


def test_rows_of_a_checkpoint_changed_since_it_was_recorded_are_refused_as_the_whole_tensor_is(tmp_path):
    import os

    from explorer import MaterializationError

    path = tmp_path / "emb.safetensors"
    save_file({"weight": torch.arange(160.0).reshape(20, 8)}, str(path))
    model = deferred_init(nn.Embedding, 20, 8)
    load_checkpoint(model, path)
    save_file({"weight": torch.arange(160.0).reshape(20, 8) + 1000}, str(path))  # rewritten after the load
    os.utime(path, (1, 1))
    message = r"checkpoint .*emb\.safetensors changed since it was recorded .*: \"a \[2, 8\] view of parameter 'weight'\""
    with pytest.raises(MaterializationError, match=message):
        materialize_tensor(model.weight[3:5])
    path.unlink()  # removed: refused the same way, naming the tensor
    with pytest.raises(MaterializationError, match="changed since it was recorded"):
        materialize_tensor(model.weight[6:8])
