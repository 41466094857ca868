"""Hugging Face transformers parity: deferred_init + materialize_module equals eager construction.

For every tiny architecture of `hf_configs.HF_ARCHITECTURES` (decoder-only, encoder,
encoder-decoder, vision with drop-path schedules read by `.item()/.tolist()`, MoE, state-space):

* full materialization gives, for every parameter and buffer (duplicates included), the eager
  value bit for bit, with the same dtype, shape, stride, requires_grad and Python type, the same
  tie groups (one object wherever eager shares one), and leaves the global RNG state untouched;
* materializing one submodule at a time, in reverse module order, ends in the same state;
* a forward pass in eval mode gives outputs identical to the eager model's.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from explorer import deferred_init, is_deferred, is_fake, materialize_module
from explorer.record.fake import handle_of
from explorer.replay.replay import ReplayState
from tests.support.parity import assert_same_kind_and_layout, slots, tie_groups

pytest.importorskip("transformers")

from tests.support.hf_configs import HF_ARCHITECTURES, HFArchitecture, build_eager  # noqa: E402

SEED = 0
ARCHS = pytest.mark.parametrize("arch", HF_ARCHITECTURES, ids=[a.name for a in HF_ARCHITECTURES])


@functools.lru_cache(maxsize=None)
def eager_model(name: str) -> nn.Module:
    """The eager reference, built once per architecture and never modified."""
    arch = next(a for a in HF_ARCHITECTURES if a.name == name)
    return build_eager(arch, SEED).eval()


@functools.lru_cache(maxsize=None)
def eager_outputs(name: str) -> list[torch.Tensor]:
    # a model of its own: some forwards change their module (RWKV rescales its weights in eval mode)
    arch = next(a for a in HF_ARCHITECTURES if a.name == name)
    return forward(build_eager(arch, SEED), arch)


def build_deferred(arch: HFArchitecture) -> nn.Module:
    config = arch.config()
    torch.manual_seed(SEED)
    before = torch.get_rng_state()
    module = deferred_init(arch.cls, config)
    assert torch.equal(torch.get_rng_state(), before), "deferred_init advanced the global RNG"
    assert is_deferred(module)
    return module


def tensor_leaves(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensor_leaves(item)]
    return []  # caches and other objects


def forward(model: nn.Module, arch: HFArchitecture) -> list[torch.Tensor]:
    model.eval()
    with torch.no_grad():
        out = model(**arch.inputs())
    leaves = tensor_leaves(out.to_tuple())
    assert leaves, f"{arch.name}: forward returned no tensors"
    return leaves


_PLAIN = (int, float, bool, str, type(None))


def plain_attributes(module: nn.Module) -> dict[str, object]:
    """Scalar attributes set by the constructor (e.g. drop-path rates read with `.item()`)."""
    return {
        key: value for key, value in vars(module).items()
        if key != "training" and not key.startswith("_") and (
            isinstance(value, _PLAIN)
            or (isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value))
        )
    }


def assert_same_structure(module: nn.Module, arch: HFArchitecture) -> None:
    """Same submodules, same classes, same scalar attributes (values read inside constructors)."""
    eager = dict(eager_model(arch.name).named_modules())
    mine = dict(module.named_modules())
    assert list(mine) == list(eager), f"{arch.name}: submodule names differ"
    for name, sub in mine.items():
        assert type(sub) is type(eager[name]), f"{arch.name}: {name!r} is {type(sub).__name__}"
        assert plain_attributes(sub) == plain_attributes(eager[name]), f"{arch.name}: attributes of {name!r}"


def assert_equal_to_eager(module: nn.Module, arch: HFArchitecture) -> None:
    eager = eager_model(arch.name)
    assert type(module) is type(eager)
    assert_same_structure(module, arch)
    expected, actual = slots(eager), slots(module)
    assert [n for n, _ in actual] == [n for n, _ in expected], f"{arch.name}: parameter/buffer names differ"
    for (name, want), (_, got) in zip(expected, actual):
        where = f"{arch.name}: {name}"
        assert_same_kind_and_layout(where, got, want)
        assert got.requires_grad == want.requires_grad, f"{where}: requires_grad {got.requires_grad}"
        if not torch.equal(got, want):
            diff = (got.double() - want.double()).abs()
            raise AssertionError(
                f"{where}: values differ at {int((diff != 0).sum())}/{got.numel()} entries, "
                f"max |diff| {diff.max().item():.3g}"
            )
    assert tie_groups(actual) == tie_groups(expected), f"{arch.name}: tie groups differ"
    assert not is_deferred(module)


def assert_same_forward(module: nn.Module, arch: HFArchitecture) -> None:
    want = eager_outputs(arch.name)
    got = forward(module, arch)
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and torch.equal(g, w), f"{arch.name}: forward output {index} differs"


@ARCHS
def test_full_materialization_equals_eager(arch):
    module = build_deferred(arch)
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    assert materialize_module(module) is module
    assert torch.equal(torch.get_rng_state(), before), "materialize_module advanced the global RNG"
    assert_equal_to_eager(module, arch)
    assert_same_forward(module, arch)


@ARCHS
def test_reverse_submodule_by_submodule_equals_eager(arch):
    module = build_deferred(arch)
    graph = handle_of(next(module.parameters())).graph
    torch.manual_seed(4321)
    before = torch.get_rng_state()
    for _, sub in reversed(list(module.named_modules())):
        materialize_module(sub, check_fn=lambda m, sub=sub: m is sub)
        assert not any(is_fake(t) for t in [*sub._parameters.values(), *sub._buffers.values()] if t is not None)
    assert torch.equal(torch.get_rng_state(), before), "materialize_module advanced the global RNG"
    assert not is_deferred(module)
    assert ReplayState.of(graph).streams.jumps.count > 0, "the last modules were not reached by jumps"
    assert_equal_to_eager(module, arch)
    assert_same_forward(module, arch)
