"""`nn.init.trunc_normal_` (rejection sampling that reads its own draws) is one recorded op under
deferred_init: no value is computed while recording, and replay draws exactly eager's numbers."""

from __future__ import annotations

import torch
import torch.nn.init as init
import transformers
from torch import nn

from explorer import deferred_init, materialize_module, materialize_tensor
from explorer.record.fake import handle_of
from explorer.record.initializers import TRUNC_NORMAL


class Truncated(nn.Module):
    """Both sampling branches of trunc_normal_ (p > 0.3: normal_ then redraws; else uniform_
    proposals), float32 and float64, with a plain normal_ between them."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Parameter(torch.empty(200, 30))
        nn.init.trunc_normal_(self.wide, std=0.02)
        self.precise = nn.Parameter(torch.empty(10, dtype=torch.float64))
        nn.init.trunc_normal_(self.precise, a=-0.5, b=0.5)
        self.plain = nn.Parameter(torch.empty(50).normal_())
        self.narrow = nn.Parameter(torch.empty(300, 4))
        nn.init.trunc_normal_(self.narrow, mean=3.0, std=1.0, a=2.9, b=3.1)


def test_trunc_normal_is_one_recorded_op_and_reads_no_value() -> None:
    module = deferred_init(Truncated)
    graph = handle_of(module.wide).graph
    names = [str(op.func) for op in graph.ops]
    assert names.count("explorer.trunc_normal_.default") == 3
    assert not any("_local_scalar_dense" in name or name.endswith(".item") for name in names)
    assert [graph.ops[i].func for i in graph.random_streams["cpu"]] == \
        [TRUNC_NORMAL, TRUNC_NORMAL, torch.ops.aten.normal_.default, TRUNC_NORMAL]


def test_trunc_normal_materializes_as_eager_in_any_order(restore_rng) -> None:
    torch.manual_seed(12)
    eager = Truncated()
    torch.manual_seed(12)
    module = deferred_init(Truncated)
    module.narrow = materialize_tensor(module.narrow)  # skips over two trunc_normal_ and a normal_
    module.plain = materialize_tensor(module.plain)
    materialize_module(module)
    for name, want in eager.named_parameters():
        assert torch.equal(getattr(module, name), want), name


def test_rng_fast_runs_the_real_sampler(restore_rng) -> None:
    module = deferred_init(Truncated)
    materialize_module(module, rng="fast")
    assert module.narrow.min() >= 2.9 and module.narrow.max() <= 3.1
    assert module.precise.abs().max() <= 0.5


def test_the_initializer_is_restored_after_deferred_init_and_after_a_failure() -> None:
    original = init._no_grad_trunc_normal_
    deferred_init(Truncated)
    assert init._no_grad_trunc_normal_ is original

    def fails() -> nn.Module:
        nn.init.trunc_normal_(torch.empty(3))
        raise KeyError("boom")

    try:
        deferred_init(fails)
    except KeyError:
        pass
    assert init._no_grad_trunc_normal_ is original
    real = torch.empty(100)
    nn.init.trunc_normal_(real, a=-1.0, b=1.0)  # outside: the real sampler
    assert real.abs().max() <= 1.0


def test_a_transformers_model_using_trunc_normal_matches_eager(restore_rng) -> None:
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=37, image_size=8, patch_size=4)
    torch.manual_seed(3)
    eager = transformers.ViTModel(config)
    torch.manual_seed(3)
    module = deferred_init(transformers.ViTModel, config)
    graph = handle_of(next(module.parameters())).graph
    assert any(op.func is TRUNC_NORMAL for op in graph.ops)
    materialize_module(module)
    for name, want in eager.state_dict().items():
        assert torch.equal(module.state_dict()[name], want), name
