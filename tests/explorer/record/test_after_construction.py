"""What users do to a deferred module after `deferred_init` — casts, moves, re-initialization,
checkpoints — is recorded, and materializing gives what eager construction followed by the same
calls gives: bytes, dtype, device, Parameter-ness, requires_grad, ties."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from inspect import getsourcelines
from typing import Callable

import pytest
import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from explorer import DeferredInitError, MaterializationError, deferred_init, inspect, is_deferred, is_fake, materialize_module
from explorer.record.fake import handle_of
from explorer.replay.replay import ReplayState


class Tied(nn.Module):
    """Embedding tied to the head, a BatchNorm (float and int64 buffers), a buffer view."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 4))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("table", torch.arange(6.0))
        self.register_buffer("window", self.table[1:4])


CHECKPOINT = {name: value.detach() * 0 + index for index, (name, value) in enumerate(Tied().state_dict().items())}

ACTIONS: dict[str, Callable[[nn.Module], object]] = {
    "half": lambda m: m.half(),
    "bfloat16": lambda m: m.bfloat16(),
    "to(float64)": lambda m: m.to(torch.float64),
    "double": lambda m: m.double(),
    "half then float": lambda m: m.half().float(),
    "type(float16)": lambda m: m.type(torch.float16),
    "to(meta)": lambda m: m.to("meta"),
    "cpu": lambda m: m.cpu(),
    "requires_grad_(False)": lambda m: m.requires_grad_(False),
    "nn.init after": lambda m: nn.init.xavier_normal_(m.body[0].weight),
    "load_state_dict": lambda m: m.load_state_dict(CHECKPOINT),
    "load_state_dict partial": lambda m: m.load_state_dict(
        {k: v for k, v in CHECKPOINT.items() if k.startswith("body.0.")}, strict=False),
    "load_state_dict assign": lambda m: m.load_state_dict(CHECKPOINT, assign=True),
    "load then half": lambda m: m.load_state_dict(CHECKPOINT).__class__ and m.half(),
    # `.data = x` never reaches the dispatcher; nothing uses these tensors again before materializing
    ".data = a computed tensor": lambda m: setattr(m.body[0].weight, "data", m.body[0].weight.data * 3),
    ".data = another parameter's row": lambda m: setattr(m.body[2].bias, "data", m.head.weight.data[2]),
}


def named_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]


def assert_same_as_eager(got_module: nn.Module, want_module: nn.Module, ties: bool = True) -> None:
    got, want = named_tensors(got_module), named_tensors(want_module)
    assert [n for n, _ in got] == [n for n, _ in want]
    for (name, g), (_, w) in zip(got, want):
        assert not is_fake(g), name
        assert (type(g), g.dtype, g.device, g.shape, g.stride(), g.requires_grad) == \
            (type(w), w.dtype, w.device, w.shape, w.stride(), w.requires_grad), name
        if w.device.type != "meta":
            assert g.reshape(-1).view(torch.uint8).equal(w.reshape(-1).view(torch.uint8)), name
    if ties:
        assert (got_module.head.weight is got_module.embed.weight) == \
            (want_module.head.weight is want_module.embed.weight)
    if want_module.table.device.type != "meta":  # a view stays one only where eager keeps it one

        def window_views_table(module: nn.Module) -> bool:
            return module.window.data_ptr() == module.table.data_ptr() + module.table.element_size()

        assert window_views_table(got_module) == window_views_table(want_module)


@pytest.mark.parametrize("rng", ["eager", "fast"])
@pytest.mark.parametrize("action", ACTIONS)
def test_after_construction_materializes_as_eager_then_the_same_call(action: str, rng: str, restore_rng) -> None:
    torch.manual_seed(3)
    eager = Tied()
    ACTIONS[action](eager)
    torch.manual_seed(3)
    module = deferred_init(Tied)
    ACTIONS[action](module)
    if action != "load_state_dict assign":  # assign puts the checkpoint's own tensors in
        assert [n for n, t in named_tensors(module) if is_fake(t)], "nothing left deferred"
    materialize_module(module, rng=rng)
    if rng == "eager" or action.startswith("load_state_dict") and action != "load_state_dict partial":
        # a full checkpoint overwrites every random value. Eager `.to("meta")` gives every parameter
        # a new object (a meta tensor cannot be set as a CPU parameter's .data), untying the head
        # from the embedding; fake parameters are swapped in place and stay tied (README Limitations).
        assert_same_as_eager(module, eager, ties=action != "to(meta)")
    else:
        assert [n for n, t in named_tensors(module) if is_fake(t)] == []


def test_data_set_to_a_real_tensor_is_refused_naming_the_parameter_and_changes_nothing() -> None:
    module = deferred_init(Tied)
    fake = module.body[0].weight
    module.body[0].weight.data = torch.ones(8, 4)
    advice = (
        "had its .data set to a real tensor after deferred_init (noticed at materialization); a deferred "
        "tensor can only take deferred data. Replace the parameter instead (module.weight = nn.Parameter(x)), "
        "or copy into it (with torch.no_grad(): module.weight.copy_(x))"
    )
    with pytest.raises(MaterializationError) as caught:
        materialize_module(module)
    assert str(caught.value) == f"cannot materialize 'body.0.weight': parameter 'body.0.weight' (shape (8, 4), float32) {advice}"
    assert module.body[0].weight is fake and all(is_fake(t) for _, t in named_tensors(module))
    with pytest.raises(DeferredInitError, match=r"parameter 'body.0.weight' \(shape \(8, 4\), float32\) had its .data set"):
        module.body[0].weight.mul(2)  # the next op says the same, at its own line


class SwapsInData(nn.Module):
    def __init__(self, pretrained: torch.Tensor) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.embed.weight.data = pretrained  # a real tensor from outside
        self.embed.weight.data.mul_(2)


def test_data_set_to_a_real_tensor_inside_the_constructor_is_refused_at_the_next_op() -> None:
    lines, first = getsourcelines(SwapsInData.__init__)
    lineno = first + next(i for i, text in enumerate(lines) if "mul_(2)" in text)  # the op that noticed
    with pytest.raises(DeferredInitError) as caught:
        deferred_init(SwapsInData, torch.arange(15.0).view(5, 3))
    assert str(caught.value).startswith(
        "a deferred tensor (shape (5, 3), float32) had its .data set to a real tensor inside the constructor "
        f"(noticed at {__file__}:{lineno} in __init__); a deferred tensor can only take deferred data."
    )


@pytest.mark.parametrize("cast", [lambda m: m.half(), lambda m: m.to(torch.bfloat16), lambda m: m.double()],
                         ids=["half", "to-bfloat16", "double"])
def test_a_cast_keeps_attributes_and_requires_grad_set_on_parameters_as_eager(cast) -> None:
    eager, model = nn.Linear(4, 4), deferred_init(nn.Linear, 4, 4)
    for module in (eager, model):
        module.weight._no_weight_decay = True
        module.weight.requires_grad_(False)
        cast(module)
    assert model.weight._no_weight_decay is True and model.weight.requires_grad is False
    materialize_module(model)
    assert (model.weight.dtype, model.weight._no_weight_decay, model.weight.requires_grad) == (
        eager.weight.dtype, eager.weight._no_weight_decay, eager.weight.requires_grad
    )


def test_casts_are_visible_before_materializing() -> None:
    module = deferred_init(Tied)
    module.half()
    assert module.body[0].weight.dtype == torch.float16 and is_fake(module.body[0].weight)
    assert isinstance(module.body[0].weight, nn.Parameter)
    assert module.body[1].num_batches_tracked.dtype == torch.int64  # half() leaves integers alone
    table = inspect(module).tensors.set_index("name")
    assert table.loc["body.0.weight", "dtype"] == "float16"
    graph = handle_of(module.body[0].weight).graph
    after = [str(op.func) for op in graph.ops[graph.constructor_ops:]]
    # 7 float parameters (the tied head is the embedding's) and 4 float buffers, num_batches_tracked kept
    assert after.count("aten._to_copy.default") == 11
    # nn.Parameter around each cast parameter, and once more for the tied head, already float16
    assert after.count("aten.detach.default") == 8


def test_a_loaded_checkpoint_makes_the_init_ops_dead_and_draws_nothing(restore_rng) -> None:
    torch.manual_seed(0)
    module = deferred_init(Tied)
    module.load_state_dict(CHECKPOINT)
    graph = handle_of(module.body[0].weight).graph
    materialize_module(module)
    streams = ReplayState.of(graph).streams
    assert streams.jumps.scratch_runs == 0
    # no fill ran: every random op's storage is overwritten by the checkpoint's copy_
    assert torch.equal(module.body[0].weight, CHECKPOINT["body.0.weight"])


def test_state_dict_of_a_deferred_module_holds_fakes() -> None:
    module = deferred_init(Tied)
    state = module.state_dict()
    assert all(is_fake(t) for t in state.values())
    assert state["head.weight"] is state["embed.weight"] or state["head.weight"].shape == (10, 4)


def test_partial_checkpoint_leaves_the_rest_deferred() -> None:
    module = deferred_init(Tied)
    module.load_state_dict({"body.0.weight": CHECKPOINT["body.0.weight"]}, strict=False)
    materialize_module(module.body[0])
    assert torch.equal(module.body[0].weight, CHECKPOINT["body.0.weight"])
    assert is_deferred(module.body[2]) and is_deferred(module.embed)


def test_assign_loads_the_checkpoints_own_tensors() -> None:
    module = deferred_init(Tied)
    checkpoint = {k: v.clone() for k, v in CHECKPOINT.items()}
    module.load_state_dict(checkpoint, assign=True)
    assert module.body[0].weight.data_ptr() == checkpoint["body.0.weight"].data_ptr()
    assert not is_deferred(module)


def test_a_saved_transformers_model_loads_into_a_deferred_one(tmp_path, restore_rng) -> None:
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    torch.manual_seed(9)
    saved = transformers.LlamaForCausalLM(config)
    saved.save_pretrained(tmp_path, safe_serialization=True)
    weights = load_file(str(tmp_path / "model.safetensors"))
    torch.manual_seed(1)  # another seed: every value must come from the file
    module = deferred_init(transformers.LlamaForCausalLM, config)
    result = module.load_state_dict(weights, strict=False)
    assert result.unexpected_keys == []
    materialize_module(module)
    for name, value in saved.state_dict().items():
        assert torch.equal(module.state_dict()[name], value), name



def test_a_compiled_submodule_called_by_a_constructor_is_recorded_as_its_forward(tmp_path) -> None:
    # note [Compiled code in a constructor]: before, dynamo traced the recorder's fakes and failed in
    # its own internals (aten::equal on meta tensors). In a process of its own, as the test below.
    script = tmp_path / "compiled_in_init.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from explorer import deferred_init, materialize_module

        class WarmedUp(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.compile(nn.Linear(4, 4), backend="eager")
                with torch.no_grad():
                    self.register_buffer("warm", self.proj(torch.ones(1, 4)))  # a warm-up pass

        torch.manual_seed(0)
        eager = WarmedUp()
        torch.manual_seed(0)
        model = materialize_module(deferred_init(WarmedUp))
        after = model.proj(torch.ones(1, 4))  # compiles for real now
        print([torch.equal(model.warm, eager.warm), torch.equal(model.proj.weight, eager.proj.weight),
               torch.equal(after, eager.proj(torch.ones(1, 4)))])
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[True, True, True]"


def test_torch_compile_of_a_deferred_model_records_the_forward_as_calling_it_does(tmp_path) -> None:
    # note [A deferred model under torch.compile]: before, dynamo compiled the recorder's own frames
    # and AOT autograd failed with "Invalid mt19937 state". In a process of its own: dynamo, once
    # used, patches nn.Module.__init__ for good.
    script = tmp_path / "compiled.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from explorer import deferred_init, is_fake, materialize_module, materialize_tensor

        def two_layers():
            return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))

        torch.manual_seed(0)
        model = deferred_init(two_layers)
        compiled = torch.compile(model, backend="aot_eager")
        x = torch.randn(2, 4)
        out = compiled(x)
        torch.manual_seed(0)
        eager = two_layers()
        checks = [is_fake(out), tuple(out.shape) == (2, 2), torch.equal(materialize_tensor(out), eager(x))]
        materialize_module(model)
        real_out = compiled(x)  # the same compiled module, now over real tensors
        checks += [not is_fake(real_out), torch.equal(real_out, eager(x))]
        print(checks)
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[True, True, True, True, True]"


def test_setting_a_real_tensor_to_a_deferred_ones_memory_is_refused_with_the_fix():
    model = deferred_init(lambda: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
    materialize_module(model[0])
    before = model[0].bias.detach().clone()
    with pytest.raises(DeferredInitError) as caught, torch.no_grad():
        model[0].bias.set_(model[1].weight.detach()[0].clone())
    assert str(caught.value).startswith("aten.set_.source_Tensor writes values of a deferred model into a real tensor")
    assert "Run this code inside `with explorer.deferred(model): ...`" in str(caught.value)
    assert torch.equal(model[0].bias, before) and is_deferred(model[1].weight)
