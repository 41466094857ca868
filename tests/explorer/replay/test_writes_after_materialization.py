"""A storage with a real tensor and a fake at once (note [Writes after a tensor was made] in
explorer/replay/replay.py): what is recorded on the fake reaches the real tensor, as eager's one
memory would show it, and the results stay one memory."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from explorer import MaterializationError, deferred, deferred_init, is_fake, materialize_module, materialize_tensor
from explorer.record.fake import handle_of


def _pointer(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def test_a_weight_looked_at_then_reinitialized_is_the_one_reinitialized_tensor(restore_rng):
    torch.manual_seed(0)
    eager = nn.Linear(16, 16)
    nn.init.normal_(eager.weight)
    torch.manual_seed(0)
    model = deferred_init(nn.Linear, 16, 16)
    looked = materialize_tensor(model.weight)
    nn.init.normal_(model.weight)  # recorded on the fake: a random op after the look
    assert torch.equal(looked, eager.weight)  # the tensor looked at shows it, as eager's one tensor
    materialize_module(model)
    assert model.weight is looked
    assert torch.equal(model.weight, eager.weight) and torch.equal(model.bias, eager.bias)


def test_a_checkpoint_loaded_after_a_look_reaches_every_tensor(restore_rng):
    model = deferred_init(nn.Linear, 4, 4)
    looked = materialize_tensor(model.weight)
    model.load_state_dict({"weight": torch.ones(4, 4), "bias": torch.full((4,), 2.0)})
    materialize_module(model)
    assert model.weight is looked and looked.tolist() == [[1.0] * 4] * 4
    assert model.bias.tolist() == [2.0] * 4


def test_freezing_and_tagging_after_a_look_are_kept(restore_rng):
    model = deferred_init(nn.Linear, 4, 4)
    looked = materialize_tensor(model.weight)
    model.weight.requires_grad_(False)
    model.weight._no_weight_decay = True
    materialize_module(model)
    assert model.weight is looked
    assert model.weight.requires_grad is False and model.weight._no_weight_decay is True


class _Holder(nn.Module):
    def __init__(self, view: torch.Tensor | None = None) -> None:
        super().__init__()
        if view is None:
            self.register_buffer("full", torch.randn(6, 4))
        else:
            self.register_buffer("row", view)


class _SharedRow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.x = _Holder()
        self.y = _Holder(self.x.full[2])  # y.row views x.full's memory


@pytest.mark.parametrize("first", ["x", "y"])
@pytest.mark.parametrize("edit", ["zero the row", "fill the base"])
def test_a_write_through_the_deferred_side_of_shared_memory_reaches_the_materialized_side(first, edit, restore_rng):
    def apply(model: _SharedRow) -> None:
        if edit == "zero the row":
            model.y.row.zero_()
        else:
            model.x.full.fill_(5.0)

    torch.manual_seed(0)
    eager = _SharedRow()
    apply(eager)
    torch.manual_seed(0)
    model = deferred_init(_SharedRow)
    materialize_module(getattr(model, first))
    apply(model)  # recorded on the other, still deferred side
    assert is_fake(getattr(model, "y" if first == "x" else "x").state_dict()[("row" if first == "x" else "full")])
    materialize_module(model)
    assert torch.equal(model.x.full, eager.x.full) and torch.equal(model.y.row, eager.y.row)
    assert _pointer(model.x.full) == _pointer(model.y.row) and model.y.row.storage_offset() == 8  # one memory


def test_a_tie_between_modules_of_a_deferred_block_stays_one_tensor(restore_rng):
    def build() -> tuple[nn.Module, nn.Module]:
        encoder, decoder = nn.Embedding(20, 8), nn.Linear(8, 20, bias=False)
        decoder.weight = encoder.weight
        return encoder, decoder

    with deferred():
        encoder, decoder = build()
    materialize_module(decoder)
    assert encoder.weight is decoder.weight
    encoder.load_state_dict({"weight": torch.full((20, 8), 7.0)})  # an eager write now, to the one tensor
    assert decoder.weight.eq(7.0).all()


def test_a_tie_whose_root_was_dropped_gets_the_write_on_both_sides(restore_rng):
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.head = nn.Embedding(20, 8), nn.Linear(8, 20, bias=False)
            self.head.weight = self.emb.weight

    model = deferred_init(Net)
    emb, head = model.emb, model.head
    del model
    gc.collect()
    materialize_module(head)
    emb.load_state_dict({"weight": torch.full((20, 8), 7.0)})  # recorded on emb's fake
    assert head.weight.eq(7.0).all()
    materialize_module(emb)
    assert emb.weight is head.weight


def test_a_write_to_memory_whose_real_tensor_was_changed_in_place_is_refused_and_not_recorded(restore_rng):
    model = deferred_init(nn.Linear, 4, 4)
    looked = materialize_tensor(model.weight)
    with torch.no_grad():
        looked.add_(1)  # the real tensor now differs from what the recording says
    before = looked.clone()
    graph = handle_of(model.weight).graph
    recorded = len(graph.ops)
    with pytest.raises(MaterializationError) as caught:
        nn.init.zeros_(model.weight)
    message = str(caught.value)
    assert message.startswith("aten.zero_.default at "), message
    assert message.endswith(
        "writes a float32[4, 4] tensor whose memory was materialized and then changed in place; the write cannot be "
        "applied to those changed values. Materialize the module that holds it and write the real tensor, or write "
        "before changing the materialized one"
    )
    assert torch.equal(looked, before)
    assert len(graph.ops) == recorded
    materialize_module(model)
    assert model.weight is looked and torch.equal(model.weight, before)  # the zero_ was not recorded


class _ViewsItsWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.randn(6, 6))
        self.q = nn.Parameter(self.p.data[1:3])  # q views p's memory, as in eager


def test_results_stay_one_memory_after_the_first_result_is_collected(restore_rng):
    model = deferred_init(_ViewsItsWeight)
    looked_p = materialize_tensor(model.p)
    looked_q = materialize_tensor(model.q)
    del looked_p
    gc.collect()
    materialize_module(model)
    assert model.q is looked_q
    assert _pointer(model.q) == _pointer(model.p) and model.q.storage_offset() == 6


@pytest.mark.parametrize("first, second", [(None, "cpu"), ("cpu", "cpu:0"), ({"cpu": "cpu"}, None)],
                         ids=["none-cpu", "cpu-cpu0", "map-none"])
def test_two_calls_naming_the_same_device_differently_share_results(first, second, restore_rng):
    model = deferred_init(_ViewsItsWeight)
    materialize_module(model, check_fn=lambda sub: False)  # nothing
    p = materialize_tensor(model.p, device=first)
    q = materialize_tensor(model.q, device=second)
    assert _pointer(q) == _pointer(p) and q.storage_offset() == 6
    assert materialize_tensor(model.p, device=second) is p


def test_a_write_in_a_surgery_block_after_a_look_reaches_the_tensor_looked_at(restore_rng):
    torch.manual_seed(0)
    eager = nn.Linear(6, 6)
    with torch.no_grad():
        eager.weight[2:4].zero_()
        eager.bias.copy_(eager.weight.sum(0))
    torch.manual_seed(0)
    model = deferred_init(nn.Linear, 6, 6)
    looked = materialize_tensor(model.weight)
    with deferred(model), torch.no_grad():
        model.weight[2:4].zero_()  # a write through a view, recorded in the block
        model.bias.copy_(model.weight.sum(0))
    assert torch.equal(looked, eager.weight)
    materialize_module(model)
    assert model.weight is looked and torch.equal(model.bias, eager.bias)


def test_a_block_writing_memory_whose_real_tensor_changed_is_refused_at_that_write(restore_rng):
    model = deferred_init(nn.Linear, 4, 4)
    looked = materialize_tensor(model.weight)
    with torch.no_grad():
        looked.mul_(2)
    with pytest.raises(MaterializationError, match=r"^aten\.fill_\.Scalar at .* writes a float32\[4, 4\] tensor whose memory"):
        with deferred(model), torch.no_grad():
            model.weight.fill_(1.0)


def test_a_write_to_a_base_reaches_a_view_result_that_outlived_the_base_result(restore_rng):
    torch.manual_seed(0)
    eager = _ViewsItsWeight()
    with torch.no_grad():
        nn.init.zeros_(eager.p)
    torch.manual_seed(0)
    model = deferred_init(_ViewsItsWeight)
    looked_p, looked_q = materialize_tensor(model.p), materialize_tensor(model.q)
    del looked_p
    gc.collect()
    nn.init.zeros_(model.p)  # recorded on the fake base
    assert torch.equal(looked_q, eager.q)
    materialize_module(model)
    assert torch.equal(model.p, eager.p) and model.q is looked_q


def test_a_write_reading_a_real_tensor_changed_since_reads_it_as_it_is_now(restore_rng):
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(3))

    torch.manual_seed(0)
    eager = Pair()
    with torch.no_grad():
        eager.b.add_(1)
        eager.a.copy_(eager.b)
    torch.manual_seed(0)
    model = deferred_init(Pair)
    looked_a, looked_b = materialize_tensor(model.a), materialize_tensor(model.b)
    with torch.no_grad():
        looked_b.add_(1)  # the real b changes; b's memory is not written through the fake
        model.a.copy_(model.b)
    assert torch.equal(looked_a, eager.a)
    materialize_module(model)
    assert torch.equal(model.a, eager.a) and model.b is looked_b


def test_a_row_made_alone_is_made_anew_after_a_write_to_its_base(restore_rng):
    model = deferred_init(nn.Linear, 8, 8)
    row = model.weight[2]
    first = materialize_tensor(row)
    nn.init.zeros_(model.weight)
    assert materialize_tensor(row).tolist() == [0.0] * 8
    assert first.abs().sum() > 0  # a row made alone is its own memory: what it was when made


def test_results_stay_shared_after_the_graph_records_on_a_new_device(restore_rng):
    model = deferred_init(_SharedRow)
    materialize_module(model.x)
    with deferred(model):
        model.extra = nn.Linear(2, 2, device="meta")  # a device the recording had not seen
    materialize_module(model.y)
    assert _pointer(model.y.row) == _pointer(model.x.full)


def test_a_block_that_raises_still_brings_what_it_recorded_to_the_tensors_looked_at(restore_rng):
    model = deferred_init(nn.Linear, 4, 4)
    looked_weight, looked_bias = materialize_tensor(model.weight), materialize_tensor(model.bias)
    with torch.no_grad():
        looked_weight.mul_(2)
    with pytest.raises(MaterializationError):
        with deferred(model), torch.no_grad():
            model.bias.fill_(7.0)  # recorded
            model.weight.fill_(1.0)  # refused: the real weight changed
    assert looked_bias.tolist() == [7.0] * 4
    assert materialize_tensor(model.bias, rng="fast").tolist() == [7.0] * 4


@pytest.mark.parametrize("layout_op", ["t_", "unsqueeze_"])
def test_an_in_place_layout_change_after_a_look_is_made_on_the_tensor_looked_at(layout_op, restore_rng):
    def apply(tensor: torch.Tensor) -> None:
        tensor.t_() if layout_op == "t_" else tensor.unsqueeze_(0)

    torch.manual_seed(0)
    eager = _Holder()
    apply(eager.full)
    torch.manual_seed(0)
    model = deferred_init(_Holder)
    looked = materialize_tensor(model.full)
    apply(model.full)
    assert materialize_tensor(model.full) is looked and torch.equal(looked, eager.full)
    assert looked.stride() == eager.full.stride()


def test_a_cast_after_a_look_converts_the_tensor_looked_at(restore_rng):
    torch.manual_seed(0)
    eager = nn.Linear(4, 4)
    eager_weight = eager.weight
    eager.half()
    torch.manual_seed(0)
    model = deferred_init(nn.Linear, 4, 4)
    looked = materialize_tensor(model.weight)
    model.half()
    materialize_module(model)
    assert model.weight is looked and looked.dtype == torch.float16 and eager_weight.dtype == torch.float16
    assert torch.equal(looked, eager.weight)


def test_progress_counts_a_tensor_looked_at_before(restore_rng):
    model = deferred_init(nn.Linear, 4, 4)
    materialize_tensor(model.weight)
    calls: list[tuple] = []
    materialize_module(model, progress=lambda *report: calls.append(report))
    assert calls[-1] == (2, 2, 80, 80) and calls[0] == (1, 2, 64, 80)
