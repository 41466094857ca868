"""Checkpoint provenance: the "disk" state, the tensors table's file/key/offset/disk_dtype, the
modules table's disk_bytes, the reads table and the summary line, for checkpoint-backed fakes."""

import math

import pandas as pd
import safetensors.torch
import torch
from torch import nn

import explorer
from explorer import deferred_init, inspect, materialize_module
from explorer.inspection.checkpoint_sources import storage_sources
from explorer.record.fake import handle_of
from tests.support.checkpoints import data_at, deferred_tiny_llama, loaded_pair, pair_weights, saved_tiny_llama

PROVENANCE = ["name", "state", "file", "key", "offset", "disk_dtype", "dtype"]


def missing(value) -> bool:  # noqa: ANN001
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def rows(frame, columns):  # noqa: ANN001, ANN201
    return [tuple(None if missing(value) else value for value in row) for row in frame[columns].itertuples(index=False)]


def test_loaded_tensors_are_on_disk_with_file_key_offset_and_on_disk_dtype_and_the_rest_stay_fake(tmp_path):
    module, file = loaded_pair(tmp_path)
    tensors = inspect(module).tensors
    offsets = dict(zip(tensors["name"], tensors["offset"]))
    data = 8 + int.from_bytes(data_at(file, 0, 8), "little")  # where the data part starts
    # save_file lays the data out by dtype then key: first.bias, first.weight, second.bias, second.weight
    assert rows(tensors, PROVENANCE) == [
        ("scale", "fake", None, None, None, None, "float32"),
        ("first.weight", "disk", "pair.safetensors", "first.weight", data + 6, "bfloat16", "float32"),
        ("first.bias", "disk", "pair.safetensors", "first.bias", data, "bfloat16", "float32"),
        ("second.weight", "disk", "pair.safetensors", "second.weight", data + 34, "bfloat16", "float32"),
        ("second.bias", "disk", "pair.safetensors", "second.bias", data + 30, "bfloat16", "float32"),
    ]
    for key, value in pair_weights().items():  # each offset is where the key's bytes are in the file
        raw = value.contiguous().view(torch.uint8).numpy().tobytes()
        assert data_at(file, int(offsets[key]), len(raw)) == raw


def test_reads_table_lists_each_read_once_at_its_on_disk_size(tmp_path):
    module, file = loaded_pair(tmp_path)
    reads = inspect(module).reads
    assert rows(reads, ["file", "path", "key", "shape", "disk_dtype", "bytes", "tensors", "states"]) == [
        ("pair.safetensors", str(file), "first.bias", (3,), "bfloat16", 6, ["first.bias"], ["disk"]),
        ("pair.safetensors", str(file), "first.weight", (3, 4), "bfloat16", 24, ["first.weight"], ["disk"]),
        ("pair.safetensors", str(file), "second.bias", (2,), "bfloat16", 4, ["second.bias"], ["disk"]),
        ("pair.safetensors", str(file), "second.weight", (2, 3), "bfloat16", 12, ["second.weight"], ["disk"]),
    ]


def test_modules_count_disk_bytes_and_the_summary_shows_the_disk_share(tmp_path):
    module, _ = loaded_pair(tmp_path)
    inspection = inspect(module)
    modules = inspection.modules
    assert list(zip(modules["name"], modules["bytes"], modules["disk_bytes"])) == [
        ("", 100, 92), ("first", 60, 60), ("second", 32, 32)]
    assert inspection.summary().splitlines()[1] == (
        "state: fake 8 B (8.0%), disk 92 B (92.0%), materialized 0 B (0.0%), real 0 B (0.0%)")
    assert set(inspection.storages["state"]) == {"disk", "fake"}


def test_a_materialized_layer_keeps_its_file_while_the_rest_stays_on_disk(tmp_path):
    module, _ = loaded_pair(tmp_path)
    materialize_module(module.first)
    inspection = inspect(module)
    assert rows(inspection.tensors, ["name", "state", "key"]) == [
        ("scale", "fake", None), ("first.weight", "materialized", "first.weight"), ("first.bias", "materialized", "first.bias"),
        ("second.weight", "disk", "second.weight"), ("second.bias", "disk", "second.bias")]
    assert list(zip(inspection.modules["name"], inspection.modules["materialized_bytes"],
                    inspection.modules["disk_bytes"])) == [("", 60, 32), ("first", 60, 0), ("second", 0, 32)]


class Fused(nn.Module):
    """A concatenation of two reads, and a read partly re-initialized afterwards."""

    def __init__(self, path: str) -> None:
        super().__init__()
        loaded = safetensors.torch.load_file(path)
        self.fused = nn.Parameter(torch.cat([loaded["first.bias"], loaded["second.bias"]]).float())
        self.patched = nn.Parameter(loaded["first.weight"].float())
        with torch.no_grad():
            nn.init.zeros_(self.patched[0])
        self.fresh = nn.Parameter(torch.randn(2))


def test_several_reads_are_listed_together_and_a_read_then_reinitialized_tensor_is_still_on_disk(tmp_path):
    file = tmp_path / "pair.safetensors"
    safetensors.torch.save_file(pair_weights(), file)
    tensors = inspect(deferred_init(Fused, str(file))).tensors
    assert rows(tensors, ["name", "state", "file", "key", "disk_dtype"]) == [
        ("fused", "disk", "pair.safetensors", "first.bias, second.bias", "bfloat16"),
        ("patched", "disk", "pair.safetensors", "first.weight", "bfloat16"),
        ("fresh", "fake", None, None, None),
    ]
    assert tensors["offset"].isna().tolist() == [True, False, True]  # one offset only for one read


def test_storage_sources_drop_a_read_that_a_later_full_overwrite_hides(tmp_path):
    module, _ = loaded_pair(tmp_path)
    graph = handle_of(module.first.weight).graph
    sources = storage_sources(graph)
    weight = graph.tensors[handle_of(module.first.weight).tensor_id].storage
    [read] = sources[weight]
    assert graph.ops[read].args[1] == "first.weight"
    # the init the checkpoint overwrote (uniform_) feeds nothing: no random op index is a source
    assert all(graph.ops[index].label == "explorer.read_safetensors.default"
               for indices in sources.values() for index in indices)


def test_a_sharded_llama_from_pretrained_names_each_parameter_s_shard(tmp_path):
    weight_map = saved_tiny_llama(tmp_path)
    tensors = inspect(deferred_tiny_llama(tmp_path)).tensors
    disk = tensors[tensors["state"] == "disk"]
    assert dict(zip(disk["name"], disk["file"])) == weight_map
    assert (disk["key"] == disk["name"]).all() and set(disk["disk_dtype"]) == {"bfloat16"}
    assert set(disk["dtype"]) == {"float32"}
    assert rows(tensors[tensors["state"] == "fake"], ["name"]) == [
        ("model.rotary_emb.inv_freq",), ("model.rotary_emb.original_inv_freq",)]


def test_torch_save_and_dcp_reads_are_on_disk_too(tmp_path):
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(3)
    source = nn.Linear(4, 2)
    torch.save({"model": source.state_dict()}, tmp_path / "w.pt")
    dcp.save(source.state_dict(), checkpoint_id=tmp_path / "dcp", no_dist=True)
    for where in (tmp_path / "w.pt", tmp_path / "dcp"):
        model = explorer.deferred_init(nn.Linear, 4, 2)
        explorer.load_checkpoint(model, where)
        table = explorer.inspect(model).tensors.set_index("name")
        assert table.loc["weight", "state"] == "disk" and table.loc["bias", "state"] == "disk"
        assert table.loc["weight", "key"] == "weight"
        assert table.loc["weight", "file"] == where.name
