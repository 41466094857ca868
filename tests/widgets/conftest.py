"""Shared fixtures for the widget tests: a small model with ties, views and buffers, and a stand-in
for `explorer.op_graph` / `explorer.render.node_kind` that records the calls the Graph tab makes and
draws nodes named as the real renderer names them (cluster_module:<path>, tensor:<name>, op:<g>:<i>),
so the tab's wiring is tested apart from graphviz layout."""

from __future__ import annotations

import types
from collections.abc import Iterator

import pytest
import torch
from playwright.sync_api import Page
from torch import nn

import explorer
import widgets
from explorer.render.diagram import Diagram, DiagramCluster, DiagramNode
from explorer.render.styles import FAKE, RANDOM
from tests.support.lab import CHROMIUM, CHROMIUM_ARGS, jupyter_server, run_all_cells, write_notebook


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        self.norm = nn.LayerNorm(4)


class Net(nn.Module):
    """embed (10×4) tied to head; two blocks; an int64 buffer and a buffer viewing part of it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("positions", torch.arange(4))
        self.register_buffer("window", self.positions[1:3])  # WINDOW LINE


@pytest.fixture
def net_pair() -> tuple[nn.Module, nn.Module]:
    """(eager Net, deferred Net) built from the same seed."""
    torch.manual_seed(0)
    eager = Net()
    torch.manual_seed(0)
    deferred = explorer.deferred_init(Net)
    return eager, deferred


@pytest.fixture
def ui() -> widgets.ExplorerWidget:
    torch.manual_seed(0)
    return widgets.explore(Net)


def node_kind(name: str) -> tuple[str, str]:
    """The contract's parser: "tensor:a.b" → ("tensor", "a.b"), "op:0:12" → ("op", "0:12")."""
    kind, _, key = name.partition(":")
    return kind, key


class GraphStandIn:
    """Records `op_layout` calls (what the Graph tab draws); lays out one cluster per focus module
    holding a tensor and an op, named as the contract names them."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.error: Exception | None = None

    def __call__(self, module: nn.Module, **kwargs: object) -> Diagram:
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        if kwargs.get("focus") is not None and kwargs.get("closure_of") is not None:
            raise ValueError("op_graph: give focus= or closure_of=, not both")  # as the contract's op_graph
        path = str(kwargs.get("focus") or "")
        cluster = DiagramCluster(path, path or "(root)", "", None)
        nodes = [
            DiagramNode("tensor:blocks.0.attn.weight", FAKE, "weight", cluster=path),
            DiagramNode("op:0:3", RANDOM, "uniform_", cluster=path),
        ]
        return Diagram("stand-in", nodes=nodes, clusters={path: cluster})


@pytest.fixture
def graph_stand_in(monkeypatch: pytest.MonkeyPatch) -> GraphStandIn:
    stand_in = GraphStandIn()
    monkeypatch.setattr(
        explorer, "render", types.SimpleNamespace(node_kind=node_kind, op_layout=stand_in), raising=False
    )
    return stand_in


# -- browser tests (pytest-playwright fixtures, pointed at Debian's Chromium) -------------------------
@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict) -> dict:
    """pytest-playwright's launch arguments, pointed at Debian's Chromium."""
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict) -> dict:
    """A window tall enough to show the whole widget (tree, graph, details, materialize bar) at once."""
    return {**browser_context_args, "viewport": {"width": 1400, "height": 1300}}


@pytest.fixture(scope="module")
def notebook_lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """JupyterLab serving one notebook, written from the test module's `NOTEBOOK_NAME` (file name)
    and `NOTEBOOK_CELLS` (code cells); yields (base URL, token). One server per test module."""
    root, home = tmp_path_factory.mktemp("lab-root"), tmp_path_factory.mktemp("lab-home")
    write_notebook(root / request.module.NOTEBOOK_NAME, request.module.NOTEBOOK_CELLS)
    with jupyter_server(root, home) as server:
        yield server


@pytest.fixture
def notebook_page(notebook_lab: tuple[str, str], page: Page, request: pytest.FixtureRequest) -> Page:
    """The test module's notebook opened fresh in JupyterLab (`?reset`: no saved layout), every cell
    run, and the left side panel closed to give the wide widget the room a person would."""
    base, token = notebook_lab
    page.goto(f"{base}/lab/tree/{request.module.NOTEBOOK_NAME}?reset&token={token}")
    run_all_cells(page)
    open_panel = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
    if open_panel.count():
        open_panel.click()
    return page


@pytest.fixture
def disk_ui(tmp_path) -> widgets.ExplorerWidget:
    """The explorer of a tiny sharded bfloat16 Llama loaded as float32 by from_pretrained under deferred
    init: every weight "disk", the rotary buffers "fake"."""
    import transformers

    from tests.support.checkpoints import saved_tiny_llama

    saved_tiny_llama(tmp_path)
    return widgets.ExplorerWidget(
        explorer.deferred_init(transformers.LlamaForCausalLM.from_pretrained, tmp_path, dtype=torch.float32)
    )


@pytest.fixture
def hub_ui(local_hub) -> widgets.ExplorerWidget:
    """The explorer of the local Hub's Llama (tests/conftest.py `local_hub`) opened by from_pretrained
    of its repo id: every weight "remote" until its bytes are fetched, the rotary buffers "fake"."""
    import transformers

    from tests.support.hub_server import LLAMA_REPO

    return widgets.explore(transformers.LlamaForCausalLM.from_pretrained, LLAMA_REPO)
