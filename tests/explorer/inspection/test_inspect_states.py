"""`inspect` across a module's life (fake, partly materialized, materialized, eager), its read-only
guarantee, the summary text, and totals on a real architecture."""

import copy

import pandas as pd
import pytest
import torch

from explorer import deferred_init, inspect, materialize_module
from explorer.naming import format_bytes
from explorer.record.fake import handle_of
from tests.support.inspect_models import TINY_NAMES, Tiny, table

IDENTITY = ["name", "storage_id", "alias_group", "tied_with"]
PROVENANCE = ["name", "tensor_id", "closure_ops", "producer", "last_write", "source"]


def rows(frame: pd.DataFrame, columns: list[str]) -> list[tuple]:
    return [tuple(row) for row in frame[columns].itertuples(index=False)]


def states(frame: pd.DataFrame) -> dict[str, str]:
    return dict(zip(frame["name"], frame["state"]))


def slots(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return sorted(named, key=lambda item: item[0])


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(torch.uint8)


def test_state_goes_from_fake_through_partly_materialized_to_materialized():
    module = deferred_init(Tiny, table())
    fake = inspect(module)

    materialize_module(module.embed)
    partly = inspect(module)
    # The head holds the same tensor, tied (note [Ties across a partial materialization]).
    assert states(partly.tensors) == {
        **dict.fromkeys(TINY_NAMES, "fake"), "embed.weight": "materialized", "head.weight": "materialized"
    }
    assert rows(partly.tensors, IDENTITY) == rows(fake.tensors, IDENTITY)
    assert partly.tensors["graph"].tolist() == [0] * 13
    assert partly.storages["state"].tolist() == ["fake"] * 5 + ["materialized"] + ["fake"] * 2
    assert partly.modules["total_params"].tolist() == fake.modules["total_params"].tolist()  # counted once
    assert partly.summary().splitlines()[-1] == fake.summary().splitlines()[-1]  # "tied: embed.weight = ..."
    assert partly.modules["materialized_bytes"].tolist() == [48, 48, 48, 0, 0, 0, 0]
    assert partly.modules["materialized"].tolist() == [48 / 144, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]

    materialize_module(module, buffers_only=True)
    buffers = inspect(module)
    materialized = {"base", "window", "const", "scaled", "steps", "embed.weight", "head.weight"}
    assert states(buffers.tensors) == {name: "materialized" if name in materialized else "fake" for name in TINY_NAMES}
    # `shift` (fake) and `base`/`window` (real now) are still one storage.
    assert rows(buffers.tensors, IDENTITY) == rows(fake.tensors, IDENTITY)
    assert buffers.storages["state"].tolist() == ["materialized", "fake", *["materialized"] * 4, "fake", "fake"]

    materialize_module(module)
    done = inspect(module)
    assert states(done.tensors) == dict.fromkeys(TINY_NAMES, "materialized")
    assert rows(done.tensors, IDENTITY) == rows(fake.tensors, IDENTITY)
    # Provenance is read without the graph once no fake is left in the module; ops are no longer listed.
    assert rows(done.tensors, PROVENANCE) == rows(fake.tensors, PROVENANCE)
    assert done.tensors["graph"].isna().all()
    assert len(done.ops) == 0
    assert done.modules["materialized"].tolist() == [1.0] * 7
    assert done.storages["state"].tolist() == ["materialized"] * 8


def test_eager_and_copied_modules_are_real():
    eager = inspect(Tiny(table()))
    assert states(eager.tensors) == dict.fromkeys(TINY_NAMES, "real")
    # A copy is an ordinary module: materialization leaves nothing on the tensors themselves.
    copied = inspect(copy.deepcopy(materialize_module(deferred_init(Tiny, table()))))
    assert states(copied.tensors) == dict.fromkeys(TINY_NAMES, "real")
    assert copied.tensors["tensor_id"].isna().all()


def test_an_eager_module_holding_sparse_buffers_is_inspected_with_no_strides_for_them():
    from torch import nn

    from explorer import module_graph, op_graph

    module = nn.Module()
    module.lin = nn.Linear(3, 3)
    module.register_buffer("adjacency", torch.eye(3).to_sparse())  # a graph convolution's
    module.register_buffer("rows", torch.eye(2).to_sparse_csr())
    found = inspect(module)
    tensors = found.tensors.set_index("name")
    assert tensors.loc["adjacency", "stride"] is None and tensors.loc["rows", "stride"] is None
    assert tensors.loc["lin.weight", "stride"] == (3, 1)
    assert list(found.storages["bytes"]) == [36, 16, 36, 12]  # buffers first; sparse: each its own memory, dense size
    assert found.summary().startswith("Module: 12 parameters, 4 names (2 parameters, 2 buffers) on 4 storages, 100 B")
    assert module_graph(module) is not None and op_graph(module) is not None


def test_inspect_changes_nothing_and_materialization_still_matches_eager():
    torch.manual_seed(7)
    module = deferred_init(Tiny, table())
    graph = handle_of(module.base).graph
    inspect(module)
    assert graph.replay_state is None  # inspecting a fresh module prepares no replay

    materialize_module(module.block)  # partly materialized: inspect reads the replay memo too
    torch.manual_seed(123)
    before = [(name, tensor, tensor._version) for name, tensor in slots(module)]
    recorded = (len(graph.ops), len(graph.tensors), len(graph.storages), len(graph.externals),
                {sid: list(writers) for sid, writers in graph.writers.items()})
    memo = {key: dict(results) for key, results in graph.replay_state.results.items()}
    rng = torch.get_rng_state()

    inspection = inspect(module)
    inspection.summary()

    assert torch.equal(torch.get_rng_state(), rng)
    after = [(name, tensor, tensor._version) for name, tensor in slots(module)]
    assert [(n, id(t), v) for n, t, v in after] == [(n, id(t), v) for n, t, v in before]
    assert (len(graph.ops), len(graph.tensors), len(graph.storages), len(graph.externals),
            {sid: list(writers) for sid, writers in graph.writers.items()}) == recorded
    assert {key: dict(results) for key, results in graph.replay_state.results.items()} == memo

    materialize_module(module)
    torch.manual_seed(7)
    eager = Tiny(table())
    for (name, real), (eager_name, expected) in zip(slots(module), slots(eager), strict=True):
        assert name == eager_name
        assert real.dtype == expected.dtype and real.stride() == expected.stride()
        assert torch.equal(bits(real), bits(expected)), name


TINY_SUMMARY = """\
Tiny: 25 parameters, 13 names (8 parameters, 5 buffers) on 8 storages, 144 B
state: fake 144 B (100.0%), materialized 0 B (0.0%), real 0 B (0.0%)
dtypes: float32 116 B, float16 4 B, int64 24 B; devices: cpu 144 B
ops: 23 recorded (8 factory, 4 random, 9 view, 2 external-input)
tied: embed.weight = head.weight; block.proj.weight = shared.proj.weight; block.proj.bias = shared.proj.bias"""


def test_summary_text_of_a_small_model():
    inspection = inspect(deferred_init(Tiny, table()))
    assert inspection.summary() == TINY_SUMMARY
    assert repr(inspection) == TINY_SUMMARY


def test_summary_of_a_partly_materialized_and_an_eager_model():
    module = deferred_init(Tiny, table())
    materialize_module(module.embed)
    assert inspect(module).summary().splitlines()[1] == (
        "state: fake 96 B (66.7%), materialized 48 B (33.3%), real 0 B (0.0%)")
    eager = inspect(Tiny(table())).summary().splitlines()
    assert eager[1] == "state: fake 0 B (0.0%), materialized 0 B (0.0%), real 144 B (100.0%)"
    assert eager[3] == "ops: none recorded"


@pytest.mark.parametrize(("count", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (7 * 2**30, "7.0 GiB"),
    (3 * 2**50, "3.0 PiB"), (2**60, "1024.0 PiB"),
])
def test_byte_counts_are_written_in_binary_units(count, text):
    assert format_bytes(count) == text


def test_inspect_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match=r"^explorer.inspect expects an nn.Module, got Tensor$"):
        inspect(torch.zeros(1))


def test_source_of_a_data_swap_is_the_line_that_made_the_new_data():
    class Inline(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("ramp", torch.linspace(0, 1, 5))
            self.weight = torch.nn.Parameter(torch.zeros(2))
            self.weight.data = self.ramp[3:]
            self.weight.data.mul_(2)  # the recorder notices the `.data =` swap here, on the next use

    tensors = inspect(deferred_init(Inline)).tensors
    first = Inline.__init__.__code__.co_firstlineno
    # `weight` was made by `self.weight.data = self.ramp[3:]`, 4 lines below `def __init__`.
    assert rows(tensors, ["name", "producer", "last_write", "source"]) == [
        ("weight", "set_data", "aten.mul_.Tensor", f"{__file__}:{first + 4} in __init__"),
        ("ramp", "aten.linspace.default", "aten.mul_.Tensor", f"{__file__}:{first + 2} in __init__"),
    ]


def test_llama_totals_equal_the_eager_model():
    transformers = pytest.importorskip("transformers")
    from tests.support.hf_configs import HF_ARCHITECTURES

    (llama,) = [arch for arch in HF_ARCHITECTURES if arch.name == "llama"]
    config = llama.config()
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(config)
    torch.manual_seed(0)
    deferred = deferred_init(transformers.LlamaForCausalLM, config)
    assert config.num_hidden_layers == 2

    tables = inspect(deferred)
    root = tables.modules.iloc[0]
    assert root["total_params"] == sum(p.numel() for p in eager.parameters())
    memory = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in [*eager.parameters(), *eager.buffers()]}
    assert root["bytes"] == sum(memory.values())
    named = [*eager.named_parameters(remove_duplicate=False), *eager.named_buffers(remove_duplicate=False)]
    assert sorted(tables.tensors["name"]) == sorted(name for name, _ in named)
    same = ["name", "class", "depth", "own_params", "total_params", "bytes", "bytes_by_dtype", "bytes_by_device"]
    assert rows(tables.modules, same) == rows(inspect(eager).modules, same)
    assert set(tables.tensors["state"]) == {"fake"}


def test_an_eager_module_with_lazy_parameters_inspects_and_draws_as_its_deferred_twin():
    # an eager lazy parameter refuses `.shape`: the tables and diagrams read its size without it
    from torch import nn

    from explorer import module_graph, op_graph

    def lazy() -> nn.Module:
        return nn.Sequential(nn.LazyLinear(4), nn.LazyConv2d(3, 2))

    columns = ["name", "shape", "stride", "numel", "bytes"]
    eager, deferred = inspect(lazy()), inspect(deferred_init(lazy))
    assert rows(eager.tensors, columns) == rows(deferred.tensors, columns)
    assert rows(eager.tensors, ["name", "shape"])[0] == ("0.weight", (0,))
    assert rows(eager.storages, ["shapes"]) == [([(0,)],)] * 4
    assert module_graph(lazy()).source.count("->") == module_graph(deferred_init(lazy)).source.count("->")
    assert "digraph" in op_graph(lazy()).source


def test_a_data_swap_after_construction_shows_in_the_tables_before_any_later_op():
    from torch import nn

    def two() -> nn.Module:
        return nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))

    module = deferred_init(two)
    module[1].weight.data = module[0].weight.data  # an alias, recorded at the tensor's next use
    module[0].bias.data = module[0].bias.data.half()
    inspection = inspect(module)
    tensors = inspection.tensors.set_index("name")
    assert tensors.loc["1.weight", "alias_group"] == ["0.weight"]
    assert tensors.loc["0.bias", "dtype"] == "float16"
    bias_storage = inspection.storages.set_index("storage_id").loc[tensors.loc["0.bias", "storage_id"]]
    assert bias_storage["bytes"] == 6
    assert len(inspection.storages) == 3
    assert inspection.modules.loc[0, "bytes"] == 9 * 4 + 3 * 2 + 3 * 4  # one shared weight, half bias, bias
