"""save_checkpoint writes a deferred model in eager's values, a tensor at a time, as Hugging Face's
safetensors layout or a torch.distributed.checkpoint directory; nothing partial is left under a
final name, a full disk names the file, and progress reaches a callback or a tqdm bar.
(Several ranks: test_save_distributed.py.)"""

from __future__ import annotations

import errno
import io
import json
import multiprocessing
import os
import re
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch import nn

import explorer
from explorer import deferred_init, save_checkpoint
from explorer.replay import save_files

transformers = pytest.importorskip("transformers")


def tiny_config(tie: bool = False) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=256, tie_word_embeddings=tie)


def eager_and_deferred(factory, *args):
    torch.manual_seed(0)
    eager = factory(*args)
    torch.manual_seed(0)
    return eager, deferred_init(factory, *args)


def saved(directory) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def dcp_loaded(directory, into: nn.Module) -> dict[str, torch.Tensor]:
    """`into`'s state dict after `dcp.load` of `directory` into it (one process)."""
    state = {name: tensor.detach().clone() for name, tensor in into.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(directory), no_dist=True)
    return state


def assert_bitwise(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def listing(directory) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


class FullDisk(io.FileIO):
    """A file that takes `room[0]` more bytes (shared by every file opened), then fails as a full
    disk does (ENOSPC) after writing what fitted."""

    def __init__(self, path, room: list[int]) -> None:
        super().__init__(path, "wb")
        self.room = room

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        if len(data) > self.room[0]:
            super().write(data[: self.room[0]])
            self.room[0] = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room[0] -= len(data)
        return super().write(data)


def fill_disk_after(monkeypatch, room: int) -> None:
    """From now on, the disk holds `room` more bytes in all, then refuses."""
    left = [room]
    monkeypatch.setattr(save_files, "open_for_writing", lambda path: FullDisk(path, left))


# -- safetensors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied-embeddings"])
def test_a_deferred_llama_saved_in_shards_equals_eager_and_loads_with_from_pretrained(tmp_path, tie):
    eager, model = eager_and_deferred(transformers.LlamaForCausalLM, tiny_config(tie))
    written = save_checkpoint(model, tmp_path, max_shard_size="40KB")
    assert explorer.is_deferred(model)  # nothing swapped into the module
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    assert [p.name for p in written] == [*shards, "model.safetensors.index.json", "config.json",
                                         "generation_config.json"]
    expected = {name: tensor for name, tensor in eager.state_dict().items() if not (tie and name == "lm_head.weight")}
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in expected.values())
    assert_bitwise(saved(tmp_path), expected)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert_bitwise(loaded.state_dict(), eager.state_dict())
    assert not list(tmp_path.glob(".*"))


@pytest.mark.parametrize("recorded, written", [(None, torch.bfloat16), ("bfloat16", torch.float16),
                                               ("bfloat16", None)], ids=["fp32-as-bf16", "bf16-as-fp16", "bf16-as-is"])
def test_the_config_written_names_the_dtype_written_and_from_pretrained_gives_those_values(tmp_path, recorded,
                                                                                           written):
    config = transformers.LlamaConfig(**{**tiny_config().to_dict(), **({"dtype": recorded} if recorded else {})})
    eager, model = eager_and_deferred(transformers.LlamaForCausalLM, config)
    model.generation_config.do_sample, model.generation_config.temperature = True, 0.3
    save_checkpoint(model, tmp_path, dtype=written, progress=False)
    expected_dtype = written or eager.dtype  # LlamaForCausalLM(config) builds float32 whatever the config says
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == str(expected_dtype).removeprefix("torch.")
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert model.config.dtype == (recorded and torch.bfloat16)  # the model's own config is left alone
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert loaded.dtype == expected_dtype
    assert_bitwise(loaded.state_dict(), {k: v.to(expected_dtype) for k, v in eager.state_dict().items()})
    assert loaded.generation_config.temperature == 0.3


def test_a_timm_model_saved_in_bfloat16_equals_eager_converted_in_both_formats(tmp_path):
    timm = pytest.importorskip("timm")
    eager, model = eager_and_deferred(timm.create_model, "resnet10t")
    expected = {name: tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor.clone()
                for name, tensor in eager.state_dict().items()}
    save_checkpoint(model, tmp_path / "safetensors", dtype=torch.bfloat16)
    assert listing(tmp_path / "safetensors") == ["model.safetensors"]
    assert_bitwise(load_file(tmp_path / "safetensors" / "model.safetensors"), expected)
    save_checkpoint(model, tmp_path / "dcp", dtype=torch.bfloat16, format="dcp")
    assert_bitwise(dcp_loaded(tmp_path / "dcp", eager.to(torch.bfloat16).apply(_zeroed)), expected)


def _zeroed(module: nn.Module) -> None:
    """Overwrite a module's own tensors, so a load must bring every value back."""
    with torch.no_grad():
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            tensor.zero_()


def test_tensors_read_from_a_checkpoint_are_copied_through_and_converted(tmp_path):
    eager = transformers.LlamaForCausalLM(tiny_config())
    eager.save_pretrained(tmp_path / "source")
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, tmp_path / "source")
    save_checkpoint(model, tmp_path / "copy", dtype=torch.float16)
    assert_bitwise(saved(tmp_path / "copy"), {name: tensor.to(torch.float16) for name, tensor in eager.state_dict().items()})


# -- DCP -----------------------------------------------------------------------------------------
def test_a_deferred_llama_saved_as_dcp_loads_into_another_model_and_equals_eager(tmp_path):
    eager, model = eager_and_deferred(transformers.LlamaForCausalLM, tiny_config(tie=True))
    written = save_checkpoint(model, tmp_path, format="dcp")
    assert explorer.is_deferred(model)
    state = eager.state_dict()
    # one file per tensor (so each is dropped once written), every name of a tie kept as dcp.save keeps it
    assert [p.name for p in written] == sorted([".metadata", *(f"__0_{i}.distcp" for i in range(len(state)))])
    assert listing(tmp_path) == [p.name for p in written]
    metadata = dcp.FileSystemReader(str(tmp_path)).read_metadata()
    assert sorted(metadata.state_dict_metadata) == sorted(state)
    assert metadata.state_dict_metadata["model.norm.weight"].properties.dtype == torch.float32
    torch.manual_seed(1)  # other values, so the load must overwrite every tensor
    other = transformers.LlamaForCausalLM(tiny_config(tie=True))
    assert not torch.equal(other.lm_head.weight, eager.lm_head.weight)
    assert_bitwise(dcp_loaded(tmp_path, other), state)


def _llama_on_cuda() -> nn.Module:
    with torch.device("cuda"):
        return transformers.LlamaForCausalLM(tiny_config())


@pytest.mark.parametrize("format", ["safetensors", "dcp"])
def test_a_model_recorded_on_cuda_is_saved_from_the_cpu_with_device(tmp_path, format):
    # No GPU here: `device=` makes each tensor on the CPU, as materialize_module(device=...) would.
    torch.manual_seed(0)
    model = deferred_init(_llama_on_cuda)
    with pytest.raises(explorer.MaterializationError, match=r"recorded on cuda:0 .* pass device="):
        save_checkpoint(model, tmp_path / "refused", format=format)
    save_checkpoint(model, tmp_path / "saved", format=format, device="cpu", rng="fast")
    assert explorer.is_deferred(model) and model.lm_head.weight.device == torch.device("cuda:0")
    torch.manual_seed(0)
    expected = explorer.materialize_module(deferred_init(_llama_on_cuda), device="cpu", rng="fast").state_dict()
    if format == "dcp":
        assert_bitwise(dcp_loaded(tmp_path / "saved", transformers.LlamaForCausalLM(tiny_config())), expected)
    else:
        assert_bitwise(saved(tmp_path / "saved"), expected)


# -- cancel, crash, full disk ----------------------------------------------------------------------
def four_linears() -> nn.Module:
    return deferred_init(lambda: nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]))


def cancel_at(count: int):
    def progress(done: int, total: int, done_bytes: int, total_bytes: int) -> None:
        if done >= count:
            raise KeyboardInterrupt

    return progress


def test_a_cancel_mid_way_leaves_no_new_shard_and_the_previous_sharded_checkpoint_intact(tmp_path):
    torch.manual_seed(0)
    previous = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    save_checkpoint(previous, tmp_path, max_shard_size="17KB")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert len(before) == 5  # four shards and the index, under the names the new save writes too
    torch.manual_seed(1)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(four_linears(), tmp_path, max_shard_size="17KB", progress=cancel_at(4))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    stored = {key: load_file(tmp_path / file)[key] for key, file in index.items()}
    assert_bitwise(stored, previous.state_dict())


def test_a_model_saved_back_into_the_directory_it_was_read_from_reads_the_old_shards_to_the_end(tmp_path):
    torch.manual_seed(0)
    source = transformers.LlamaForCausalLM(tiny_config())
    source.save_pretrained(tmp_path, max_shard_size="50KB")
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, tmp_path)
    save_checkpoint(model, tmp_path, max_shard_size="50KB")  # the same file names, other boundaries than HF's
    assert_bitwise(saved(tmp_path), source.state_dict())


def test_a_dcp_cancel_mid_way_leaves_no_file_and_the_previous_checkpoint_intact(tmp_path):
    torch.manual_seed(0)
    previous = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    save_checkpoint(previous, tmp_path, format="dcp")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    torch.manual_seed(1)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(four_linears(), tmp_path, format="dcp", progress=cancel_at(3))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert_bitwise(dcp_loaded(tmp_path, nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])), previous.state_dict())


@pytest.mark.parametrize("format", ["safetensors", "dcp"])
def test_a_process_killed_mid_way_leaves_no_partial_file_under_a_final_name(tmp_path, format):
    eager, model = eager_and_deferred(lambda: nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]))

    def die_after_three(done: int, total: int, done_bytes: int, total_bytes: int) -> None:
        if done == 3:
            os._exit(7)  # no cleanup runs: as a crash or a kill

    child = multiprocessing.get_context("fork").Process(
        target=save_checkpoint, args=(model, tmp_path), kwargs={"max_shard_size": "17KB", "format": format,
                                                               "progress": die_after_three})
    child.start()
    child.join(60)
    assert child.exitcode == 7
    final = [path for path in tmp_path.iterdir() if not path.name.startswith(".")]
    assert final == []  # nothing is moved into place before the whole checkpoint is written
    if format == "safetensors":  # shard 1 complete, shard 2 half written, both under temporary names
        assert listing(tmp_path) == [".model-00001-of-00004.safetensors.partial",
                                     ".model-00002-of-00004.safetensors.partial"]
        assert_bitwise(load_file(tmp_path / ".model-00001-of-00004.safetensors.partial"),
                       {k: v for k, v in eager.state_dict().items() if k.startswith("0.")})
    else:
        assert [p.name.startswith(".dcp-") and p.name.endswith(".partial") for p in tmp_path.iterdir()] == [True]


def test_a_full_disk_names_the_file_and_bytes_and_leaves_no_shard(tmp_path, monkeypatch):
    eager, model = eager_and_deferred(lambda: nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]))
    fill_disk_after(monkeypatch, 20_000)  # room for the first shard (16,640 bytes and its header), not the second
    with pytest.raises(OSError) as raised:
        save_checkpoint(model, tmp_path, max_shard_size="17KB")
    shard = tmp_path / "model-00002-of-00004.safetensors"
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value).startswith(
        f"[Errno 28] writing {shard} failed: No space left on device; the file needs 16.4 KiB (16816 bytes), "
        "the checkpoint 48.9 KiB more in all, ")
    assert str(raised.value).endswith("; nothing under a final name was left half written")
    assert listing(tmp_path) == []  # shard 1 was complete, but a set of shards is renamed whole or not at all


def test_a_full_disk_during_dcp_names_the_file_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    torch.manual_seed(0)
    previous = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    save_checkpoint(previous, tmp_path, format="dcp")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    fill_disk_after(monkeypatch, 30_000)  # the first weight and bias fit, the second weight does not
    with pytest.raises(OSError) as raised:
        save_checkpoint(four_linears(), tmp_path, format="dcp")
    assert raised.value.errno == errno.ENOSPC
    found = re.match(r"\[Errno 28\] writing (\S+) failed: No space left on device; the file needs 16.0 KiB "
                     r"\(16384 bytes\), the checkpoint 48.8 KiB more in all, ", str(raised.value))
    assert found and re.fullmatch(rf"{tmp_path}/\.dcp-[0-9a-f]{{12}}\.partial/__0_2\.distcp", found.group(1))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# -- progress and arguments ------------------------------------------------------------------------
def test_progress_is_reported_per_tensor_with_bytes(tmp_path):
    reports = []
    save_checkpoint(deferred_init(nn.Linear, 8, 4), tmp_path, progress=lambda *report: reports.append(report))
    assert reports == [(1, 2, 128, 144), (2, 2, 144, 144)]
    reports.clear()
    save_checkpoint(deferred_init(nn.Linear, 8, 4), tmp_path / "dcp", format="dcp",
                    progress=lambda *report: reports.append(report))
    assert reports == [(1, 2, 128, 144), (2, 2, 144, 144)]


def test_progress_true_draws_a_tqdm_bar_and_none_draws_nothing_off_a_terminal(tmp_path, capsys):
    save_checkpoint(deferred_init(nn.Linear, 8, 4), tmp_path / "bar", progress=True)
    bar = capsys.readouterr().err
    assert "saving bar: 100%" in bar and "144/144 [" in bar and "2/2 tensors" in bar
    save_checkpoint(deferred_init(nn.Linear, 8, 4), tmp_path / "quiet")
    assert capsys.readouterr().err == ""


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"max_shard_size='5 parsecs': expected bytes"):
        save_checkpoint(deferred_init(nn.Linear, 4, 4), tmp_path, max_shard_size="5 parsecs")
    with pytest.raises(ValueError, match=r"format='zip': save_checkpoint writes one of \['safetensors', 'dcp'\]"):
        save_checkpoint(deferred_init(nn.Linear, 4, 4), tmp_path, format="zip")
    with pytest.raises(ValueError, match=r"dtype=torch.int8: expected a floating-point torch.dtype"):
        save_checkpoint(deferred_init(nn.Linear, 4, 4), tmp_path, dtype=torch.int8)
    with pytest.raises(TypeError, match=r"progress must be a function \(done, total, done_bytes, total_bytes\)"):
        save_checkpoint(deferred_init(nn.Linear, 4, 4), tmp_path, progress="yes")
    with pytest.raises(explorer.MaterializationError, match=r"unknown device 'gpu'"):
        save_checkpoint(deferred_init(nn.Linear, 4, 4), tmp_path, device="gpu")
    with pytest.raises(ValueError, match=r"^'_extra_state' is a dict, not a tensor \(a module's extra state\), which "
                                         r'safetensors cannot store: save with format="dcp", which keeps it$'):
        save_checkpoint(deferred_init(_WithExtraState), tmp_path)
    assert list(tmp_path.iterdir()) == []


class _MixedDtypes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.halves = nn.Parameter(torch.ones(3, dtype=torch.float16))
        self.register_buffer("single", torch.ones(5))
        self.register_buffer("flags", torch.ones(3, dtype=torch.bool))
        self.register_buffer("counts", torch.ones(2, dtype=torch.int64))


def test_each_tensor_of_a_shard_starts_at_a_multiple_of_its_element_size(tmp_path):
    # as safetensors' own writer lays them out, for readers that map the file without copying
    save_checkpoint(deferred_init(_MixedDtypes), tmp_path)
    raw = (tmp_path / "model.safetensors").read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    header.pop("__metadata__")
    sizes = {"F16": 2, "F32": 4, "BOOL": 1, "I64": 8}
    assert {key: (8 + length + entry["data_offsets"][0]) % sizes[entry["dtype"]] for key, entry in header.items()} == {
        "halves": 0, "single": 0, "flags": 0, "counts": 0}
    assert_bitwise(saved(tmp_path), _MixedDtypes().state_dict())


class _WithExtraState(nn.Linear):
    def __init__(self) -> None:
        super().__init__(2, 2)

    def get_extra_state(self) -> dict:
        return {"step": 3}

    def set_extra_state(self, state: dict) -> None:
        pass


@pytest.mark.parametrize("first_shard_size,second_shard_size", [("2KB", "5GB"), ("5GB", "2KB")])
def test_saving_again_replaces_the_earlier_saves_files_and_loads_the_new_model(tmp_path, first_shard_size,
                                                                                second_shard_size):
    # before: the earlier save's index stayed and was read first, giving the old weights back
    def two_linears() -> nn.Module:
        return nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))

    torch.manual_seed(0)
    save_checkpoint(deferred_init(two_linears), tmp_path, max_shard_size=first_shard_size, progress=False)
    (tmp_path / "notes.txt").write_text("kept")
    torch.manual_seed(1)
    written = save_checkpoint(deferred_init(two_linears), tmp_path, max_shard_size=second_shard_size, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in {".safetensors", ".json"}) == sorted(
        p.name for p in written if p.suffix in {".safetensors", ".json"}
    )
    assert (tmp_path / "notes.txt").read_text() == "kept"
    torch.manual_seed(1)
    expected = two_linears()
    loaded = explorer.materialize_module(explorer.load_checkpoint(deferred_init(two_linears), tmp_path))
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in expected.state_dict().items())
