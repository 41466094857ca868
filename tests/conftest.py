"""Fixtures every test gets, and the local Hub fixtures the engine and widget tests share."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def seeded_generator() -> None:
    """Each test starts from `torch.manual_seed(0)`: its random numbers do not depend on which tests
    ran before, and no deferred draws are owed from their models (a reseed clears what the real
    generator owes eager; see note [Eager's generator after construction])."""
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory):
    """A sharded bfloat16 Llama checkpoint of about 270 MB (3 shards), written once per session."""
    transformers = pytest.importorskip("transformers")
    directory = tmp_path_factory.mktemp("llama-bf16")
    config = transformers.LlamaConfig(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=32000,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory, max_shard_size="100MB")
    return directory


@pytest.fixture(scope="session")
def hub_server():
    """A local Hub (tests/support/hub_server.py) on an ephemeral port, for the whole session."""
    from tests.support.hub_server import serve_hub

    yield from serve_hub()


@pytest.fixture
def local_hub(hub_server, llama_checkpoint, tmp_path, monkeypatch):
    """`hub_server` serving the Llama checkpoint as hub_server.LLAMA_REPO, with huggingface_hub pointed at it
    and every cache (HF_HOME, the hub cache, explorer's stubs and ranges) under `tmp_path`."""
    from huggingface_hub import constants

    from explorer import hub_fetch
    from tests.support.hub_server import LLAMA_REPO

    hub_server.add_repo(LLAMA_REPO, llama_checkpoint)
    hub_server.requests.clear()
    hub_server.faults.clear()
    hub_server.authorizations.clear()
    endpoint = hub_server.endpoint
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    from huggingface_hub import file_download

    if hasattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE"):  # huggingface_hub 0.x binds it by name
        monkeypatch.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE", constants.HUGGINGFACE_CO_URL_TEMPLATE)
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("EXPLORER_HUB_CACHE", raising=False)
    monkeypatch.setattr(hub_fetch, "_TOKENS", {})
    monkeypatch.setattr(hub_fetch, "RETRY", hub_fetch.RetryPolicy(attempts=3, first_wait_s=0.01, max_wait_s=0.05))
    return hub_server
