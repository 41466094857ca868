"""Steps after construction give eager's bytes or a clear refusal, never a silent difference.

Each test runs one program twice, eagerly and on a deferred model, and compares bit for bit. The
first four are the programs reported in "Equal or refused"; they are run here as pytest tests, and
`test_the_reported_programs_also_hold_in_a_plain_script` runs them in a fresh interpreter.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import explorer
from explorer import DeferredInitError, MaterializationError, deferred_init, materialize_module


def two_linears() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))


def assert_same_bytes(module: nn.Module, reference: nn.Module) -> None:
    got, want = module.state_dict(), reference.state_dict()
    assert list(got) == list(want)
    different = [name for name in want if got[name].dtype != want[name].dtype or not torch.equal(got[name], want[name])]
    assert different == []


def run_both(build, after) -> tuple[nn.Module, nn.Module]:  # noqa: ANN001
    """`after(model)` run after building eagerly and deferred from seed 0; the deferred one materialized."""
    torch.manual_seed(0)
    eager = build()
    after(eager)
    torch.manual_seed(0)
    deferred = deferred_init(build)
    after(deferred)
    materialize_module(deferred)
    return eager, deferred


# -- random ops after construction follow the user's program ---------------------------------
@pytest.mark.parametrize(
    "between",
    [
        lambda: None,
        lambda: torch.randn(10),
        lambda: torch.manual_seed(3),
        lambda: torch.manual_seed(0),
        lambda: (torch.randn(100), torch.manual_seed(5), torch.rand(7)),
    ],
    ids=["nothing", "eager-draws", "reseed", "reseed-same-seed", "draws-reseed-draws"],
)
def test_a_reinit_after_construction_draws_what_eager_draws_at_that_point(between):
    def after(model: nn.Module) -> None:
        between()
        nn.init.normal_(model[1].weight)

    eager, deferred = run_both(two_linears, after)
    assert_same_bytes(deferred, eager)


def test_a_reinit_ignores_generator_states_cached_before_it_was_recorded():
    torch.manual_seed(0)
    eager_first, eager_second = two_linears(), two_linears()
    torch.randn(5)
    nn.init.normal_(eager_first[0].weight)
    torch.manual_seed(0)
    first, second = deferred_init(two_linears), deferred_init(two_linears)
    materialize_module(second)  # continues after `first`'s last draw: caches that state in `first`
    torch.randn(5)
    nn.init.normal_(first[0].weight)  # at that position of `first`'s stream, from elsewhere
    materialize_module(first)
    assert_same_bytes(first, eager_first)
    assert_same_bytes(second, eager_second)


def test_a_saved_rng_state_set_back_still_owes_the_deferred_draws():
    saved = {}

    def after(model: nn.Module) -> None:
        saved["state"] = torch.get_rng_state()
        torch.randn(50)
        torch.set_rng_state(saved["state"])
        nn.init.uniform_(model[0].weight)
        with torch.random.fork_rng():
            torch.randn(9)
        nn.init.normal_(model[1].bias)

    eager, deferred = run_both(two_linears, after)
    assert_same_bytes(deferred, eager)


def test_a_second_deferred_model_starts_where_eager_construction_of_the_first_left_the_generator():
    torch.manual_seed(0)
    first, second = two_linears(), two_linears()
    torch.randn(3)
    third = nn.Linear(8, 8)
    torch.manual_seed(0)
    deferred_first, deferred_second = deferred_init(two_linears), deferred_init(two_linears)
    torch.randn(3)
    deferred_third = deferred_init(nn.Linear, 8, 8)
    for module in (deferred_third, deferred_second, deferred_first):  # any order
        materialize_module(module)
    for module, reference in ((deferred_first, first), (deferred_second, second), (deferred_third, third)):
        assert_same_bytes(module, reference)


def truncated() -> nn.Module:
    module = nn.Linear(8, 8)
    nn.init.trunc_normal_(module.weight)  # rejection sampling: its draw count depends on its values
    return module


def test_eager_draws_after_a_value_dependent_draw_count_are_counted_by_running_it():
    def after(model: nn.Module) -> None:
        torch.randn(100)
        nn.init.normal_(model.bias)

    eager, deferred = run_both(truncated, after)
    assert_same_bytes(deferred, eager)


def test_a_cached_normal_sample_set_by_eager_code_while_draws_are_owed_refuses_the_op_that_reads_it():
    torch.manual_seed(0)
    model = deferred_init(two_linears)
    torch.randn(3)  # 3 elements: sets the cached normal sample from the real (not eager's) words
    nn.init.normal_(model[1].bias)  # 8 elements: reads it
    materialize_module(model[0])  # built before: eager's values
    torch.manual_seed(0)
    assert_same_bytes(model[0], two_linears()[0])
    with pytest.raises(MaterializationError) as error:
        materialize_module(model)
    message = str(error.value)
    assert message.startswith("aten.normal_.default (recorded at ")
    assert "may read the CPU generator's cached normal sample, and eager code set that sample" in message
    assert message.endswith("Call torch.manual_seed(...) before recording this op, or materialize before those eager draws")
    assert explorer.is_deferred(model[1].bias)


def tiny_normal() -> nn.Module:
    module = nn.Linear(3, 3)
    nn.init.normal_(module.bias)  # 3 elements: the scalar path, which reads the cached normal sample
    return module


def test_eager_draws_after_a_cached_normal_sample_refuse_the_reinit_and_name_both_culprits():
    torch.manual_seed(0)
    model = deferred_init(tiny_normal)
    torch.randn(3)
    with pytest.raises(DeferredInitError) as error:
        nn.init.normal_(model.weight)
    message = str(error.value)
    assert message.startswith("aten.normal_.default at ")
    assert "test_equal_or_refused.py" in message
    assert "the deferred aten.normal_.default (recorded at " in message
    assert "it uses the generator's cached normal sample (normal_ of fewer than 16 elements)" in message
    assert message.endswith("Call torch.manual_seed(...) before that point, or do the eager draws after it")


def test_without_eager_draws_in_between_a_value_dependent_draw_count_is_followed_exactly():
    def after(model: nn.Module) -> None:
        nn.init.normal_(model.bias)

    eager, deferred = run_both(truncated, after)
    assert_same_bytes(deferred, eager)


def test_a_failed_recording_owes_no_draws_so_a_retry_starts_where_it_did():
    def broken() -> nn.Module:
        nn.Linear(4, 4)
        raise ValueError("bad config")

    torch.manual_seed(1)
    with pytest.raises(ValueError):
        deferred_init(broken)
    module = materialize_module(deferred_init(nn.Linear, 4, 4))
    torch.manual_seed(1)
    assert_same_bytes(module, nn.Linear(4, 4))


# -- external tensors the constructor read, changed afterwards ---------------------------------
EXTERNAL = torch.randn(1, 1, generator=torch.Generator().manual_seed(7))


class ClonesAnExternalParameter(nn.Module):
    """The fuzzer's seed-4711 finding: the external parameter is cast by `.double()` later."""

    def __init__(self, write: str) -> None:
        super().__init__()
        w = nn.Parameter(EXTERNAL, requires_grad=False)
        b = w.clone()
        self.register_buffer("b", b, persistent=False)
        if write == "index_put_":
            b.index_put_((torch.tensor([0]),), torch.tensor(1.0))
        elif write == "index_copy_":
            b.index_copy_(0, torch.tensor([0]), torch.ones(1, 1))
        elif write == "masked_scatter_":
            b.masked_scatter_(torch.tensor([[True]]), torch.ones(1, 1))
        else:
            b.add_(torch.full((1,), 0.1))
        self.register_parameter("w", w)


@pytest.mark.parametrize("write", ["index_put_", "index_copy_", "masked_scatter_", "add_"])
@pytest.mark.parametrize("cast", ["double", "half", "bfloat16"])
def test_a_cast_after_construction_does_not_change_what_the_constructor_read_from_an_external_tensor(write, cast):
    eager = getattr(ClonesAnExternalParameter(write), cast)()
    deferred = getattr(deferred_init(ClonesAnExternalParameter, write), cast)()
    materialize_module(deferred)
    assert_same_bytes(deferred, eager)
    assert EXTERNAL.dtype == torch.float32  # the caller's tensor was never touched


def test_an_external_tensor_rebound_with_data_keeps_the_value_the_constructor_read():
    table = torch.arange(4.0)

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scaled", table * 2)

    module = deferred_init(Scaled)
    table.data = torch.zeros(4, dtype=torch.float64)  # rebinding, not writing: the old memory is unchanged
    materialize_module(module)
    assert torch.equal(module.scaled, torch.arange(4.0) * 2)


# -- model surgery -----------------------------------------------------------------------------
def tiny_llama_config():
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=256)


def test_resize_token_embeddings_inside_deferred_model_equals_eager():
    from transformers import LlamaForCausalLM

    config = tiny_llama_config()
    torch.manual_seed(0)
    eager = LlamaForCausalLM(copy.deepcopy(config))
    eager.resize_token_embeddings(300, mean_resizing=False)
    torch.manual_seed(0)
    model = deferred_init(LlamaForCausalLM, copy.deepcopy(config))
    with explorer.deferred(model):
        model.resize_token_embeddings(300, mean_resizing=False)
    assert explorer.is_deferred(model) and tuple(model.model.embed_tokens.weight.shape) == (300, 64)
    materialize_module(model)
    assert_same_bytes(model, eager)


@pytest.mark.parametrize("mean_resizing", [False, True], ids=["init-weights", "mean-resizing"])
def test_resize_token_embeddings_on_a_deferred_model_equals_eager_without_a_block(mean_resizing):
    from transformers import LlamaForCausalLM

    config = tiny_llama_config()
    torch.manual_seed(0)
    eager = LlamaForCausalLM(copy.deepcopy(config))
    eager.resize_token_embeddings(300, mean_resizing=mean_resizing)
    torch.manual_seed(0)
    model = deferred_init(LlamaForCausalLM, copy.deepcopy(config))
    model.resize_token_embeddings(300, mean_resizing=mean_resizing)
    assert explorer.is_deferred(model.model.embed_tokens.weight) and explorer.is_deferred(model.lm_head.weight)
    materialize_module(model)
    assert_same_bytes(model, eager)


def test_surgery_outside_the_models_recording_is_refused_with_the_way_out():
    torch.manual_seed(0)
    model = deferred_init(two_linears)
    bigger = nn.Linear(8, 12)  # eager: outside any recording
    with pytest.raises(DeferredInitError) as error, torch.no_grad():
        bigger.weight[:8].copy_(model[1].weight)
    message = str(error.value)
    assert message.startswith("aten.copy_.default writes values of a deferred model into a real tensor "
                              "(float32[8, 8] on cpu) at ")
    assert "Run this code inside `with explorer.deferred(model): ...`" in message
    assert message.endswith("or materialize the model first (explorer.materialize_module)")
    assert explorer.is_deferred(model)


def test_a_layer_replaced_inside_deferred_model_takes_values_from_the_old_one_as_eager_does():
    def surgery(model: nn.Module) -> None:
        bigger = nn.Linear(8, 12)
        with torch.no_grad():
            bigger.weight[:8].copy_(model[1].weight)
            bigger.bias[:8].copy_(model[1].bias)
        model[1] = bigger

    torch.manual_seed(0)
    eager = two_linears()
    surgery(eager)
    torch.manual_seed(0)
    model = deferred_init(two_linears)
    with explorer.deferred(model):
        surgery(model)
    materialize_module(model)
    assert_same_bytes(model, eager)


def test_deferred_of_an_eager_model_says_what_to_do_instead():
    with pytest.raises(DeferredInitError, match=r"explorer.deferred\(model\): this Linear holds no deferred tensor"):
        with explorer.deferred(nn.Linear(2, 2)):
            pass


def test_the_reported_programs_also_hold_in_a_plain_script(tmp_path):
    script = tmp_path / "programs.py"
    script.write_text(textwrap.dedent('''
        import torch
        from torch import nn
        from explorer import deferred_init, materialize_module

        def mk():
            return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))

        results = []
        for between in (lambda: torch.randn(10), lambda: torch.manual_seed(3)):
            torch.manual_seed(0); eager = mk(); between(); nn.init.normal_(eager[1].weight)
            torch.manual_seed(0); model = deferred_init(mk); between(); nn.init.normal_(model[1].weight)
            materialize_module(model)
            results.append(torch.equal(model[1].weight, eager[1].weight))
        print(results)
    '''))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[True, True]"


def test_materializing_after_an_unknowable_start_refuses_with_the_way_out():
    torch.manual_seed(0)
    deferred_init(tiny_normal)  # what it drew is owed, and cannot be counted (the cached normal sample)
    torch.randn(3)
    model = deferred_init(two_linears)
    with pytest.raises(MaterializationError, match=r"the deferred recording started at .*test_equal_or_refused.py"):
        materialize_module(model)
    assert explorer.is_deferred(model)
