"""check_checkpoint: a module's state_dict against a checkpoint's headers — missing and unexpected
keys, shape and dtype mismatches, tie conflicts — for safetensors files, sharded indexes, torch.save
files and DCP directories, without reading tensor data or changing the module."""

from __future__ import annotations

import json
import os
import pickle
import re
import struct

import pytest
import torch
import torch.distributed.checkpoint as dcp
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

import explorer
from explorer import CheckpointError, check_checkpoint
from explorer.checkpoint_headers import read_headers


class Tied(nn.Module):
    """An embedding tied to an output head (as in a language model), a linear, a persistent and a
    non-persistent buffer: state_dict keys scale (the root's own come first), embed.weight, proj.weight,
    proj.bias, head.weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 3)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(3))
        self.register_buffer("cache", torch.zeros(2), persistent=False)


KEYS = ["scale", "embed.weight", "proj.weight", "proj.bias", "head.weight"]


def state(**changes: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Tied's state dict as separate tensors (save_file refuses shared ones); a change of None drops
    the key, any other replaces or adds it."""
    tensors = {key: value.detach().clone() for key, value in Tied().state_dict().items()}
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            del tensors[key]
        else:
            tensors[key] = value
    return tensors


def saved(tmp_path, tensors: dict[str, torch.Tensor], name: str = "model.safetensors") -> str:
    path = tmp_path / name
    save_file(tensors, str(path))
    return str(path)


def rows(frame) -> list[list]:
    return frame.values.tolist()


def re_escape(text: str) -> str:
    """A pattern matching a message that starts with `text`."""
    return "^" + re.escape(text)


# -- what is found ---------------------------------------------------------------------------------

def test_matching_safetensors_file_is_ok(tmp_path):
    path = saved(tmp_path, state())
    check = check_checkpoint(explorer.deferred_init(Tied), path)
    assert check.ok
    assert (check.missing, check.unexpected, check.filled_by_tie) == ([], [], [])
    assert check.mismatches.empty and check.tie_conflicts.empty and check.to_frame().empty
    assert check.summary() == f"ok: every key matches — Tied (5 keys) vs {path} (safetensors, 5 keys)"
    assert repr(check) == check.summary()


def test_missing_unexpected_shape_and_dtype_are_found_exactly(tmp_path):
    path = saved(tmp_path, state(proj__bias=None, extra__weight=torch.zeros(2), proj__weight=torch.zeros(3, 5),
                                 scale=torch.ones(3, dtype=torch.float16)))
    check = check_checkpoint(explorer.deferred_init(Tied), path)
    assert not check.ok
    assert check.missing == ["proj.bias"]
    assert check.unexpected == ["extra.weight"]
    assert rows(check.mismatches) == [  # module (state_dict) order
        ["scale", "dtype", "float32", "float16", "model.safetensors"],
        ["proj.weight", "shape", (3, 4), (3, 5), "model.safetensors"],
    ]
    assert check.summary() == (f"not ok: 1 missing, 1 unexpected, 1 shape mismatch, 1 dtype difference (converted on "
                               f"load) — Tied (5 keys) vs {path} (safetensors, 5 keys)")
    assert rows(check.to_frame()) == [  # what fails the check first
        ["missing", "proj.bias", "", "", ""],
        ["unexpected", "extra.weight", "", "(2,) float32", "model.safetensors"],
        ["shape", "proj.weight", "(3, 4)", "(3, 5)", "model.safetensors"],
        ["dtype", "scale", "float32", "float16", "model.safetensors"],
    ]


def test_dtype_differences_alone_keep_the_check_ok(tmp_path):
    path = saved(tmp_path, {key: value.to(torch.bfloat16) for key, value in state().items()})
    check = check_checkpoint(explorer.deferred_init(Tied), path)
    assert check.ok
    assert rows(check.mismatches) == [[key, "dtype", "float32", "bfloat16", "model.safetensors"] for key in KEYS]
    assert check.summary().startswith("ok: 5 dtype differences (converted on load) — Tied")


def test_a_tied_key_absent_is_filled_by_its_partner(tmp_path):
    check = check_checkpoint(explorer.deferred_init(Tied), saved(tmp_path, state(head__weight=None)))
    assert check.ok and check.missing == [] and check.filled_by_tie == ["head.weight"]
    assert "ok: 1 tied key filled by its partner — Tied (5 keys)" in check.summary()

    neither = saved(tmp_path, state(head__weight=None, embed__weight=None), "neither.safetensors")
    both_gone = check_checkpoint(explorer.deferred_init(Tied), neither)
    assert both_gone.missing == ["embed.weight", "head.weight"] and both_gone.filled_by_tie == []


def test_tied_keys_stored_with_different_shapes_are_a_tie_conflict(tmp_path):
    path = saved(tmp_path, state(head__weight=torch.zeros(12, 4)))
    check = check_checkpoint(explorer.deferred_init(Tied), path)
    assert not check.ok
    assert rows(check.tie_conflicts) == [[("embed.weight", "head.weight"), ((10, 4), (12, 4)), ("float32", "float32"),
                                          ("model.safetensors", "model.safetensors")]]
    assert rows(check.mismatches) == [["head.weight", "shape", (10, 4), (12, 4), "model.safetensors"]]
    assert rows(check.to_frame()) == [
        ["shape", "head.weight", "(10, 4)", "(12, 4)", "model.safetensors"],
        ["tie", "embed.weight", "tied with head.weight", "(10, 4) float32", "model.safetensors"],
        ["tie", "head.weight", "tied with embed.weight", "(12, 4) float32", "model.safetensors"],
    ]
    assert check.summary().startswith("not ok: 1 shape mismatch, 1 tie conflict — ")


def test_tied_keys_stored_alike_twice_are_no_conflict(tmp_path):
    check = check_checkpoint(explorer.deferred_init(Tied), saved(tmp_path, state()))  # two copies, same metadata
    assert check.tie_conflicts.empty and check.filled_by_tie == []


def test_eager_and_partly_materialized_modules_check_alike_and_stay_as_they_were(tmp_path):
    path = saved(tmp_path, state(proj__weight=torch.zeros(3, 5)))
    eager = check_checkpoint(Tied(), path)
    partial = explorer.deferred_init(Tied)
    explorer.materialize_module(partial.proj)
    ops_before = len(explorer.inspect(partial).ops)
    for module in (partial, explorer.deferred_init(Tied)):
        check = check_checkpoint(module, path)
        assert rows(check.mismatches) == rows(eager.mismatches) == [["proj.weight", "shape", (3, 4), (3, 5),
                                                                     "model.safetensors"]]
    assert explorer.is_deferred(partial.embed.weight) and not explorer.is_deferred(partial.proj.weight)
    assert len(explorer.inspect(partial).ops) == ops_before  # nothing recorded


def test_a_lazy_parameter_takes_its_shape_from_the_checkpoint(tmp_path):
    path = saved(tmp_path, {"weight": torch.zeros(3, 5, dtype=torch.float16), "bias": torch.zeros(3)})
    check = check_checkpoint(nn.LazyLinear(3), path)  # load_state_dict materializes it at the stored shape
    assert check.ok and rows(check.mismatches) == [["weight", "dtype", "float32", "float16", "model.safetensors"]]


def test_a_module_is_required():
    with pytest.raises(TypeError, match="check_checkpoint expects an nn.Module, got str"):
        check_checkpoint("model", "ckpt")


# -- layouts ---------------------------------------------------------------------------------------

def write_index(directory, shards: dict[str, dict[str, torch.Tensor]]) -> None:
    """Shard files and a `model.safetensors.index.json` as `save_pretrained` writes them."""
    weight_map, total = {}, 0
    for shard, tensors in shards.items():
        save_file(tensors, str(directory / shard))
        weight_map.update({key: shard for key in tensors})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))


def test_sharded_index_reads_every_shard(tmp_path):
    tensors = state(scale=torch.ones(4))
    write_index(tmp_path, {"model-00001-of-00002.safetensors": {k: tensors[k] for k in KEYS[:2]},
                           "model-00002-of-00002.safetensors": {k: tensors[k] for k in KEYS[2:]}})
    check = check_checkpoint(explorer.deferred_init(Tied), tmp_path)
    assert rows(check.mismatches) == [["scale", "shape", (3,), (4,), "model-00001-of-00002.safetensors"]]
    assert check.format == "safetensors, 2 shards"
    assert check.headers.index == "model.safetensors.index.json"
    assert check.headers.files == ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    assert check_checkpoint(explorer.deferred_init(Tied), tmp_path / "model.safetensors.index.json").format == \
        "safetensors, 2 shards"  # the index file itself


def test_a_directory_with_one_safetensors_file_is_read(tmp_path):
    saved(tmp_path, state())
    assert check_checkpoint(explorer.deferred_init(Tied), tmp_path).ok


def test_torch_save_file_is_read_on_the_meta_device(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(state(proj__bias=None), path)
    check = check_checkpoint(explorer.deferred_init(Tied), path)
    assert (check.format, check.missing, check.ok) == ("torch.save", ["proj.bias"], False)
    nested = tmp_path / "trainer.bin"
    torch.save({"epoch": 3, "state_dict": state()}, nested)  # a training checkpoint
    assert check_checkpoint(explorer.deferred_init(Tied), nested).ok


def test_a_non_tensor_where_the_module_has_a_tensor_is_a_shape_mismatch(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({**state(), "scale": 3}, path)
    check = check_checkpoint(explorer.deferred_init(Tied), path)
    assert rows(check.mismatches) == [["scale", "shape", (3,), "not a tensor", "model.pt"]]


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_pickle_torch_save_did_not_write_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(pickle.dumps({"weight": [1, 2]}, protocol=4))
    with pytest.raises(CheckpointError, match=re_escape(f"{path}: not a readable torch.save file: Unsupported operand")):
        check_checkpoint(nn.Linear(2, 2), path)


class Payload:
    """A class a pickle names: loading it would run this module's code."""


def test_a_pickle_with_code_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"embed.weight": torch.zeros(10, 4), "payload": Payload()}, path)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(explorer.deferred_init(Tied), path)
    assert str(error.value).startswith(f"{path}: refused: it pickles {__name__}.Payload, not only tensors and plain "
                                       "containers, and check_checkpoint never runs pickled code")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.save without a process group
def test_dcp_directory_is_read_from_its_metadata(tmp_path):
    directory = tmp_path / "dcp"
    dcp.save(state(proj__weight=torch.zeros(3, 5)), checkpoint_id=str(directory))
    check = check_checkpoint(explorer.deferred_init(Tied), directory)
    assert check.format == "dcp"
    assert rows(check.mismatches) == [["proj.weight", "shape", (3, 4), (3, 5), "__0_0.distcp"]]
    assert check.missing == [] and check.unexpected == []


def test_dcp_metadata_pickled_by_python_313_reads_on_every_python(tmp_path):
    # 3.13 pickles the checkpoint's path as pathlib._local.PosixPath, a module older Pythons lack
    directory = tmp_path / "dcp"
    dcp.save(state(proj__weight=torch.zeros(3, 5)), checkpoint_id=directory)  # a Path: pickled in
    metadata = directory / ".metadata"
    as_written = pickle.dumps(pickle.loads(metadata.read_bytes()), protocol=2)  # GLOBAL opcodes: plain text
    assert b"cpathlib\nPosixPath\n" in as_written or b"cpathlib._local\nPosixPath\n" in as_written
    metadata.write_bytes(as_written.replace(b"cpathlib\nPosixPath\n", b"cpathlib._local\nPosixPath\n"))
    check = check_checkpoint(explorer.deferred_init(Tied), directory)
    assert rows(check.mismatches) == [["proj.weight", "shape", (3, 4), (3, 5), "__0_0.distcp"]]


class _RunsCode:
    def __reduce__(self):  # unpickling calls print("pwned")
        return (print, ("pwned",))


def test_dcp_metadata_naming_other_code_is_refused(tmp_path, capsys):
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_RunsCode()))
    with pytest.raises(CheckpointError, match=r"\.metadata: refused: it pickles builtins\.print, which is not part of"):
        check_checkpoint(explorer.deferred_init(Tied), tmp_path)
    assert capsys.readouterr().out == ""


def test_header_parser_agrees_with_safe_open(tmp_path):
    tensors = {"a": torch.zeros(2, 3, dtype=torch.bfloat16), "b": torch.zeros(0, 4, dtype=torch.int8),
               "c": torch.zeros((), dtype=torch.float64), "d": torch.zeros(5, dtype=torch.bool),
               "e": torch.zeros(1, 2, dtype=torch.float8_e4m3fn)}
    path = saved(tmp_path, tensors)
    entries = read_headers(path).entries
    with safe_open(path, framework="pt") as handle:
        expected = {key: (tuple(handle.get_slice(key).get_shape()), handle.get_slice(key).get_dtype())
                    for key in handle.keys()}
    assert {key: (e.shape, e.dtype) for key, e in entries.items()} == {
        key: (shape, str(tensors[key].dtype).removeprefix("torch.")) for key, (shape, _) in expected.items()}
    assert sorted(entries) == sorted(tensors)


# -- no tensor bytes are read ----------------------------------------------------------------------

def sparse_safetensors(path, tensors: dict[str, list[int]]) -> int:
    """A float32 safetensors file of the given shapes whose data part is a hole (no disk, no bytes
    written); returns its data size."""
    header, offset = {}, 0
    for key, shape in tensors.items():
        size = 4 * int(torch.Size(shape).numel())
        header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    with open(path, "wb") as stream:
        stream.write(struct.pack("<Q", len(text)) + text)
        stream.truncate(8 + len(text) + offset)
    return offset


def bytes_read() -> int:
    """Bytes this process has read through read() calls so far (the header reader does not mmap)."""
    with open("/proc/self/io") as stream:
        return int(next(line for line in stream if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts reads through /proc/self/io (Linux)")
def test_only_the_header_is_read(tmp_path):
    path = tmp_path / "big.safetensors"
    data = sparse_safetensors(path, {"weight": [16384, 16384], "bias": [16384]})  # 1 GiB of float32
    model = explorer.deferred_init(nn.Linear, 16384, 16384)
    check_checkpoint(model, path)  # warm: imports and caches
    before = bytes_read()
    check = check_checkpoint(model, path)
    assert bytes_read() - before < 64 * 1024 < data
    assert check.ok


# -- errors ----------------------------------------------------------------------------------------

def test_a_missing_path_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=f"^{tmp_path / 'nope'}: no such file or directory$"):
        check_checkpoint(nn.Linear(2, 2), tmp_path / "nope")


def test_a_file_that_is_not_a_checkpoint_is_named(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello, world")
    with pytest.raises(CheckpointError, match=f"^{path}: not a checkpoint: neither a safetensors file nor a torch"):
        check_checkpoint(nn.Linear(2, 2), path)


def test_a_directory_without_a_checkpoint_lists_what_it_holds(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=f"^{tmp_path}: no checkpoint found: .* it holds config.json$"):
        check_checkpoint(nn.Linear(2, 2), tmp_path)


def test_a_cut_header_is_named(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(4)}, str(path))
    whole = path.read_bytes()
    path.write_bytes(whole[:20])
    with pytest.raises(CheckpointError, match=f"^{path}: safetensors header cut short or corrupt: its length field"):
        check_checkpoint(nn.Linear(2, 2), path)
    path.write_bytes(whole[:5])
    with pytest.raises(CheckpointError, match=f"^{path}: not a safetensors file: 5 bytes"):
        check_checkpoint(nn.Linear(2, 2), path)


def test_a_corrupt_header_names_the_file_and_key(tmp_path):
    path = tmp_path / "model.safetensors"
    text = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(16))
    message = f"{path}: safetensors header entry 'w': shape [4] of F32 needs 16 bytes, its data_offsets span 12"
    with pytest.raises(CheckpointError, match=re_escape(message)):
        check_checkpoint(nn.Linear(2, 2), path)
    path.write_bytes(struct.pack("<Q", 5) + b"{oops")
    with pytest.raises(CheckpointError, match=f"^{path}: safetensors header is not valid JSON"):
        check_checkpoint(nn.Linear(2, 2), path)


def test_truncated_tensor_data_is_named(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.zeros(4), "b": torch.zeros(8)}, str(path))
    path.write_bytes(path.read_bytes()[:-4])  # an interrupted download
    with pytest.raises(CheckpointError, match=re_escape(f"{path}: truncated: tensor 'b' ends at byte 48 of the data, "
                                                        "but the file holds 44 bytes of data")):
        check_checkpoint(nn.Linear(2, 2), path)


def test_an_index_naming_a_missing_shard_is_named(tmp_path):
    write_index(tmp_path, {"model-00001-of-00002.safetensors": {"a": torch.zeros(2)},
                           "model-00002-of-00002.safetensors": {"b": torch.zeros(2), "c": torch.zeros(2)}})
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    index = tmp_path / "model.safetensors.index.json"
    message = (f"{index}: shard 'model-00002-of-00002.safetensors' (holding 'b' and 1 other keys) does not exist "
               f"in {tmp_path}")
    with pytest.raises(CheckpointError, match=re_escape(message)):
        check_checkpoint(nn.Linear(2, 2), tmp_path)


def test_an_index_naming_a_key_its_shard_lacks_is_named(tmp_path):
    save_file({"a": torch.zeros(2)}, str(tmp_path / "shard.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"a": "shard.safetensors", "z": "shard.safetensors"}}))
    message = f"{index}: maps 'z' to 'shard.safetensors', whose header does not hold it"
    with pytest.raises(CheckpointError, match=re_escape(message)):
        check_checkpoint(nn.Linear(2, 2), tmp_path)


# -- a Hugging Face checkpoint ---------------------------------------------------------------------

def llama(**changes) -> transformers.LlamaConfig:
    """A tiny Llama: 2 layers, hidden 32, vocab 96 (about 87 KB of float32)."""
    sizes = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaConfig(**{**sizes, **changes})


def test_hugging_face_sharded_checkpoint_matches_a_deferred_model_of_its_config(tmp_path):
    transformers.LlamaForCausalLM(llama()).save_pretrained(tmp_path, max_shard_size="30KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    check = check_checkpoint(explorer.deferred_init(transformers.LlamaForCausalLM, llama()), tmp_path)
    assert check.ok and check.to_frame().empty
    shards = len(check.headers.files)
    assert shards > 1
    assert check.summary() == (f"ok: every key matches — LlamaForCausalLM (21 keys) vs {tmp_path} "
                               f"(safetensors, {shards} shards, 21 keys)")

    other = check_checkpoint(explorer.deferred_init(transformers.LlamaForCausalLM, llama(vocab_size=100)), tmp_path)
    file_of = {key: entry.file for key, entry in check.headers.entries.items()}
    assert rows(other.mismatches) == [
        ["model.embed_tokens.weight", "shape", (100, 32), (96, 32), file_of["model.embed_tokens.weight"]],
        ["lm_head.weight", "shape", (100, 32), (96, 32), file_of["lm_head.weight"]],
    ]
    assert not other.ok and (other.missing, other.unexpected) == ([], [])


def test_hugging_face_tied_embeddings_are_saved_once_and_filled_by_the_tie(tmp_path):
    transformers.LlamaForCausalLM(llama(tie_word_embeddings=True)).save_pretrained(tmp_path)
    check = check_checkpoint(explorer.deferred_init(transformers.LlamaForCausalLM, llama(tie_word_embeddings=True)),
                             tmp_path)
    assert check.ok and check.missing == [] and check.filled_by_tie == ["lm_head.weight"]
    assert check.format == "safetensors"
