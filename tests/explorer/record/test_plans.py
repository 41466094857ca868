"""Per-op plans (note [Op plans] in record/plans.py): a recording that reuses plans across identical
layers writes exactly the graph of a recording without them, field by field, for transformers
decoders with several layers, timm models and PyTorch's own module_db entries; and the factories of
layers 2 to N are recorded from the plans the first layer made."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import transformers
from safetensors import safe_open
from torch import nn

from explorer import deferred_init, materialize_module
from explorer.record import modes
from explorer.record.checkpoint_reads import READ_SAFETENSORS
from explorer.record.lean_fake import FACTORIES
from explorer.record.plans import FactoryPlans, plans_disabled
from tests.support.graphs import assert_same_graph, graph_of
from tests.support.parity import same_bits

_DECODER = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def _llama(layers: int = 4) -> nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**_DECODER, num_hidden_layers=layers))


def _qwen2(layers: int = 4) -> nn.Module:
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_DECODER, num_hidden_layers=layers))


def _timm(name: str) -> Callable[[], nn.Module]:
    timm = pytest.importorskip("timm")
    return lambda: timm.create_model(name, pretrained=False, num_classes=10)


def _module_db_entry(name: str) -> Callable[[], nn.Module]:
    """The first constructor input of PyTorch's module_db entry `name`, in float32."""
    pytest.importorskip("expecttest")  # common_modules imports it
    was_frozen = torch.backends.flags_frozen()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_modules import module_db
    if not was_frozen:  # common_utils' import froze torch.backends flags for the whole session: undo
        torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
    info = next(entry for entry in module_db if entry.name == name)
    sample = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=False, training=True)[0]
    args, kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
    return lambda: info.module_cls(*args, **kwargs)


MODELS: dict[str, Callable[[], Callable[[], nn.Module]]] = {
    "llama, 4 layers": lambda: _llama,
    "qwen2, 4 layers": lambda: _qwen2,
    "timm vit_tiny_patch16_224": lambda: _timm("vit_tiny_patch16_224"),
    "timm resnet18": lambda: _timm("resnet18"),
    "module_db nn.TransformerEncoderLayer": lambda: _module_db_entry("nn.TransformerEncoderLayer"),
    "module_db nn.Conv2d": lambda: _module_db_entry("nn.Conv2d"),
    "module_db nn.Embedding": lambda: _module_db_entry("nn.Embedding"),
    "module_db nn.BatchNorm2d": lambda: _module_db_entry("nn.BatchNorm2d"),
    "module_db nn.MultiheadAttention": lambda: _module_db_entry("nn.MultiheadAttention"),
    "a stack of linears in float64 and bfloat16": lambda: (
        lambda: nn.Sequential(
            *(nn.Linear(8, 8, dtype=dtype) for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float32))
        )
    ),
    "full with int, float and bool fills": lambda: lambda: _Fills(),
}


class _Fills(nn.Module):
    """Factories whose signatures differ only by a fill's Python type (1, 1.0, True hash alike)."""

    def __init__(self) -> None:
        super().__init__()
        for index, value in enumerate((1, 1.0, True, 1, 1.0, True)):
            self.register_buffer(f"b{index}", torch.full((3,), value))
        with torch.inference_mode():
            self.register_buffer("inference", torch.full((3,), 1.0), persistent=False)
        torch.set_default_dtype(torch.float64)
        try:
            self.register_buffer("wide", torch.empty(2, 2).fill_(2.0))
        finally:
            torch.set_default_dtype(torch.float32)
        self.register_buffer("narrow", torch.empty(2, 2).fill_(2.0))


class _Counted(FactoryPlans):
    """The plan books of recordings, kept to read their counts."""

    made: list[FactoryPlans] = []

    def __init__(self) -> None:
        super().__init__()
        self.learned_ops: list[int] = []  # id() of each plan's op, in the order learned
        _Counted.made.append(self)

    def learn(self, key: tuple, plan) -> None:
        self.learned_ops.append(key[0])
        super().learn(key, plan)


def _record(build: Callable[[], nn.Module], monkeypatch: pytest.MonkeyPatch) -> tuple[nn.Module, FactoryPlans]:
    _Counted.made = []
    monkeypatch.setattr(modes, "FactoryPlans", _Counted)
    torch.manual_seed(0)
    module = deferred_init(build)
    assert len(_Counted.made) == 1
    return module, _Counted.made[0]


@pytest.mark.parametrize("name", MODELS)
def test_recording_with_plans_writes_the_graph_of_the_general_path(name, monkeypatch, restore_rng):
    build = MODELS[name]()
    planned, plans = _record(build, monkeypatch)
    with plans_disabled():
        torch.manual_seed(0)
        general = deferred_init(build)
    if not name.startswith("module_db"):  # a lone module_db entry may make no factory twice
        assert plans.hits > 0
    assert_same_graph(graph_of(planned), graph_of(general))
    torch.manual_seed(0)
    eager = build()
    materialize_module(planned)
    for (key, ours), (_, theirs) in zip(planned.state_dict().items(), eager.state_dict().items(), strict=True):
        assert same_bits(ours, theirs), key


@pytest.mark.parametrize("build", [_llama, _qwen2], ids=["llama", "qwen2"])
def test_layers_after_the_first_record_their_factories_from_plans(build, monkeypatch, restore_rng):
    one, one_plans = _record(lambda: build(1), monkeypatch)
    four, four_plans = _record(lambda: build(4), monkeypatch)
    factories = [sum(op.func in FACTORIES for op in graph_of(m).ops) for m in (one, four)]
    per_layer = (factories[1] - factories[0]) // 3
    assert per_layer > 0 and factories[1] - factories[0] == 3 * per_layer
    assert four_plans.learned == one_plans.learned  # layers 2 to 4 made no plan of their own...
    assert four_plans.hits - one_plans.hits == 3 * per_layer  # ...and reused the first layer's for every factory


def test_without_plans_no_plan_book_is_made(monkeypatch, restore_rng):
    _Counted.made = []
    monkeypatch.setattr(modes, "FactoryPlans", _Counted)
    with plans_disabled():
        deferred_init(_llama, 2)
    assert _Counted.made == []


def test_repeated_llama_layers_reuse_plans_and_write_the_general_records_graph(monkeypatch, restore_rng):
    """Plans and direct records together against neither: `GraphBuilder.record` for every op."""
    layers = 6
    planned, plans = _record(lambda: _llama(layers), monkeypatch)
    with plans_disabled(), monkeypatch.context() as patched:
        patched.setattr(modes.RecordingDispatchMode, "_record_directly", lambda *args: NotImplemented)
        torch.manual_seed(0)
        general = deferred_init(lambda: _llama(layers))
    factories = sum(op.func in FACTORIES for op in graph_of(planned).ops)
    # the first layer's plans serve the other five: at most one layer's worth of factories made
    # without a plan (the first use of each signature, and small CPU aranges, which get none)
    assert plans.hits > 0 and factories - plans.hits <= factories // layers
    assert_same_graph(graph_of(planned), graph_of(general))


def test_checkpoint_reads_of_one_layout_share_a_plan_and_write_the_general_paths_graph(
    tmp_path, monkeypatch, restore_rng
):
    """A read's file and key decide what it holds, not its layout: from_pretrained of a 4-layer
    Llama learns one plan per read layout, and the graph still names each read's own file and key."""
    torch.manual_seed(0)
    _llama(4).save_pretrained(tmp_path)
    load = lambda: transformers.LlamaForCausalLM.from_pretrained(tmp_path)  # noqa: E731
    planned, plans = _record(load, monkeypatch)
    with plans_disabled():
        general = deferred_init(load)
    assert_same_graph(graph_of(planned), graph_of(general))
    reads = [op for op in graph_of(planned).ops if op.func is READ_SAFETENSORS]
    layouts = {(tuple(op.args[2]), op.args[3]) for op in reads}
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as stored:
        assert sorted(op.args[1] for op in reads) == sorted(stored.keys())  # each key read once, by name
    assert plans.learned_ops.count(id(READ_SAFETENSORS)) == len(layouts) < len(reads)
    eager = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    materialize_module(planned)
    for (key, ours), (_, theirs) in zip(planned.state_dict().items(), eager.state_dict().items(), strict=True):
        assert same_bits(ours, theirs), key
