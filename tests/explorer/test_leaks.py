"""Resources: building and materializing many models holds memory flat and leaves nothing behind.

test_memory.py pins the basic graph release; here the same is checked over a loop of 100 models that
exercise every path keeping state (value reads, ties, views, rng="fast" worker threads, partial
materialization, failed constructions), by weak references, RSS, open file descriptors and threads.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import weakref
from typing import Callable

import psutil
import pytest
import torch
from torch import nn

from explorer import deferred_init, materialize_module
from explorer.record.fake import handle_of

MODELS = 100
WARMUP = 10
MIB = 1 << 20


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim: hands freed heap pages back, so RSS shows live memory, not fragmentation."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()
# One model holds ~2 MiB of tensors (200 MiB if each were kept). Trimmed, 100 models measure under
# 1 MiB of growth here; untrimmed, heap fragmentation alone swings RSS by tens of MiB.
RSS_GROWTH_LIMIT = (8 if _TRIM is not None else 96) * MIB


class Small(nn.Module):
    """~2 MiB of parameters, built the ways that make the engine keep state."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1024, 256)
        self.head = nn.Linear(256, 1024, bias=False)
        self.head.weight = self.embed.weight  # tie
        self.norm = nn.LayerNorm(256)
        self.register_buffer("positions", torch.arange(256.0).expand(4, -1))  # a view
        self.block = nn.Linear(256, 256)
        self.scale = float(self.block.weight.abs().max().item())  # a value read mid-construction


def _graph_of(module: nn.Module) -> weakref.ref:
    return weakref.ref(handle_of(module.embed.weight).graph)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _collect() -> None:
    """Full collections until nothing more is freed: tensors with a `__dict__` caught in reference
    cycles (fakes and their graph) can take a second pass."""
    for _ in range(5):
        if gc.collect() == 0:
            return


def _rss() -> int:
    _collect()
    if _TRIM is not None:
        _TRIM(0)
    return psutil.Process().memory_info().rss


def _build_and_materialize(i: int, graphs: list[weakref.ref], tensors: list[weakref.ref]) -> None:
    torch.manual_seed(i)
    module = deferred_init(Small)
    graphs.append(_graph_of(module))
    if i % 3 == 0:
        materialize_module(module.block)  # partial: the rest is dropped still deferred
    else:
        materialize_module(module, rng="fast" if i % 3 == 1 else "eager")  # "fast" runs fill threads
        tensors.append(weakref.ref(module.embed.weight))


def _failed_construction(graphs: list[weakref.ref]) -> None:
    def broken() -> nn.Module:
        Small()
        raise ValueError("config")

    with pytest.raises(ValueError) as error:
        deferred_init(broken)
    graphs.append(weakref.ref(error.value.deferred_graph))


def test_building_and_materializing_100_models_holds_memory_flat_and_leaks_nothing():
    graphs: list[weakref.ref] = []
    tensors: list[weakref.ref] = []
    for i in range(WARMUP):
        _build_and_materialize(i, graphs, tensors)
    _failed_construction(graphs)
    rss_before, fds_before, threads_before = _rss(), _open_fds(), threading.active_count()

    for i in range(WARMUP, WARMUP + MODELS):
        _build_and_materialize(i, graphs, tensors)
        if i % 10 == 0:
            _failed_construction(graphs)
    rss_after = _rss()

    assert [ref for ref in graphs if ref() is not None] == []
    assert [ref for ref in tensors if ref() is not None] == []
    assert rss_after - rss_before < RSS_GROWTH_LIMIT, f"RSS grew {(rss_after - rss_before) / MIB:.1f} MiB"
    assert _open_fds() == fds_before
    assert threading.active_count() == threads_before


def test_fully_materialized_module_keeps_its_graph_only_while_it_lives():
    torch.manual_seed(0)
    module = deferred_init(Small)
    graph = _graph_of(module)
    materialize_module(module.block)
    materialize_module(module, rng="fast")
    _collect()
    assert graph() is not None  # the recipe release_module replays from (replay/deferred_forms.py)
    assert module.head.weight is module.embed.weight  # the module itself is intact
    del module
    _collect()
    assert graph() is None
