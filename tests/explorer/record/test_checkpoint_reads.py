"""Checkpoint reads under deferred init are recorded ops: nothing is read while recording, and
materializing reads the bytes and equals eager loading bit for bit."""

from __future__ import annotations

import contextlib
import json
import os
import struct

import pytest
import torch
from safetensors import safe_open  # bound at import, as user code does
from safetensors.torch import save_file
from torch import nn

import explorer
from explorer import CheckpointError, MaterializationError, deferred_init, load_checkpoint, materialize_module, materialize_tensor
from explorer.record.fake import handle_of

transformers = pytest.importorskip("transformers")


def tiny_config(tie: bool) -> "transformers.LlamaConfig":
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=256, tie_word_embeddings=tie)


def saved_llama(directory, dtype: torch.dtype, sharded: bool, tie: bool = False):  # noqa: ANN001, ANN201
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(tiny_config(tie)).to(dtype).save_pretrained(
        directory, max_shard_size="100KB" if sharded else "5GB")
    return directory


def assert_same(module: nn.Module, reference: nn.Module) -> None:
    for kind in ("named_parameters", "named_buffers"):
        got, want = dict(getattr(module, kind)()), dict(getattr(reference, kind)())
        assert list(got) == list(want)
        different = [name for name in want if got[name].dtype != want[name].dtype or not torch.equal(got[name], want[name])]
        assert different == []


@pytest.mark.parametrize(
    ("saved", "loaded", "sharded", "tie"),
    [
        (torch.float32, torch.float32, False, False),
        (torch.bfloat16, torch.float32, True, False),
        (torch.float32, torch.bfloat16, True, False),
        (torch.float32, torch.float32, False, True),
        (torch.bfloat16, "auto", True, True),
    ],
    ids=["single-file", "sharded-bf16-to-float32", "sharded-float32-to-bf16", "tied-embeddings", "sharded-auto-tied"],
)
def test_from_pretrained_under_deferred_init_is_all_read_ops_and_materializes_as_eager_loading(
        tmp_path, saved, loaded, sharded, tie):
    directory = saved_llama(tmp_path, saved, sharded, tie)
    torch.manual_seed(1)
    eager = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=loaded)
    rng = torch.get_rng_state()
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, directory, dtype=loaded)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(explorer.is_fake(tensor) for tensor in model.state_dict(keep_vars=True).values())
    graph = handle_of(model.lm_head.weight).graph
    reads = [op for op in graph.ops if op.label == "explorer.read_safetensors.default"]
    assert len(reads) == len(eager.state_dict()) - tie
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    materialize_module(model)
    assert_same(model, eager)


def test_from_pretrained_of_a_pytorch_model_bin_with_the_default_dtype_materializes_as_eager(tmp_path):
    # transformers' dtype="auto" reads the .bin on meta for its dtype: that torch.load is not a model op
    torch.manual_seed(0)
    source = transformers.LlamaForCausalLM(tiny_config(False))
    source.config.save_pretrained(tmp_path)
    torch.save(source.state_dict(), tmp_path / "pytorch_model.bin")
    eager = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, tmp_path)
    materialize_module(model)
    assert_same(model, eager)


def test_recording_reads_no_tensor_bytes_and_materializing_reads_them(tmp_path):
    file = tmp_path / "w.safetensors"
    save_file({"weight": torch.ones(4, 4), "bias": torch.ones(4)}, str(file))
    model = deferred_init(nn.Linear, 4, 4)
    load_checkpoint(model, file)
    # zeros, same header, same size, inode and modification time (note [A checkpoint changed since
    # recording] sees none of it): only a read at materialization can see them
    with keeping_stamp(file):
        rewrite_data(file, lambda data: bytes(len(data)))
    materialize_module(model)
    assert torch.equal(model.weight, torch.zeros(4, 4)) and torch.equal(model.bias, torch.zeros(4))


def rewrite_data(file, change) -> None:  # noqa: ANN001
    raw = file.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    file.write_bytes(raw[: 8 + length] + change(raw[8 + length:]))


@contextlib.contextmanager
def keeping_stamp(file):  # noqa: ANN001, ANN201
    """The block changes `file` in place; its times are put back after."""
    stat = os.stat(file)
    yield
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_checkpoint_rewritten_after_recording_is_refused_before_anything_is_read(tmp_path):
    # before: a rewrite with the same keys and shapes was read silently, so one module could mix two
    # checkpoints, and release + materialize gave other bytes
    file = tmp_path / "w.safetensors"
    save_file({"0.weight": torch.ones(2, 2), "0.bias": torch.ones(2), "1.weight": torch.ones(2, 2),
               "1.bias": torch.ones(2)}, str(file))
    model = deferred_init(lambda: nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
    load_checkpoint(model, file)
    materialize_module(model[0])
    save_file({"0.weight": torch.zeros(2, 2), "0.bias": torch.zeros(2), "1.weight": torch.zeros(2, 2),
               "1.bias": torch.zeros(2)}, str(file))
    with pytest.raises(MaterializationError) as error:
        materialize_module(model[1])
    assert str(error.value) == (
        f"checkpoint {file} changed since it was recorded (its size, modification time or inode differ): "
        "'1.weight', '1.bias' would be read from bytes the recording never saw (key '1.bias', '1.weight'), and mixed "
        "with what was read before. Record again to read the new file (deferred_init, load_checkpoint), or put the "
        "recorded file back"
    )
    assert explorer.is_deferred(model[1].weight) and torch.equal(model[0].weight, torch.ones(2, 2))


def test_a_changed_shard_is_refused_naming_the_tensors_and_keys_it_holds_not_every_target(tmp_path):
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"0.weight": torch.ones(2, 2), "0.bias": torch.ones(2)}, str(first))
    save_file({"1.weight": torch.ones(2, 2), "1.bias": torch.ones(2)}, str(second))
    model = deferred_init(lambda: nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
    load_checkpoint(model, first, strict=False)
    load_checkpoint(model, second, strict=False)
    save_file({"1.weight": torch.zeros(2, 2), "1.bias": torch.zeros(2)}, str(second))
    with pytest.raises(MaterializationError) as error:
        materialize_module(model)
    assert str(error.value).startswith(
        f"checkpoint {second} changed since it was recorded (its size, modification time or inode differ): "
        "'1.weight', '1.bias' would be read from bytes the recording never saw (key '1.bias', '1.weight'), "
    )


def test_a_truncated_checkpoint_fails_naming_file_and_key_and_leaves_the_module_deferred(tmp_path):
    file = tmp_path / "w.safetensors"
    save_file({"weight": torch.ones(4, 4), "bias": torch.ones(4)}, str(file))
    model = deferred_init(nn.Linear, 4, 4)
    load_checkpoint(model, file)
    with keeping_stamp(file):  # cut, and dated back: the read itself must fail, naming file and key
        rewrite_data(file, lambda data: data[:10])
    with pytest.raises(MaterializationError) as error:
        materialize_module(model)
    message = str(error.value)
    assert f"{file}" in message and ("'weight'" in message or "'bias'" in message)
    assert explorer.is_deferred(model.weight) and explorer.is_deferred(model.bias)


def test_a_checkpoint_rewritten_with_another_shape_is_refused_as_changed_since_recording(tmp_path):
    file = tmp_path / "w.safetensors"
    save_file({"weight": torch.ones(4, 4), "bias": torch.ones(4)}, str(file))
    model = deferred_init(nn.Linear, 4, 4)
    load_checkpoint(model, file)
    save_file({"weight": torch.ones(2, 8), "bias": torch.ones(4)}, str(tmp_path / "other.safetensors"))
    with keeping_stamp(file):  # the same size, in place, dated back: the header check itself must see it
        file.write_bytes((tmp_path / "other.safetensors").read_bytes())
    with pytest.raises(MaterializationError, match=(
            rf"checkpoint {file} holds 'weight' as torch.float32 \[2, 8\], but it was recorded as torch.float32 "
            r"\[4, 4\]: the file changed since; record again")):
        materialize_module(model)
    assert explorer.is_deferred(model.weight)


def test_load_checkpoint_makes_the_overwritten_init_dead_and_equals_load_state_dict(tmp_path):
    torch.manual_seed(5)
    source = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4)).to(torch.bfloat16)
    save_file(source.state_dict(), str(tmp_path / "w.safetensors"))
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    eager.load_state_dict(source.state_dict())
    model = deferred_init(lambda: nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4)))
    load_checkpoint(model, tmp_path / "w.safetensors")
    graph = handle_of(model[0].weight).graph
    closure = graph.closure_of([handle_of(model[0].weight).tensor_id], skip_dead_writes=True)
    assert [graph.ops[i].label for i in closure if graph.ops[i].random] == []  # the uniform_ init is dead
    materialize_module(model)
    assert_same(model, eager)


def test_load_checkpoint_reads_a_sharded_directory(tmp_path):
    directory = saved_llama(tmp_path, torch.bfloat16, sharded=True)
    eager = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model = deferred_init(transformers.LlamaForCausalLM, tiny_config(False))
    load_checkpoint(model, directory)
    materialize_module(model)
    assert_same(model, eager)


def test_load_checkpoint_with_missing_or_unexpected_keys_names_them_and_loads_nothing(tmp_path):
    file = tmp_path / "w.safetensors"
    save_file({"weight": torch.ones(4, 4), "extra": torch.ones(1)}, str(file))
    model = deferred_init(nn.Linear, 4, 4)
    graph = handle_of(model.weight).graph
    ops = len(graph.ops)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(model, file)
    assert str(error.value) == (f"{file} does not fit Linear: missing 1 key(s): bias; unexpected 1 key(s): extra "
                                "(strict=False loads the keys both have)")
    assert len(graph.ops) == ops
    load_checkpoint(model, file, strict=False)
    materialize_module(model)
    assert torch.equal(model.weight, torch.ones(4, 4))


def test_load_checkpoint_with_another_shape_names_it_and_loads_nothing_into_a_partly_real_module(tmp_path):
    # before: the real tensors were loaded first, then load_state_dict's size mismatch left it half-loaded
    file = tmp_path / "w.safetensors"
    save_file({"0.weight": torch.ones(3, 4), "0.bias": torch.ones(3), "1.weight": torch.ones(2, 5),
               "1.bias": torch.ones(2)}, str(file))
    model = deferred_init(lambda: nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)))
    materialize_module(model[1])
    bias = model[1].bias.detach().clone()
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(model, file, strict=False)
    assert str(error.value) == (f"{file} does not fit Sequential: size mismatch for 1 key(s): 1.weight: [2, 5] in "
                                "w.safetensors, [2, 3] in the module; nothing was loaded")
    assert torch.equal(model[1].bias, bias) and explorer.is_deferred(model[0].weight)


def test_a_one_element_tensor_loads_into_a_scalar_as_load_state_dict_takes_it(tmp_path):
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.tensor(1.0))

    file = tmp_path / "w.safetensors"
    save_file({"scale": torch.tensor([3.0])}, str(file))
    model = deferred_init(Scaled)
    assert explorer.check_checkpoint(model, file).ok
    load_checkpoint(model, file)
    assert torch.equal(materialize_module(model).scale, torch.tensor(3.0))


def test_load_checkpoint_names_a_missing_shard_and_a_foreign_file(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"weight": "gone.safetensors"}}))
    model = deferred_init(nn.Linear, 4, 4)
    recorded = len(handle_of(model.weight).graph.ops)
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: shard 'gone.safetensors' \(holding "
                                              r"'weight'\) does not exist in"):
        load_checkpoint(model, tmp_path)
    foreign = tmp_path / "notes.safetensors"
    foreign.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=rf"{foreign}"):
        load_checkpoint(model, foreign)
    assert explorer.is_deferred(model.weight) and len(handle_of(model.weight).graph.ops) == recorded


def test_load_checkpoint_into_an_eager_module_is_load_state_dict(tmp_path):
    save_file({"weight": torch.full((4, 4), 2.0), "bias": torch.ones(4)}, str(tmp_path / "w.safetensors"))
    module = load_checkpoint(nn.Linear(4, 4), tmp_path / "w.safetensors")
    assert torch.equal(module.weight, torch.full((4, 4), 2.0)) and not explorer.is_fake(module.weight)


def test_load_checkpoint_into_a_partly_materialized_module_reads_the_real_part_now(tmp_path):
    torch.manual_seed(5)
    source = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    save_file(source.state_dict(), str(tmp_path / "w.safetensors"))
    model = deferred_init(lambda: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
    materialize_module(model[0])
    load_checkpoint(model, tmp_path / "w.safetensors")
    assert not explorer.is_fake(model[0].weight) and explorer.is_fake(model[1].weight)
    assert torch.equal(model[0].weight, source[0].weight)
    materialize_module(model)
    assert_same(model, source)


def test_load_checkpoint_refuses_a_dtype_this_torch_cannot_load_before_recording_anything(tmp_path):
    # an MXFP4 checkpoint's "F4" entry, after keys torch can load
    header = {"a.weight": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]},
              "a.bias": {"dtype": "F32", "shape": [4], "data_offsets": [64, 80]},
              "b.weight": {"dtype": "F4", "shape": [4, 4], "data_offsets": [80, 88]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (tmp_path / "f4.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(88))

    def build() -> nn.Module:
        module = nn.Module()
        module.a, module.b = nn.Linear(4, 4), nn.Linear(4, 4, bias=False)
        return module

    model = deferred_init(build)
    ops_before = len(explorer.inspect(model).ops)
    with pytest.raises(CheckpointError, match=r"'b.weight' is stored as F4, which this torch cannot load"):
        load_checkpoint(model, tmp_path / "f4.safetensors")
    assert len(explorer.inspect(model).ops) == ops_before  # nothing recorded


class _ViewsItsWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 3)
        self.register_buffer("row", self.lin.weight.detach()[1])  # a buffer viewing the weight


def test_load_checkpoint_after_materializing_a_weight_a_deferred_buffer_views_equals_eager(tmp_path):
    torch.manual_seed(3)
    state = {key: torch.randn_like(value).contiguous() for key, value in _ViewsItsWeight().state_dict().items()}
    save_file(state, str(tmp_path / "v.safetensors"))
    torch.manual_seed(0)
    eager = _ViewsItsWeight()
    eager.load_state_dict(state)  # the row, written last, wins in the weight too
    torch.manual_seed(0)
    model = deferred_init(_ViewsItsWeight)
    materialize_module(model.lin)
    load_checkpoint(model, tmp_path / "v.safetensors")
    materialize_module(model)
    assert_same(model, eager)


def source_and_copy(tmp_path):  # noqa: ANN001, ANN201
    torch.manual_seed(5)
    source = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).to(torch.bfloat16)
    model = deferred_init(lambda: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
    return source, model


def test_load_checkpoint_from_a_torch_save_file_is_recorded_and_equals_load_state_dict(tmp_path):
    source, model = source_and_copy(tmp_path)
    torch.save({"state_dict": source.state_dict(), "step": 7}, tmp_path / "train.pt")
    load_checkpoint(model, tmp_path / "train.pt")
    graph = handle_of(model[0].weight).graph
    assert sum(op.label == "explorer.read_torch.default" for op in graph.ops) == 4
    assert explorer.is_deferred(model)
    materialize_module(model)
    reference = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    reference.load_state_dict(source.state_dict())
    assert_same(model, reference)


class _Counted(nn.Linear):
    """A module with extra state (`get_extra_state`), as quantization and schedulers keep theirs."""

    def __init__(self) -> None:
        super().__init__(3, 3)
        self.steps = 0

    def get_extra_state(self) -> dict:
        return {"steps": self.steps}

    def set_extra_state(self, state: dict) -> None:
        self.steps = state["steps"]


def test_load_checkpoint_restores_extra_state_and_refuses_a_stray_value_as_load_state_dict_does(tmp_path):
    torch.manual_seed(0)
    saved = _Counted()
    saved.steps = 7
    torch.save(saved.state_dict(), tmp_path / "counted.pt")
    model = load_checkpoint(deferred_init(_Counted), tmp_path / "counted.pt")  # strict: every key is there
    assert model.steps == 7
    materialize_module(model)
    assert torch.equal(model.weight, saved.weight)
    stray = {**nn.Linear(3, 3).state_dict(), "step": 5}
    torch.save(stray, tmp_path / "stray.pt")
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "step"'):
        nn.Linear(3, 3).load_state_dict(torch.load(tmp_path / "stray.pt"))  # eager
    with pytest.raises(CheckpointError, match=r"does not fit Linear: unexpected 1 key\(s\): step \(strict=False"):
        load_checkpoint(deferred_init(nn.Linear, 3, 3), tmp_path / "stray.pt")


def test_load_checkpoint_from_a_dcp_directory_is_recorded_and_equals_load_state_dict(tmp_path):
    import torch.distributed.checkpoint as dcp

    source, model = source_and_copy(tmp_path)
    with pytest.warns(UserWarning):
        dcp.save(source.state_dict(), checkpoint_id=tmp_path / "dcp")
    load_checkpoint(model, tmp_path / "dcp")
    graph = handle_of(model[0].weight).graph
    assert sum(op.label == "explorer.read_dcp.default" for op in graph.ops) == 4
    materialize_module(model)
    reference = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    reference.load_state_dict(source.state_dict())
    assert_same(model, reference)


def test_a_dcp_checkpoint_cut_after_loading_fails_naming_directory_and_key_and_leaves_the_module_deferred(tmp_path):
    # DCP's CheckpointException is a BaseException: it passed `except Exception` unnamed
    import torch.distributed.checkpoint as dcp

    source, model = source_and_copy(tmp_path)
    with pytest.warns(UserWarning):
        dcp.save(source.state_dict(), checkpoint_id=tmp_path / "dcp")
    load_checkpoint(model, tmp_path / "dcp")
    for data in (tmp_path / "dcp").glob("*.distcp"):
        with keeping_stamp(data):  # garbage of the same size, dated back: the read itself fails
            data.write_bytes(bytes(data.stat().st_size))
    with pytest.raises(MaterializationError, match=rf"^reading '[\w.]+' from checkpoint {tmp_path / 'dcp'} failed: "):
        materialize_module(model)
    assert all(explorer.is_fake(tensor) for tensor in model.state_dict().values())


def test_torch_load_inside_deferred_init_reads_nothing_and_replays_the_file(tmp_path):
    torch.manual_seed(5)
    torch.save(nn.Linear(4, 4).state_dict(), tmp_path / "w.pt")

    def loaded() -> nn.Module:
        module = nn.Linear(4, 4)
        module.load_state_dict(torch.load(tmp_path / "w.pt", weights_only=True))
        return module

    model = deferred_init(loaded)
    assert torch.load is not None and torch.load.__name__ == "load"  # restored after the scope
    graph = handle_of(model.weight).graph
    assert [op.label for op in graph.ops].count("explorer.read_torch.default") == 2
    torch.manual_seed(0)
    eager = loaded()
    materialize_module(model)
    assert_same(model, eager)


def test_each_torch_load_read_is_memory_of_its_own_as_eagers_torch_load(tmp_path):
    torch.save({"scale": torch.ones(3), "bias": torch.zeros(3)}, tmp_path / "s.pt")

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            scale = torch.load(tmp_path / "s.pt", weights_only=True)["scale"]
            scale.mul_(2)  # in place, on the tensor the file gave
            self.register_buffer("scale", scale)
            self.bias = nn.Parameter(torch.load(tmp_path / "s.pt", weights_only=True)["bias"])

    first, second = deferred_init(Scaled), deferred_init(Scaled)
    materialize_module(first)
    materialize_module(second)
    again = materialize_tensor(deferred_init(Scaled).scale)
    for module in (first, second):
        assert module.scale.tolist() == [2.0, 2.0, 2.0]  # doubled once, as eager's
    assert again.tolist() == [2.0, 2.0, 2.0]
    first.bias.data.add_(1)  # training one model leaves the other alone
    assert second.bias.tolist() == [0.0, 0.0, 0.0]
    pointers = {t.untyped_storage().data_ptr() for m in (first, second) for t in (m.scale, m.bias)}
    assert len(pointers) == 4


def test_safe_open_bound_by_a_users_import_is_a_recorded_read(tmp_path):
    torch.manual_seed(3)
    save_file({"w": torch.randn(4, 4)}, tmp_path / "w.safetensors")

    def build() -> nn.Module:
        module = nn.Linear(4, 4, bias=False)
        with safe_open(tmp_path / "w.safetensors", "pt") as f:  # this module's own `safe_open`
            module.weight = nn.Parameter(f.get_tensor("w"))
        return module

    model = deferred_init(build)
    assert safe_open is explorer.record.checkpoint_reads.original_safe_open()  # back after the scope
    assert "explorer.read_safetensors.default" in [op.label for op in handle_of(model.weight).graph.ops]
    materialize_module(model)
    assert torch.equal(model.weight, build().weight)


def test_a_torch_save_file_with_code_is_refused_inside_deferred_init(tmp_path):
    torch.save({"weight": torch.ones(2), "how": CodeCarrier()}, tmp_path / "code.pt")

    def loaded() -> nn.Module:
        module = nn.Linear(2, 1)
        torch.load(tmp_path / "code.pt", weights_only=True)
        return module

    with pytest.raises(Exception, match="Weights only load failed"):
        deferred_init(loaded)
    with pytest.raises(CheckpointError, match=r"code.pt: refused: it pickles .*CodeCarrier"):
        load_checkpoint(deferred_init(nn.Linear, 2, 1), tmp_path / "code.pt")


class CodeCarrier:
    """A pickled object: `weights_only` refuses to import it."""


@pytest.mark.parametrize("how", ["from_pretrained", "load_checkpoint-safetensors", "load_checkpoint-torch-save"])
def test_a_ranks_rows_of_a_checkpoint_backed_parameter_are_read_alone_and_equal_the_whole(tmp_path, how):
    from explorer.replay.rows import draw_rows

    directory = saved_llama(tmp_path / "hf", torch.bfloat16, sharded=True)
    if how == "from_pretrained":
        model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, directory, dtype=torch.float32)
    else:
        model = deferred_init(transformers.LlamaForCausalLM, tiny_config(False))
        if how.endswith("torch-save"):
            torch.save(transformers.LlamaForCausalLM.from_pretrained(directory).state_dict(), tmp_path / "w.pt")
            load_checkpoint(model, tmp_path / "w.pt")
        else:
            load_checkpoint(model, directory)
    weight = model.model.layers[1].mlp.up_proj.weight
    rows = draw_rows(weight, 5, 40)
    assert rows is not None and rows.dtype == torch.float32
    assert torch.equal(rows, explorer.materialize_tensor(weight)[5:40])


def test_load_checkpoint_fills_a_tied_name_that_save_pretrained_stored_once(tmp_path):
    directory = saved_llama(tmp_path, torch.float32, sharded=False, tie=True)
    eager = transformers.LlamaForCausalLM.from_pretrained(directory)
    model = deferred_init(transformers.LlamaForCausalLM, tiny_config(True))
    load_checkpoint(model, directory)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    materialize_module(model)
    assert_same(model, eager)


def test_torch_load_gives_back_a_saved_parameter_and_requires_grad_as_eager(tmp_path):
    torch.save({"emb": nn.Parameter(torch.randn(10, 4)), "scale": torch.ones(3).requires_grad_()}, tmp_path / "p.pt")

    class Loads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            loaded = torch.load(tmp_path / "p.pt", weights_only=True)
            self.emb = loaded["emb"]  # an nn.Parameter: registered
            self.scale = loaded["scale"]  # a plain tensor that requires grad: an attribute

    eager, model = Loads(), deferred_init(Loads)
    assert [name for name, _ in model.named_parameters()] == ["emb"] == [name for name, _ in eager.named_parameters()]
    assert model.scale.requires_grad is True and not isinstance(model.scale, nn.Parameter)
    materialize_module(model)
    assert isinstance(model.emb, nn.Parameter) and model.emb.requires_grad
    assert torch.equal(model.emb, eager.emb) and list(model.state_dict()) == ["emb"]


def test_torch_load_reads_tuple_keys_and_the_pre_zip_format(tmp_path):
    nested = {("enc", 0): torch.arange(2.0), "x": [torch.ones(1), {(1, (2, "a")): torch.full((1,), 3.0)}]}
    torch.save(nested, tmp_path / "tuple_keys.pt")
    torch.save(nested, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)

    def build(name: str) -> nn.Module:
        module = nn.Module()
        loaded = torch.load(tmp_path / name, weights_only=True)
        module.register_buffer("first", loaded[("enc", 0)])
        module.register_buffer("deep", loaded["x"][1][(1, (2, "a"))])
        return module

    for name in ("tuple_keys.pt", "legacy.pt"):
        model = materialize_module(deferred_init(build, name))
        assert model.first.tolist() == [0.0, 1.0] and model.deep.tolist() == [3.0], name
    table = explorer.inspect(deferred_init(build, "tuple_keys.pt")).tensors.set_index("name")
    assert "('enc', 0)" in str(table.loc["first"].to_dict())


def test_load_checkpoint_reads_a_safetensors_file_by_its_content_whatever_its_name(tmp_path):
    save_file({"weight": torch.ones(4, 4), "bias": torch.zeros(4)}, tmp_path / "weights.st")
    model = deferred_init(nn.Linear, 4, 4)
    load_checkpoint(model, tmp_path / "weights.st")
    materialize_module(model)
    assert model.weight.eq(1).all() and model.bias.eq(0).all()


def test_safe_open_for_numpy_gives_arrays_read_for_real(tmp_path):
    import numpy as np
    import safetensors

    save_file({"w": torch.arange(9.0).view(3, 3)}, tmp_path / "w.safetensors")

    def build() -> nn.Module:
        module = nn.Module()
        with safetensors.safe_open(tmp_path / "w.safetensors", framework="np") as f:
            array = f.get_tensor("w")
        assert isinstance(array, np.ndarray)
        module.register_buffer("w", torch.from_numpy(array) * 2)
        return module

    model = materialize_module(deferred_init(build))
    assert torch.equal(model.w, build().w)
