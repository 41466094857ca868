"""Opening a Hub repo under deferred init (explorer/record/hub_open.py) against a local Hub
(tests/support/hub_server.py): headers only, then one layer's bytes on materialization."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import explorer
from explorer import deferred_init, materialize_module
from explorer.errors import CheckpointError, MaterializationError
from explorer.record.fake import handle_of
from tests.support.hub_server import LLAMA_REPO, Fault

transformers = pytest.importorskip("transformers")


def _shard_bytes(server) -> int:
    return server.bytes_served(".safetensors")


@pytest.fixture
def opened(local_hub):
    """The Llama repo opened under deferred_init, and the bytes of shards that took."""
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, LLAMA_REPO)
    return model, _shard_bytes(local_hub)


def test_opening_reads_headers_only(opened, llama_checkpoint):
    model, shard_bytes = opened
    shards = sorted(llama_checkpoint.glob("*.safetensors"))
    assert len(shards) == 3 and sum(p.stat().st_size for p in shards) >= 200_000_000
    headers = sum(8 + int.from_bytes(p.read_bytes()[:8], "little") for p in shards)
    assert shard_bytes == headers <= 1_000_000  # 8 + the JSON header of each shard, nothing after
    assert all(explorer.is_deferred(p) for p in model.parameters())


@pytest.fixture(scope="module")
def eager_layer3(llama_checkpoint):
    """Layer 3's tensors as eager `from_pretrained` of the same local files gives them, in bf16 and fp32."""
    out = {}
    for dtype in (None, torch.float32):
        kwargs = {} if dtype is None else {"dtype": dtype}
        model = transformers.LlamaForCausalLM.from_pretrained(llama_checkpoint, **kwargs)
        out[dtype] = {k: v.clone() for k, v in model.model.layers[3].state_dict().items()}
        del model
    return out


def _assert_bitwise(layer: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    got = layer.state_dict()
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name].view(torch.uint8), tensor.view(torch.uint8)), name


@pytest.mark.parametrize("dtype", [None, torch.float32], ids=["bf16", "fp32"])
def test_one_layer_fetches_its_bytes_equal_to_eager(local_hub, eager_layer3, dtype):
    kwargs = {} if dtype is None else {"dtype": dtype}
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, LLAMA_REPO, **kwargs)
    layer = model.model.layers[3]
    before = _shard_bytes(local_hub)
    materialize_module(layer)
    fetched = _shard_bytes(local_hub) - before
    stored = sum(v.numel() * 2 for v in eager_layer3[None].values())  # bf16 in the files
    assert fetched == stored  # exactly its bytes (<= 1.05 x + 64 KiB asked)
    _assert_bitwise(layer, eager_layer3[dtype])

    explorer.release_module(layer)
    again = _shard_bytes(local_hub)
    materialize_module(layer)
    assert _shard_bytes(local_hub) == again
    _assert_bitwise(layer, eager_layer3[dtype])


def test_a_layer_is_fetched_in_few_coalesced_requests(opened, local_hub):
    model, _ = opened
    before = len(local_hub.requests)
    materialize_module(model.model.layers[3])
    ranged = [r for r in local_hub.requests[before:] if r.range is not None]
    assert 1 <= len(ranged) <= 2  # one per run of contiguous tensors in a shard (9 tensors)


def _shard_of(checkpoint, key: str) -> str:
    import json

    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    return index["weight_map"][key]


def test_a_500_is_retried(opened, local_hub, llama_checkpoint, eager_layer3):
    model, _ = opened
    local_hub.faults.append(Fault(_shard_of(llama_checkpoint, "model.layers.3.mlp.up_proj.weight"), "500", times=1))
    materialize_module(model.model.layers[3])
    assert [r.status for r in local_hub.requests if r.status == 500] == [500]
    _assert_bitwise(model.model.layers[3], eager_layer3[None])


def test_a_layer_whose_body_is_cut_fetches_only_the_rest(opened, local_hub, llama_checkpoint, eager_layer3):
    model, _ = opened
    local_hub.faults.append(Fault(_shard_of(llama_checkpoint, "model.layers.3.mlp.up_proj.weight"), "short", times=1))
    before = len(local_hub.requests)
    materialize_module(model.model.layers[3])
    ranged = [r for r in local_hub.requests[before:] if r.range is not None]
    spans = [tuple(int(n) for n in r.range.removeprefix("bytes=").split("-")) for r in ranged]
    cut = next(i for i, (r, (first, last)) in enumerate(zip(ranged, spans)) if r.body_bytes < last + 1 - first)
    first, last = spans[cut]
    assert ranged[cut].body_bytes == (last + 1 - first) // 2
    assert (first + (last + 1 - first) // 2, last) in spans[cut + 1 :]  # the rest only
    assert sum(r.body_bytes for r in ranged) == 25_694_208  # the layer's bytes, once
    _assert_bitwise(model.model.layers[3], eager_layer3[None])


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("404", "HTTP 404"),
        ("wrong-range", "Content-Range"),
        ("short", "RemoteProtocolError"),
        ("etag", "changed upstream: ETag"),
        ("commit", "changed upstream: served from commit ffff"),
        ("reset", "Connection reset by peer"),
        ("401", "HTTP 401 (Unauthorized): the repo is gated or private"),
        ("hang", "ReadTimeout"),
    ],
)
def test_a_fault_names_file_and_tensor_and_leaves_the_module(
    opened, local_hub, llama_checkpoint, kind, says, tmp_path, monkeypatch
):
    from explorer import hub_fetch

    monkeypatch.setattr(hub_fetch, "RETRY", dataclasses.replace(hub_fetch.RETRY, timeout_s=0.5))

    model, _ = opened
    layer = model.model.layers[3]
    shard = _shard_of(llama_checkpoint, "model.layers.3.mlp.up_proj.weight")
    local_hub.faults.append(Fault(shard, kind, times=99))
    with pytest.raises(MaterializationError) as caught:
        materialize_module(layer)
    message = str(caught.value)
    assert f"{LLAMA_REPO}@" in message and shard in message and "model.layers.3." in message and says in message
    assert all(explorer.is_deferred(p) for p in layer.parameters())
    assert local_hub.faults[0].times < 99
    cached = [p for p in (tmp_path / "hf" / "deferred-explorer" / "ranges").rglob("*") if p.is_file()]
    assert not [p for p in cached if p.name.endswith(".partial")]


def test_a_pickled_checkpoint_is_refused(local_hub, tmp_path):
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=64
    )
    directory = tmp_path / "bin-repo"
    directory.mkdir()
    config.save_pretrained(directory)
    torch.save(transformers.LlamaForCausalLM(config).state_dict(), directory / "pytorch_model.bin")
    local_hub.add_repo("test-org/pickled", directory)
    with pytest.raises(CheckpointError, match=r"test-org/pickled: pytorch_model.bin is a pickled checkpoint"):
        deferred_init(transformers.LlamaForCausalLM.from_pretrained, "test-org/pickled")
    assert local_hub.bytes_served(".bin") == 0


def test_offline_after_a_materialization_fetches_nothing(opened, local_hub, monkeypatch, eager_layer3):
    from huggingface_hub import constants

    model, _ = opened
    layer = model.model.layers[3]
    materialize_module(layer)
    explorer.release_module(layer)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    served = len(local_hub.requests)
    materialize_module(layer)
    assert len(local_hub.requests) == served
    _assert_bitwise(layer, eager_layer3[None])
    with pytest.raises(MaterializationError, match=r"HF_HUB_OFFLINE is set and these bytes are not in the range cache"):
        materialize_module(model.model.layers[4])
    assert len(local_hub.requests) == served

    reopened = deferred_init(transformers.LlamaForCausalLM.from_pretrained, LLAMA_REPO)  # from the pins and stubs
    materialize_module(reopened.model.layers[3])
    assert len(local_hub.requests) == served
    _assert_bitwise(reopened.model.layers[3], eager_layer3[None])


def test_rows_of_a_weight_fetch_only_their_bytes(opened, local_hub, eager_layer3):
    model, _ = opened
    weight = model.model.layers[3].mlp.up_proj.weight  # [2816, 1024] bf16
    before = _shard_bytes(local_hub)
    rows = explorer.materialize_tensor(weight[5:9])
    assert _shard_bytes(local_hub) - before == 4 * 1024 * 2
    assert torch.equal(rows.view(torch.uint8), eager_layer3[None]["mlp.up_proj.weight"][5:9].view(torch.uint8))


def test_a_token_is_sent_and_never_shown(opened, local_hub, llama_checkpoint):
    secret = "hf_not_a_real_token_31337"
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, LLAMA_REPO, token=secret)
    layer = model.model.layers[2]
    shard = _shard_of(llama_checkpoint, "model.layers.2.mlp.up_proj.weight")
    local_hub.faults.append(Fault(shard, "404", times=99))
    with pytest.raises(MaterializationError) as caught:
        materialize_module(layer)
    assert secret not in str(caught.value)
    assert local_hub.authorizations and set(local_hub.authorizations) == {f"Bearer {secret}"}
    graph = handle_of(layer.mlp.up_proj.weight).graph
    assert secret not in repr([(op.args, op.kwargs) for op in graph.ops])


def test_a_token_is_not_in_the_fx_export_nor_an_exported_diagram(local_hub):
    from explorer.render.export import to_html

    secret = "hf_not_a_real_token_27182"
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, LLAMA_REPO, token=secret)
    layer = model.model.layers[1]
    program = explorer.to_fx(layer)
    assert secret not in program.code and secret not in repr(program.graph)
    assert any("read_safetensors" in str(node.target) for node in program.graph.nodes)  # the Hub reads are in it
    page = to_html(explorer.op_graph(layer), title="layer 1")
    assert secret not in page and "layers.1" in page
    assert local_hub.authorizations and set(local_hub.authorizations) == {f"Bearer {secret}"}


def test_load_and_check_a_hub_checkpoint_by_its_hub_url(local_hub, eager_layer3):
    config = transformers.LlamaConfig.from_pretrained(LLAMA_REPO)
    model = deferred_init(transformers.LlamaForCausalLM, config)
    report = explorer.check_checkpoint(model, f"hub://{LLAMA_REPO}")
    assert report.ok, report
    opened = _shard_bytes(local_hub)
    assert opened <= 1_000_000
    explorer.load_checkpoint(model, f"hub://{LLAMA_REPO}@main")
    layer = model.model.layers[3]
    before = _shard_bytes(local_hub)
    materialize_module(layer)
    assert _shard_bytes(local_hub) - before == sum(v.numel() * 2 for v in eager_layer3[None].values())
    _assert_bitwise(layer, eager_layer3[torch.float32])  # load_state_dict copies bf16 into fp32 parameters


def test_a_hub_url_without_safetensors_is_refused(local_hub, tmp_path):
    directory = tmp_path / "bin-only"
    directory.mkdir()
    torch.save({"w": torch.zeros(2)}, directory / "pytorch_model.bin")
    local_hub.add_repo("test-org/bin-only", directory)
    with pytest.raises(CheckpointError, match=r"only the pickled pytorch_model.bin, which cannot be read lazily"):
        explorer.check_checkpoint(torch.nn.Linear(2, 2), "hub://test-org/bin-only")


def test_reads_name_the_repo_commit_and_file_they_come_from(opened, llama_checkpoint):
    model, _ = opened
    reads = explorer.inspect(model.model.layers[3]).reads
    shard = _shard_of(llama_checkpoint, "model.layers.3.mlp.up_proj.weight")
    assert set(reads["file"]) == {f"{LLAMA_REPO}@{'c0ffee' * 2}/{shard}"}
    assert reads["offset"].notna().all()


def test_save_checkpoint_of_a_hub_model_writes_the_hub_values(local_hub, tmp_path):
    import safetensors.torch

    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256
    )
    source = tmp_path / "tiny"
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(source)
    local_hub.add_repo("test-org/tiny", source)
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, "test-org/tiny")
    written = explorer.save_checkpoint(model, tmp_path / "out")
    saved = {
        k: v for file in written if file.suffix == ".safetensors" for k, v in safetensors.torch.load_file(file).items()
    }
    stored = safetensors.torch.load_file(source / "model.safetensors")
    assert stored.keys() <= saved.keys()
    for key, tensor in stored.items():
        assert torch.equal(saved[key].view(torch.uint8), tensor.view(torch.uint8)), key
    assert all(explorer.is_deferred(p) for p in model.parameters())


def test_a_shard_missing_at_opening_is_named(local_hub, llama_checkpoint):
    shard = _shard_of(llama_checkpoint, "model.layers.3.mlp.up_proj.weight")
    local_hub.faults.append(Fault(shard, "404", times=99))
    with pytest.raises(CheckpointError, match=rf"fetching the header .* of {LLAMA_REPO}@\w+/{shard} failed: HTTP 404"):
        deferred_init(transformers.LlamaForCausalLM.from_pretrained, LLAMA_REPO)


def test_a_subfolder_at_a_pinned_revision_opens_and_matches_eager(local_hub, tmp_path):
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256
    )
    repo = tmp_path / "repo"
    eager = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    eager.save_pretrained(repo / "sub", max_shard_size="100KB")
    commit = "0123456789abcdef" * 2 + "01234567"
    local_hub.add_repo("test-org/nested", repo, commit=commit)
    model = deferred_init(
        transformers.LlamaForCausalLM.from_pretrained, "test-org/nested", revision=commit, subfolder="sub"
    )
    assert len({r.path for r in local_hub.requests if ".safetensors" in r.path}) > 1  # sharded
    materialize_module(model)
    for name, tensor in eager.state_dict().items():
        assert torch.equal(model.state_dict()[name].view(torch.uint8), tensor.view(torch.uint8)), name


def test_hf_token_from_the_environment_is_sent_with_range_requests(local_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment")
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, LLAMA_REPO)
    materialize_module(model.model.norm)
    ranged = [r for r in local_hub.requests if r.range is not None]
    assert ranged and {r.authorization for r in ranged} == {"Bearer hf_from_the_environment"}


def test_the_op_graph_names_a_hub_read_by_repo_commit_and_file(opened, llama_checkpoint):
    model, _ = opened
    shard = _shard_of(llama_checkpoint, "model.layers.3.mlp.up_proj.weight")
    dot = explorer.op_graph(model.model.layers[3].mlp).source
    assert f"read {LLAMA_REPO}@{'c0ffee' * 2}/{shard}" in dot


def _layer_bytes(layer: torch.nn.Module) -> int:
    return sum(t.numel() * 2 for t in layer.state_dict().values())  # bf16 in the files


def test_bytes_to_fetch_counts_a_layer_once_and_cached_ranges_apart(opened, local_hub):
    from explorer.hub_fetch import HubBytes, bytes_to_fetch

    model, _ = opened
    host = local_hub.endpoint.split("://", 1)[1]
    reads = explorer.inspect(model).reads
    layer3 = reads[reads["key"].str.startswith("model.layers.3.")]
    wanted = [*zip(layer3["path"], layer3["key"]), *zip(layer3["path"], layer3["key"])]  # each twice
    assert bytes_to_fetch(wanted) == {host: HubBytes(fetch=25_694_208, cached=0)}
    materialize_module(model.model.layers[3])
    assert bytes_to_fetch(wanted) == {host: HubBytes(fetch=0, cached=25_694_208)}
    assert _layer_bytes(model.model.layers[3]) == 25_694_208


def test_the_state_is_remote_until_the_bytes_are_cached(opened):
    model, _ = opened
    layer = model.model.layers[3]
    states = explorer.inspect(model).tensors.set_index("name")["state"]
    assert states["model.layers.3.mlp.up_proj.weight"] == "remote"
    assert states["model.rotary_emb.inv_freq"] == "fake"  # computed, in no file
    materialize_module(layer)
    explorer.release_module(layer)  # fake again, its bytes in the range cache: a local read now
    states = explorer.inspect(model).tensors.set_index("name")["state"]
    assert (states["model.layers.3.mlp.up_proj.weight"], states["model.layers.4.mlp.up_proj.weight"]) == (
        "disk",
        "remote",
    )
    modules = explorer.inspect(model).modules.set_index("name")
    assert modules.loc["model.layers.3", "remote_bytes"] == 0
    assert modules.loc["model.layers.4", ["disk_bytes", "remote_bytes"]].tolist() == [25_694_208, 25_694_208]


def test_fetch_reports_bytes_and_a_raising_report_cancels_between_requests(opened, local_hub, monkeypatch):
    from explorer import hub_fetch

    model, _ = opened
    monkeypatch.setattr(hub_fetch, "_PARALLEL", 1)  # one request at a time: what a cancel drops is exact
    reports: list[hub_fetch.FetchProgress] = []

    def cancel_after_first(report: hub_fetch.FetchProgress) -> None:
        reports.append(report)
        raise KeyboardInterrupt

    before = _shard_bytes(local_hub)
    with pytest.raises(KeyboardInterrupt), hub_fetch.reporting_fetches(cancel_after_first):
        materialize_module(model)
    assert len(reports) == 1 and reports[0].total_bytes == 271_091_712  # every tensor of the 3 shards
    assert _shard_bytes(local_hub) - before == reports[0].done_bytes < reports[0].total_bytes
    assert reports[0].hosts == local_hub.endpoint.split("://", 1)[1] and reports[0].bytes_per_second > 0
    assert all(explorer.is_deferred(p) for p in model.parameters())


def test_save_checkpoint_streams_a_hub_model_in_bounded_memory(local_hub, llama_checkpoint, tmp_path):
    """In a process of its own (the Hub's buffers stay here): the whole shards are served once, the
    range cache stays empty, the fp32 files equal the stored bf16 converted, and the peak resident
    memory the save adds stays under the largest tensor it writes (materializing each tensor whole,
    as before streaming, added 1.5x it: 197 MB)."""
    import json
    import os
    import subprocess
    import sys

    import safetensors.torch

    out = tmp_path / "out"
    env = {
        **os.environ,
        "HF_ENDPOINT": local_hub.endpoint,
        "HF_HOME": str(tmp_path / "child-hf"),
        "EXPLORER_HUB_CACHE": str(tmp_path / "child-cache"),
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
    }
    env.pop("HF_TOKEN", None)
    child = subprocess.run(
        [sys.executable, "-m", "tests.support.hub_save_probe", LLAMA_REPO, str(out), "float32"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    got = json.loads(child.stdout.splitlines()[-1])
    shards = sorted(llama_checkpoint.glob("*.safetensors"))
    assert _shard_bytes(local_hub) == sum(p.stat().st_size for p in shards)  # headers + every tensor, once
    assert got["cache_bytes"] == 0
    assert got["saved_bytes"] == 542_183_424 and got["largest"] == 131_072_000
    assert got["peak_growth"] < got["largest"]
    saved = {}
    for file in sorted(out.glob("*.safetensors")):
        saved |= safetensors.torch.load_file(file)
    stored = {}
    for file in shards:
        stored |= safetensors.torch.load_file(file)
    assert sorted(saved) == sorted(stored)
    for key, tensor in stored.items():
        assert saved[key].dtype == torch.float32, key
        assert torch.equal(saved[key].view(torch.uint8), tensor.to(torch.float32).view(torch.uint8)), key


def test_a_body_cut_mid_tensor_is_resumed_from_the_bytes_received(local_hub, tmp_path):
    """save_checkpoint streams each tensor; a body cut after half its bytes (the connection closed)
    is asked again from the first byte missing, and the file written is the stored one."""
    import safetensors.torch

    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256
    )
    source = tmp_path / "tiny"
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(source)
    local_hub.add_repo("test-org/tiny", source)
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, "test-org/tiny")
    local_hub.faults.append(Fault("model.safetensors", "short", times=1))
    before = len(local_hub.requests)
    written = explorer.save_checkpoint(model, tmp_path / "out")
    ranged = [r for r in local_hub.requests[before:] if r.range is not None]
    spans = [tuple(int(n) for n in r.range.removeprefix("bytes=").split("-")) for r in ranged]
    cut = next(i for i, (r, (first, last)) in enumerate(zip(ranged, spans)) if r.body_bytes < last + 1 - first)
    first, last = spans[cut]
    half = (last + 1 - first) // 2
    assert ranged[cut].body_bytes == half
    assert ranged[cut + 1].range == f"bytes={first + half}-{last}"  # the rest, not the whole tensor again
    size = (source / "model.safetensors").stat().st_size
    assert local_hub.bytes_served("model.safetensors") == size  # its header at opening, then every byte once
    stored = safetensors.torch.load_file(source / "model.safetensors")
    saved = safetensors.torch.load_file(next(f for f in written if f.suffix == ".safetensors"))
    assert sorted(saved) == sorted(stored)
    for name, tensor in stored.items():
        assert torch.equal(saved[name].view(torch.uint8), tensor.view(torch.uint8)), name


def test_save_checkpoint_of_a_hub_tensor_changed_after_loading_writes_the_changed_values(local_hub, tmp_path):
    """Only a read (and a dtype conversion) is streamed; a weight written after loading is replayed."""
    import safetensors.torch

    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256
    )
    source = tmp_path / "tiny"
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(source)
    local_hub.add_repo("test-org/tiny", source)
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, "test-org/tiny", dtype=torch.float32)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(3)
    written = explorer.save_checkpoint(model, tmp_path / "out")
    saved = safetensors.torch.load_file(next(f for f in written if f.suffix == ".safetensors"))
    stored = safetensors.torch.load_file(source / "model.safetensors")
    changed = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(saved[changed], stored[changed].to(torch.float32) * 3)
    for key, tensor in stored.items():
        if key != changed:
            assert torch.equal(saved[key], tensor.to(torch.float32)), key


def test_releases_that_look_up_one_file_at_a_time_get_header_stubs_too(local_hub, llama_checkpoint, monkeypatch):
    """transformers before `cached_files` (4.45 to about 4.50) looks each weight file up with
    `cached_file`, which its hub module and its loader hold by name: both are wrapped in a deferred
    scope and restored after it. Such a release is stood in for by modules holding only that name."""
    import json
    import sys
    import types
    from pathlib import Path

    from transformers.utils import hub as current_hub

    old_hub, old_loader = types.ModuleType("old_hub"), types.ModuleType("old_loader")
    old_hub.cached_file = old_loader.cached_file = current_hub.cached_file
    monkeypatch.setitem(sys.modules, "transformers.utils.hub", old_hub)
    monkeypatch.setitem(sys.modules, "transformers.modeling_utils", old_loader)
    shard = _shard_of(llama_checkpoint, "model.layers.3.mlp.up_proj.weight")
    with explorer.deferred():
        assert old_loader.cached_file is old_hub.cached_file is not current_hub.cached_file
        index = old_loader.cached_file(LLAMA_REPO, "model.safetensors.index.json")
        stub = old_hub.cached_file(LLAMA_REPO, shard)
        single = old_loader.cached_file(LLAMA_REPO, "model.safetensors", _raise_exceptions_for_missing_entries=False)
    assert old_hub.cached_file is old_loader.cached_file is current_hub.cached_file
    real = (llama_checkpoint / shard).read_bytes()
    header = 8 + int.from_bytes(real[:8], "little")
    assert Path(stub).stat().st_size == len(real) and Path(stub).read_bytes()[:header] == real[:header]
    assert _shard_bytes(local_hub) == header  # the header only
    wanted = json.loads((llama_checkpoint / "model.safetensors.index.json").read_text())
    assert json.loads(Path(index).read_text()) == wanted
    assert single is None  # not in this sharded repo, and asked without raising


def _tiny_llama(directory, seed: int, **save_kwargs) -> transformers.LlamaForCausalLM:
    """A small bf16 Llama from `seed`, saved in `directory` (save_pretrained's `save_kwargs`)."""
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=64
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory, **save_kwargs)
    return model


def _assert_same_bytes(got: torch.nn.Module, expected: torch.nn.Module) -> None:
    wanted = expected.state_dict()
    assert sorted(got.state_dict()) == sorted(wanted)
    for name, tensor in got.state_dict().items():
        assert torch.equal(tensor.view(torch.uint8), wanted[name].view(torch.uint8)), name


def test_a_hub_url_of_a_repo_with_one_file_and_stale_shards_reads_the_one_file(local_hub, tmp_path):
    """from_pretrained and a local folder both take model.safetensors over an index beside it."""
    repo = tmp_path / "both"
    _tiny_llama(repo, seed=1, max_shard_size="20KB")  # shards and their index, left from an older upload
    single = _tiny_llama(tmp_path / "single", seed=2)
    (repo / "model.safetensors").write_bytes((tmp_path / "single" / "model.safetensors").read_bytes())
    local_hub.add_repo("test-org/both", repo)
    eager = transformers.LlamaForCausalLM.from_pretrained(repo)
    _assert_same_bytes(eager, single)
    model = deferred_init(transformers.LlamaForCausalLM, eager.config)
    explorer.load_checkpoint(model, "hub://test-org/both")
    materialize_module(model)
    _assert_same_bytes(model, single.float())  # load_state_dict copies bf16 into fp32 parameters


def test_a_hub_url_names_a_pull_request_revision_and_a_subfolder(local_hub, tmp_path):
    from explorer.record.hub_open import hub_url_parts

    assert hub_url_parts("hub://org/name@refs/pr/1/unet") == ("org/name", "refs/pr/1", "unet")
    assert hub_url_parts("hub://org/name@feature%2Fx") == ("org/name", "feature/x", "")
    assert hub_url_parts("hub://org/name") == ("org/name", None, "")
    eager = _tiny_llama(tmp_path / "pr" / "sub", seed=3)
    local_hub.add_repo("test-org/pr", tmp_path / "pr", commit="a" * 40, revisions=("refs/pr/1",))
    model = deferred_init(transformers.LlamaForCausalLM, eager.config)
    explorer.load_checkpoint(model, "hub://test-org/pr@refs/pr/1/sub")
    materialize_module(model)
    _assert_same_bytes(model, eager.float())


def test_threads_opening_one_repo_at_once_all_get_its_headers(local_hub, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    eager = _tiny_llama(tmp_path / "shared", seed=4, max_shard_size="20KB")
    local_hub.add_repo("test-org/shared", tmp_path / "shared")
    model = deferred_init(transformers.LlamaForCausalLM, eager.config)
    with ThreadPoolExecutor(6) as pool:
        reports = list(pool.map(lambda _: explorer.check_checkpoint(model, "hub://test-org/shared"), range(24)))
    assert all(report.ok for report in reports)


def test_a_server_ignoring_range_is_refused_before_its_body_is_taken(local_hub, llama_checkpoint):
    shard = _shard_of(llama_checkpoint, "model.layers.3.mlp.up_proj.weight")
    local_hub.faults.append(Fault(shard, "ignore-range", times=99))
    with pytest.raises(CheckpointError, match=rf"{shard} failed: HTTP 200 \(the server ignored the Range header\)"):
        deferred_init(transformers.LlamaForCausalLM.from_pretrained, LLAMA_REPO)
    size = (llama_checkpoint / shard).stat().st_size
    assert size > 60_000_000 and _shard_bytes(local_hub) < size // 4  # what the socket buffered, not the file


def test_a_server_not_giving_the_file_size_is_named(local_hub, tmp_path):
    _tiny_llama(tmp_path / "sizeless", seed=5)
    local_hub.add_repo("test-org/sizeless", tmp_path / "sizeless")
    local_hub.faults.append(Fault("model.safetensors", "unknown-size", times=99))
    with pytest.raises(CheckpointError, match=r"model.safetensors: the server did not give the file's size "):
        deferred_init(transformers.LlamaForCausalLM.from_pretrained, "test-org/sizeless")


def test_offline_a_repo_reopens_at_the_commit_a_later_normal_download_fetched(local_hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    _tiny_llama(tmp_path / "v1", seed=6)
    local_hub.add_repo("test-org/moving", tmp_path / "v1", commit="1" * 40)
    materialize_module(deferred_init(transformers.LlamaForCausalLM.from_pretrained, "test-org/moving"))
    _tiny_llama(tmp_path / "v2", seed=7)
    local_hub.add_repo("test-org/moving", tmp_path / "v2", commit="2" * 40)  # main moves on
    transformers.LlamaForCausalLM.from_pretrained("test-org/moving")  # a normal download of it
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    eager = transformers.LlamaForCausalLM.from_pretrained("test-org/moving")
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, "test-org/moving")
    materialize_module(model)
    _assert_same_bytes(model, eager)


def test_bytes_of_a_file_downloaded_whole_are_read_from_that_copy(local_hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    eager = _tiny_llama(tmp_path / "downloaded", seed=8)
    local_hub.add_repo("test-org/downloaded", tmp_path / "downloaded")
    model = deferred_init(transformers.LlamaForCausalLM.from_pretrained, "test-org/downloaded")  # headers only
    transformers.LlamaForCausalLM.from_pretrained("test-org/downloaded")  # then downloaded whole, normally
    before = _shard_bytes(local_hub)
    materialize_module(model.model.layers[0])
    assert _shard_bytes(local_hub) == before  # nothing fetched again
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    materialize_module(model)
    _assert_same_bytes(model, eager)


def test_an_endpoints_credentials_are_not_in_the_folder_that_names_stub_paths():
    from explorer.hub_fetch import endpoint_folder

    folder = endpoint_folder("https://user:hf_secret_31337@mirror.example.com:8443/hub?token=also_secret")
    assert folder.startswith("mirror.example.com_8443_hub-")
    assert "secret" not in folder and "user" not in folder
    assert endpoint_folder("http://127.0.0.1:8080").startswith("127.0.0.1_8080-")  # caches keep their names
    assert endpoint_folder("https://a@h.org") != endpoint_folder("https://b@h.org")  # still told apart
